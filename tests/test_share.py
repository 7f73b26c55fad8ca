"""Share links, run readers and monitored events through the `control_plane` function, fast: functions-framework's test
client over the embedded adapters (no emulator), the way test_control_plane.py runs, behind IAM as in the cloud: every
caller carries an ID token signed by a local stand-in for Google's keys (tests/fake_google_certs.py) and verified by
google-auth. The same on the emulators, with `xdiag share` and `xdiag events`, is in test_viewer_stack.py.

The link is a V4 signed URL (signed with a local service-account key, as on the local stack); the control plane's link
endpoint checks its signature and expiry as Cloud Storage would, since the Cloud Storage emulator checks neither.
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qsl, urlsplit

import pytest
from xdiag.control.plane import Access
from xdiag.sharing.links import LINKS, new_signing_key
from xdiag.sharing.routes import LINK_BASE_ENV, SHARE_KEY_ENV
from xdiag.cloud.runtime import use_runtime
from xdiag.model import Alert
from xdiag.pipeline.runs import ALERTS
from xdiag.pipeline.topics import ANALYSES, sessions_collection

from tests.fake_google_certs import FakeGoogleCerts, as_cloud_run_forwards, bearer
from tests.test_control_plane import BUCKET, RUN, SDK_BODY, SDK_MASK, Plane

REPORT = f"gs://{BUCKET}/runs/{RUN}/plugins/profile/s1/xdiag/summary.html"
AUDIENCE = "https://xdiag-control-plane-123456789.us-central1.run.app"
LINK_BASE = "http://control-plane.test:8080"  # where the link endpoint answers, by configuration
ADMIN = "admin@example.com"


@pytest.fixture(scope="module")
def google():
    certs = FakeGoogleCerts()
    yield certs
    certs.close()


def _as(google: FakeGoogleCerts, email: str) -> dict[str, str]:
    return bearer(google.token(email, AUDIENCE))


def _iam(google: FakeGoogleCerts, **env: str) -> Access:
    return Access.from_env({"XDIAG_CONTROL_PLANE_AUTH": "iam", "XDIAG_CONTROL_PLANE_AUDIENCE": AUDIENCE,
                            "XDIAG_ID_TOKEN_CERTS_URL": google.url, "XDIAG_CONTROL_PLANE_ADMINS": f"user:{ADMIN}", **env})


@pytest.fixture
def plane(tmp_path, monkeypatch, google):
    """The control plane as deployed: behind IAM, on Cloud Run (K_SERVICE set, as Cloud Run sets it)."""
    monkeypatch.setenv(SHARE_KEY_ENV, str(new_signing_key(tmp_path / "key.json", "xdiag-local")))
    monkeypatch.setenv(LINK_BASE_ENV, LINK_BASE)
    plane = Plane(tmp_path, _iam(google, K_SERVICE="xdiag-control-plane"))
    alice = _as(google, "alice@example.com")
    status, _ = plane.call("PATCH", f"/v1/machineLearningRuns?update_mask={SDK_MASK}&allow_missing=true", SDK_BODY,
                           headers=alice)
    assert status == 200
    plane.deps.state.set(sessions_collection(RUN), "s1", {"run_id": RUN, "session_id": "s1", "kind": "on_demand",
                                                          "status": "COMPLETE", "analysis_id": "a1"})
    plane.deps.state.set(ANALYSES, "a1", {"analysis_id": "a1", "status": "DONE", "report_uri": REPORT, "run_id": RUN})
    plane.deps.blobs.put(REPORT, b"<html>the report</html>", "text/html")
    plane.alice = alice
    yield plane
    use_runtime(None)


def _share(plane, expires_s=60, session="s1", headers=None):
    return plane.call("POST", f"/v1/runs/{RUN}/sessions/{session}:share", {"expires_s": expires_s},
                      headers=headers or plane.alice)


def _fetch(plane, url: str, **change):
    parts = urlsplit(url)
    query = {**dict(parse_qsl(parts.query)), **change}
    answer = plane.client.get(parts.path, query_string=query)  # no token: the signature is the credential
    return answer.status_code, answer.data


def test_a_share_link_fetches_the_report_until_it_expires_and_is_recorded_with_who_and_when(plane):
    status, link = _share(plane, expires_s=2)
    assert status == 201, link
    assert "X-Goog-Signature=" in link["url"] and "X-Goog-Expires=2" in link["url"]
    assert link["by"] == "user:alice@example.com" and link["object"] == REPORT
    assert link["viewer"]["trace viewer"].endswith(f"run=runs%2F{RUN}%2Fs1&tag=trace_viewer%40")
    record = plane.deps.state.get(LINKS, link["link_id"])
    assert record["by"] == "user:alice@example.com" and record["at"] and record["expires_at"] > record["at"]
    assert "url" not in record  # the URL is a credential: only its hash is kept
    assert _fetch(plane, link["url"]) == (200, b"<html>the report</html>")  # no token: the signature is the credential
    time.sleep(2.5)
    status, body = _fetch(plane, link["url"])
    assert status == 410 and b"expired" in body


def test_a_tampered_or_foreign_link_is_refused(plane):
    _, link = _share(plane, expires_s=600)
    assert _fetch(plane, link["url"], **{"X-Goog-Expires": "604800"})[0] == 403  # a longer life is not signed
    other = link["url"].replace("summary.html", "analysis.json")
    assert _fetch(plane, other)[0] == 403
    assert _fetch(plane, link["url"].split("?")[0])[0] == 403  # no signature at all
    forged = link["url"].replace(f"/{BUCKET}/", "/other-bucket/")
    assert _fetch(plane, forged)[0] == 403


def test_sharing_is_refused_for_a_run_the_caller_cannot_read_and_for_a_session_without_report(plane, google):
    bob = _as(google, "bob@example.com")
    before = plane.deps.state.list(LINKS)
    status, answer = _share(plane, headers=bob)
    assert status == 403 and "may not read run" in answer["error"]["message"]
    assert plane.deps.state.list(LINKS) == before  # nothing signed, nothing recorded
    status, answer = plane.call("PUT", f"/v1/runs/{RUN}/readers", {"readers": ["user:bob@example.com"]},
                                headers=plane.alice)
    assert status == 200 and answer["readers"] == ["user:bob@example.com"]
    assert _share(plane, headers=bob)[0] == 201
    assert _share(plane, session="nope")[0] == 404
    assert plane.call("POST", "/v1/runs/ghost/sessions/s1:share", {"expires_s": 60}, headers=plane.alice)[0] == 404
    assert _share(plane, expires_s=8 * 86400)[0] == 400  # past a V4 signed URL's 7 days
    assert plane.call("POST", f"/v1/runs/{RUN}/sessions/s1:share", {"expires_s": 60}, headers={})[0] == 401


def test_behind_iam_only_a_google_signed_id_token_for_this_service_names_the_caller(plane, google):
    """The caller was read from the token's payload unchecked: `alg: none` with any e-mail passed as that reader."""
    alice = "alice@example.com"
    refused = {
        "alg none": bearer(google.unsigned_token(alice, AUDIENCE)),
        "another key": bearer(google.foreign_token(alice, AUDIENCE)),
        "another audience": bearer(google.token(alice, "https://other-service.example")),
        "expired": bearer(google.token(alice, AUDIENCE, lifetime_s=-120, iat=int(time.time()) - 900)),
        "another issuer": bearer(google.token(alice, AUDIENCE, iss="https://evil.example")),
        "unverified e-mail": bearer(google.token(alice, AUDIENCE, email_verified=False)),
        "no token": {},
        "not a token": bearer("x.y.z"),
    }
    for why, headers in refused.items():
        status, answer = plane.call("GET", f"/v1/runs/{RUN}", headers=headers)
        assert status == 401, (why, answer)
    assert plane.call("GET", f"/v1/runs/{RUN}", headers=plane.alice)[0] == 200


def test_on_cloud_run_the_token_its_front_end_checked_names_the_caller_and_no_other_header_does(plane, google):
    """Failed before: Cloud Run passes a token on with its signature removed, so every call the deployed control plane
    received was refused (401) as "does not verify"; and with both headers sent, Cloud Run checks only
    X-Serverless-Authorization and passes Authorization on unchecked, which then named the caller."""
    alice, bob = "alice@example.com", "bob@example.com"
    forwarded = {"Authorization": f"Bearer {as_cloud_run_forwards(google.token(alice, AUDIENCE))}"}
    assert plane.call("GET", f"/v1/runs/{RUN}", headers=forwarded)[0] == 200
    both = {"X-Serverless-Authorization": f"Bearer {as_cloud_run_forwards(google.token(bob, AUDIENCE))}",
            **bearer(google.unsigned_token(alice, AUDIENCE))}  # alice's name in the header Cloud Run passed unchecked
    status, answer = plane.call("GET", f"/v1/runs/{RUN}", headers=both)
    assert status == 403, answer  # bob, who Cloud Run let in, is not a reader of alice's run
    for why, token in {"another audience": google.token(alice, "https://other-service.example"),
                       "expired": google.token(alice, AUDIENCE, lifetime_s=-120, iat=int(time.time()) - 900),
                       "another issuer": google.token(alice, AUDIENCE, iss="https://evil.example"),
                       "unverified e-mail": google.token(alice, AUDIENCE, email_verified=False)}.items():
        status, answer = plane.call("GET", f"/v1/runs/{RUN}", headers=bearer(as_cloud_run_forwards(token)))
        assert status == 401, (why, answer)


def test_off_cloud_run_a_token_stripped_of_its_signature_is_refused(tmp_path, google):
    """Failed before: a token whose signature was `SIGNATURE_REMOVED_BY_GOOGLE` was read on its claims wherever the
    control plane ran, so an administrator's e-mail got 200 from anyone who could reach it."""
    plane = Plane(tmp_path, _iam(google))  # no K_SERVICE: not behind Cloud Run's front end
    try:
        stripped = bearer(as_cloud_run_forwards(google.token(ADMIN, AUDIENCE)))
        status, answer = plane.call("GET", "/v1/runs", headers=stripped)
        assert status == 401 and "does not run behind it" in json.dumps(answer), answer
        assert plane.call("GET", "/v1/runs", headers=_as(google, ADMIN))[0] == 200  # a signed token still names them
    finally:
        use_runtime(None)


def test_a_run_is_read_by_its_owners_readers_and_administrators_only_and_only_owners_name_readers(plane, google):
    bob, carol, admin = (_as(google, f"{name}@example.com") for name in ("bob", "carol", "admin"))
    run_paths = [f"/v1/runs/{RUN}", f"/v1/runs/{RUN}/sessions", f"/v1/runs/{RUN}/sessions/s1",
                 f"/v1/runs/{RUN}/analyses", f"/v1/runs/{RUN}/targets", f"/v1/machineLearningRuns/{RUN}",
                 f"/v1/events?run={RUN}"]
    for path in run_paths:  # a non-reader got 200 and the report URIs
        status, answer = plane.call("GET", path, headers=bob)
        assert status == 403, (path, answer)
    assert [r["run_id"] for r in plane.call("GET", "/v1/runs", headers=bob)[1]["runs"]] == []
    # the first caller to name readers of a run took it over
    status, answer = plane.call("PUT", f"/v1/runs/{RUN}/readers", {"readers": ["user:bob@example.com"]}, headers=bob)
    assert status == 403 and not plane.deps.state.get("runs", RUN).get("readers")
    assert plane.call("PATCH", f"/v1/machineLearningRuns/{RUN}?update_mask=workload.state",
                      {"workload": {"state": "STATE_FAILED"}}, headers=bob)[0] == 403
    # the owner names a reader: the reader reads, and still may not name readers; others still may not read
    assert plane.call("PUT", f"/v1/runs/{RUN}/readers", {"readers": ["user:bob@example.com"]},
                      headers=plane.alice)[0] == 200
    for path in run_paths:
        assert plane.call("GET", path, headers=bob)[0] == 200, path
        assert plane.call("GET", path, headers=carol)[0] == 403, path
    status, answer = plane.call("PUT", f"/v1/runs/{RUN}/readers", {"readers": ["user:carol@example.com"]}, headers=bob)
    assert status == 403 and "not an owner" in answer["error"]["message"]
    # a run nobody claimed (uploaded straight to the bucket: register records it without owners) is the admins'
    plane.deps.state.set("runs", "uploaded", {"run_id": "uploaded", "base_uri": f"gs://{BUCKET}/uploaded"})
    assert plane.call("GET", "/v1/runs/uploaded", headers=plane.alice)[0] == 403
    assert plane.call("PUT", "/v1/runs/uploaded/readers", {"readers": ["user:alice@example.com"]},
                      headers=plane.alice)[0] == 403
    assert plane.call("GET", "/v1/runs/uploaded", headers=admin)[0] == 200
    assert plane.call("PUT", "/v1/runs/uploaded/readers", {"readers": ["user:carol@example.com"]},
                      headers=admin)[0] == 200
    assert plane.call("GET", "/v1/runs/uploaded", headers=carol)[0] == 200


def test_a_share_link_s_host_is_the_configured_endpoint_whatever_host_the_request_names(plane):
    """The link's host came from the request's Host header: a link minted through any name pointed there."""
    status, link = plane.call("POST", f"/v1/runs/{RUN}/sessions/s1:share", {"expires_s": 60},
                              headers={**plane.alice, "Host": "evil.example"})
    assert status == 201 and urlsplit(link["url"]).netloc == urlsplit(LINK_BASE).netloc, link["url"]
    assert _fetch(plane, link["url"]) == (200, b"<html>the report</html>")


def test_monitored_events_list_the_capture_and_the_cool_downs_and_describe_the_analyser_s_numbers(plane):
    detail = {"metric": "step_time_ms", "baseline_ms": 10.0, "window_median_ms": 14.0, "window_ms": [14.0, 13.5]}
    plane.deps.state.set(ALERTS, "e1", {"source": "verdict", "run_id": RUN, "received_at": "2026-12-01T00:00:00+00:00",
                                        "outcome": "captured: session 's1' from 1 target(s), analysis a1",
                                        "session_id": "s1", "detail": detail, "summary": "step time degraded"})
    for n in range(2, 5):
        plane.deps.state.set(ALERTS, f"e{n}", {"source": "incident", "run_id": RUN,
                                               "received_at": f"2026-12-01T00:00:0{n}+00:00",
                                               "outcome": f"cool-down: run {RUN!r} was captured automatically {n} s ago"})
    status, answer = plane.call("GET", f"/v1/events?run={RUN}", headers=plane.alice)
    assert status == 200
    assert [(e["id"], e["outcome"]) for e in answer["events"]] == [
        ("e1", "captured"), ("e2", "cool-down"), ("e3", "cool-down"), ("e4", "cool-down")]
    status, event = plane.call("GET", "/v1/events/e1", headers=plane.alice)
    assert status == 200 and event["analyser"] == detail
    assert event["capture"]["kind"] == "on_demand" and event["capture"]["analysis"]["report_uri"] == REPORT
    status, event = plane.call("GET", "/v1/events/e3", headers=plane.alice)
    assert event["cooled_down_by"] == "e1"
    assert plane.call("GET", "/v1/events/nope", headers=plane.alice)[0] == 404


def test_the_capture_stage_keeps_the_alert_s_detail_for_describe(plane):
    from xdiag.capture.stage import capture

    # an unknown run: nothing is captured (no connection anywhere), and the record still keeps the detail
    capture(Alert(source="verdict", run_id="ghost", verdict="bad", summary="slow", detail={"baseline_ms": 3.0}),
            plane.deps)
    [record] = [doc for _, doc in plane.deps.state.list(ALERTS)]
    assert record["detail"] == {"baseline_ms": 3.0} and record["outcome"].startswith("ignored")


def test_a_link_needs_the_signing_key_here_and_is_not_served_without_one(plane, monkeypatch):
    _, link = _share(plane)
    monkeypatch.delenv(SHARE_KEY_ENV)  # as in the cloud, where Cloud Storage checks the links itself
    assert _fetch(plane, link["url"])[0] == 404
