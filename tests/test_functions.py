"""The Cloud Functions' entry points, fast: functions-framework's own app and test client, CloudEvents built with
`cloudevents`, every form an event arrives in, and the stages wired to the embedded adapters (no emulator)."""

from __future__ import annotations

import base64
import errno
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from functions_framework import create_app
from xdiag.analysis import op_table as op_table_module
from xdiag.cloud.embedded import build_embedded
from xdiag.cloud.memory import LocalBlobStore
from xdiag.cloud.runtime import REASON_ATTRIBUTE, Runtime, use_runtime
from xdiag.model import CaptureReady, ToolRun
from xdiag.pipeline.deps import SessionLoader
from xdiag.pipeline.topics import ANALYSES, DEAD_LETTERS, letter_key, sessions_collection, tools_collection
from xdiag.tools import BROAD_TOOLS

FUNCTIONS = Path(__file__).resolve().parents[1] / "functions"
PROJECT = "p"
BUCKET = "profiles"


class Wired:
    """The functions of this process wired to in-process adapters; dead letters kept in a list."""

    def __init__(self, tmp_path: Path) -> None:
        self.deps, self.bus = build_embedded()
        self.deps.blobs = LocalBlobStore(buckets=tmp_path / "buckets")
        self.deps.sessions = SessionLoader(self.deps.blobs)
        self.deps.profile_root, self.deps.quiet_period_s = f"gs://{BUCKET}", 0.2
        self.letters: list[tuple[str, bytes, dict[str, str]]] = []
        use_runtime(Runtime(self.deps, lambda topic, data, attributes: self.letters.append((topic, data, attributes))))

    def client(self, name: str):
        return create_app(target=name, source=str(FUNCTIONS / f"{name}.py"), signature_type="cloudevent").test_client()

    def queued(self, topic: str) -> list:
        return [m for t, m in self.bus._queue if t == topic]

    def upload(self, source: Path, name: str) -> str:
        uri = f"gs://{BUCKET}/{name}"
        self.deps.blobs.put_file(source, uri)
        return uri


@pytest.fixture
def wired(tmp_path):
    yield Wired(tmp_path)
    use_runtime(None)


def _pubsub_event(topic: str, data: bytes, attributes: dict[str, str] | None = None) -> CloudEvent:
    """The Eventarc form of a Pub/Sub message."""
    return CloudEvent(
        {
            "type": "google.cloud.pubsub.topic.v1.messagePublished",
            "source": f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{topic}",
        },
        {
            "message": {"data": base64.b64encode(data).decode(), "attributes": attributes or {}, "messageId": "42"},
            "subscription": f"projects/{PROJECT}/subscriptions/{topic}-eventarc",
        },
    )


def _push_body(data: bytes, attributes: dict[str, str] | None = None) -> dict:
    """The Pub/Sub push form, as the emulator (and Pub/Sub) POSTs it."""
    return {
        "message": {
            "data": base64.b64encode(data).decode(),
            "attributes": attributes or {},
            "messageId": "7",
            "publishTime": "2026-11-30T00:00:00Z",
        },
        "subscription": f"projects/{PROJECT}/subscriptions/s",
    }


def _post_event(client, event: CloudEvent, structured: bool = False):
    headers, body = (to_structured if structured else to_binary)(event)
    return client.post("/", headers=headers, data=body)


def _capture(wired: Wired, profile: Path, run: str = "r", session: str = "s1") -> CaptureReady:
    uri = wired.upload(profile, f"{run}/plugins/profile/{session}/host0.xplane.pb")
    return CaptureReady(
        analysis_id="a1",
        run_id=run,
        session_id=session,
        profile_uris=[uri],
        output_uri=f"gs://{BUCKET}/{run}/plugins/profile/{session}/xdiag",
    )


@pytest.mark.parametrize("form", ["eventarc-binary", "eventarc-structured", "push"])
def test_collect_accepts_every_pubsub_form_and_fans_out_15_tool_runs(wired, h200_profiles, form):
    data = _capture(wired, h200_profiles["healthy"]).model_dump_json().encode()
    client = wired.client("collect")
    if form == "push":
        answer = client.post(f"/projects/{PROJECT}/topics/captures", json=_push_body(data))
    else:
        answer = _post_event(client, _pubsub_event("captures", data), structured=form == "eventarc-structured")
    assert answer.status_code == 200, answer.data
    assert wired.deps.state.get(ANALYSES, "a1")["status"] == "RUNNING_TOOLS"
    assert sorted(m.tool for m in wired.queued("tool-runs")) == sorted(BROAD_TOOLS)


def test_register_accepts_the_eventarc_storage_finalize_event(wired, h200_profiles):
    uri = wired.upload(h200_profiles["healthy"], "run-a/plugins/profile/s1/host0.xplane.pb")
    event = CloudEvent(
        {
            "type": "google.cloud.storage.object.v1.finalized",
            "source": f"//storage.googleapis.com/projects/_/buckets/{BUCKET}",
            "subject": "objects/run-a/plugins/profile/s1/host0.xplane.pb",
        },
        {"bucket": BUCKET, "name": "run-a/plugins/profile/s1/host0.xplane.pb", "generation": "1", "size": "348257"},
    )
    assert _post_event(wired.client("register"), event).status_code == 200
    [capture] = wired.queued("captures")
    assert capture.profile_uris == [uri] and capture.run_id == "run-a" and capture.session_id == "s1"
    assert capture.output_uri == f"gs://{BUCKET}/run-a/plugins/profile/s1/xdiag"


def test_register_accepts_gcs_notification_attributes_and_groups_two_hosts(wired, h200_profiles):
    uris = [
        wired.upload(h200_profiles[w], f"run-b/plugins/profile/s2/host{i}.xplane.pb")
        for i, w in enumerate(["healthy", "host_sync"])
    ]

    def notify(uri: str) -> int:  # the two notifications arrive within the quiet period, as two deliveries at once
        name = uri.removeprefix(f"gs://{BUCKET}/")
        attributes = {
            "eventType": "OBJECT_FINALIZE",
            "bucketId": BUCKET,
            "objectId": name,
            "payloadFormat": "JSON_API_V1",
        }
        body = _push_body(json.dumps({"name": name}).encode(), attributes)
        return wired.client("register").post(f"/projects/{PROJECT}/topics/profile-uploads", json=body).status_code

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(notify, uris)) == [200, 200]
    [capture] = wired.queued("captures")  # one announcement, by the delivery of the newest file
    assert capture.profile_uris == uris
    session = wired.deps.state.get(sessions_collection("run-b"), "s2")
    assert session["status"] == "COMPLETE" and session["hosts"] == ["host0", "host1"]


def test_register_reads_the_session_during_the_quiet_period_and_collect_maps_it(wired, h200_profiles, tmp_path,
                                                                               monkeypatch):
    """With preparing on (the cloud), the newest file's delivery stores the decoded session while it waits out the
    quiet period; collect then loads that file, not the profile. A profile that cannot be read is still announced:
    collect reads it and records why."""
    events: list[tuple[str, dict]] = []
    wired.deps.on_event = lambda stage, info: events.append((stage, info))
    wired.deps.sessions = SessionLoader(wired.deps.blobs, prepare=True)
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(h200_profiles["healthy"].read_bytes()[:50_000])  # a real profile cut short
    for run, source in (("run-p", h200_profiles["healthy"]), ("run-q", cut)):
        uri = wired.upload(source, f"{run}/plugins/profile/s1/host0.xplane.pb")
        attributes = {"eventType": "OBJECT_FINALIZE", "bucketId": BUCKET,
                      "objectId": uri.removeprefix(f"gs://{BUCKET}/"), "payloadFormat": "JSON_API_V1"}
        body = _push_body(json.dumps({"name": attributes["objectId"]}).encode(), attributes)
        assert wired.client("register").post(f"/projects/{PROJECT}/topics/profile-uploads", json=body).status_code == 200
    healthy, cut_short = wired.queued("captures")
    prepared = sorted(p.relative_to(tmp_path / "buckets" / BUCKET).as_posix()
                      for p in (tmp_path / "buckets" / BUCKET).rglob("prepared/*.xdiag"))
    assert [p.split("/")[0] for p in prepared] == ["run-p"]
    assert ("register", {"prepared": "s1", "files": 1}) in events and ("register", {"not prepared": "s1"}) in events
    # XProf's views of the device session, recorded once beside it for every tool instance (xdiag.analysis.xprof.stored)
    [recorded] = (tmp_path / "buckets" / BUCKET).rglob("prepared/*.xprof-views.json")
    views = json.loads(recorded.read_text())["views"]
    assert {"overview", "step_trace", "memory_profile", "hlo_op_profile(top_n=20)"} <= set(views)
    assert any(key.startswith("peak_allocations(module=") for key in views)

    import xdiag.pipeline.deps as deps_module

    reads, read_session = [], deps_module.read_session
    monkeypatch.setattr(deps_module, "read_session", lambda paths, **kw: reads.append(paths) or read_session(paths, **kw))
    # The op table is built from lines only where no stored one is adopted.
    built, line_ops = [], op_table_module._line_ops
    monkeypatch.setattr(op_table_module, "_line_ops", lambda *args: built.append(args) or line_ops(*args))
    wired.deps.sessions = SessionLoader(wired.deps.blobs, prepare=True)  # a fresh collect instance: nothing in memory
    wired.bus._queue.clear()
    for capture in (healthy, cut_short):
        body = _push_body(capture.model_dump_json().encode())
        assert wired.client("collect").post(f"/projects/{PROJECT}/topics/captures", json=body).status_code == 200
    loaded = wired.deps.state.get(ANALYSES, healthy.analysis_id)
    assert loaded["status"] == "RUNNING_TOOLS" and len(wired.queued("tool-runs")) == len(BROAD_TOOLS)
    assert [[Path(p).parts[-5] for p in paths] for paths in reads] == [["run-q"]]  # only the unreadable one was read
    failed = wired.deps.state.get(ANALYSES, cut_short.analysis_id)
    assert failed["status"] == "FAILED" and "truncated" in failed["failure_reason"]
    # A tool run maps the tables register built with the session (xdiag.analysis.prepared), and builds none; its
    # XProf views come from register's record: no private copy, no conversion.
    from xdiag.analysis.xprof.views import XprofViews

    made, init = [], XprofViews.__init__
    monkeypatch.setattr(XprofViews, "__init__", lambda self, *a, **k: made.append(a) or init(self, *a, **k))
    for tool in ("get_step_trace", "get_xprof_overview", "get_memory_profile", "get_peak_allocations"):
        run = next(r for r in wired.queued("tool-runs") if r.tool == tool)
        body = _push_body(run.model_dump_json().encode())
        assert wired.client("run_tool").post(f"/projects/{PROJECT}/topics/tool-runs", json=body).status_code == 200
        assert wired.deps.state.get(tools_collection(healthy.analysis_id), tool)["status"] == "ok"
    assert not built and not made


def test_collect_records_xprofs_views_with_the_session_it_prepares_where_register_did_not(wired, h200_profiles, tmp_path,
                                                                                          monkeypatch):
    """Register's quiet period can run out before it prepares (a short period, a slow store): collect then reads the
    device session and stores it prepared, and records XProf's views beside it too, before the tool runs go out: the
    tool instances answer them from the record, whichever stage prepared."""
    wired.deps.sessions = SessionLoader(wired.deps.blobs, prepare=False)  # register: no preparation
    uri = wired.upload(h200_profiles["healthy"], "run-c/plugins/profile/s1/host0.xplane.pb")
    attributes = {"eventType": "OBJECT_FINALIZE", "bucketId": BUCKET,
                  "objectId": uri.removeprefix(f"gs://{BUCKET}/"), "payloadFormat": "JSON_API_V1"}
    body = _push_body(json.dumps({"name": attributes["objectId"]}).encode(), attributes)
    assert wired.client("register").post(f"/projects/{PROJECT}/topics/profile-uploads", json=body).status_code == 200
    [capture] = wired.queued("captures")
    assert not list((tmp_path / "buckets" / BUCKET).rglob("prepared/*"))

    wired.deps.sessions = SessionLoader(wired.deps.blobs, prepare=True)  # collect, as in the cloud
    wired.bus._queue.clear()
    body = _push_body(capture.model_dump_json().encode())
    assert wired.client("collect").post(f"/projects/{PROJECT}/topics/captures", json=body).status_code == 200
    [recorded] = (tmp_path / "buckets" / BUCKET).rglob("prepared/*.xprof-views.json")
    assert {"overview", "memory_profile", "hlo_op_profile(top_n=20)"} <= set(json.loads(recorded.read_text())["views"])

    from xdiag.analysis.xprof.views import XprofViews

    made, init = [], XprofViews.__init__
    monkeypatch.setattr(XprofViews, "__init__", lambda self, *a, **k: made.append(a) or init(self, *a, **k))
    wired.deps.sessions = SessionLoader(wired.deps.blobs, prepare=True)  # a fresh tool instance
    for tool in ("get_xprof_overview", "get_memory_profile"):
        run = next(r for r in wired.queued("tool-runs") if r.tool == tool)
        body = _push_body(run.model_dump_json().encode())
        assert wired.client("run_tool").post(f"/projects/{PROJECT}/topics/tool-runs", json=body).status_code == 200
        assert wired.deps.state.get(tools_collection(capture.analysis_id), tool)["status"] == "ok"
    assert not made


def test_register_ignores_other_objects_and_other_storage_events(wired):
    client = wired.client("register")
    wired.deps.blobs.put(f"gs://{BUCKET}/run/plugins/profile/s/xdiag/summary.html", b"<html>")
    for attributes in (
        {"eventType": "OBJECT_FINALIZE", "bucketId": BUCKET, "objectId": "run/plugins/profile/s/xdiag/summary.html"},
        {"eventType": "OBJECT_DELETE", "bucketId": BUCKET, "objectId": "run/plugins/profile/s/host.xplane.pb"},
    ):
        assert client.post("/projects/p/topics/profile-uploads", json=_push_body(b"{}", attributes)).status_code == 200
    assert not wired.bus._queue and not wired.letters


def test_a_finalize_for_a_missing_object_is_dead_lettered(wired):
    attributes = {
        "eventType": "OBJECT_FINALIZE",
        "bucketId": BUCKET,
        "objectId": "run/plugins/profile/s/gone.xplane.pb",
    }
    answer = wired.client("register").post("/projects/p/topics/profile-uploads", json=_push_body(b"{}", attributes))
    assert answer.status_code == 200  # acknowledged: a retry cannot bring the object back
    [(topic, _, sent)] = wired.letters
    assert topic == "profile-uploads-dead-letter" and "missing object" in sent[REASON_ATTRIBUTE]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"{not json", "malformed CaptureReady"),
        (b'{"run_id": "r"}', "session_id"),
        (b'{"run_id": "nope", "session_id": "none"}', "unknown session"),
    ],
)
def test_poison_capture_messages_are_dead_lettered_with_the_reason(wired, data, reason):
    answer = _post_event(wired.client("collect"), _pubsub_event("captures", data, {"origin": "test"}))
    assert answer.status_code == 200
    [(topic, sent, attributes)] = wired.letters
    assert topic == "captures-dead-letter" and sent == data  # the poison message's own bytes
    assert reason in attributes[REASON_ATTRIBUTE] and attributes["origin"] == "test"


def test_a_handler_that_raises_answers_500_and_records_the_error_for_the_retry(wired):
    data = ToolRun(analysis_id="never-collected", tool="get_hosts").model_dump_json().encode()
    answer = _post_event(wired.client("run_tool"), _pubsub_event("tool-runs", data))
    assert answer.status_code == 500  # Pub/Sub redelivers with backoff
    [(_, failure)] = wired.deps.state.list("failures")
    assert failure["topic"] == "tool-runs" and "unknown analysis" in failure["last_error"] and failure["attempts"] == 1


def test_a_dead_lettered_tool_run_becomes_a_failed_tool_so_the_analysis_completes(wired, h200_profiles):
    from xdiag.pipeline.stages.collect import collect

    collect(_capture(wired, h200_profiles["healthy"]), wired.deps)
    wired.bus._queue.clear()
    data = ToolRun(analysis_id="a1", tool="get_hosts").model_dump_json().encode()
    wired.deps.state.set(
        "failures", letter_key("tool-runs", data), {"last_error": "MemoryError: out of memory", "attempts": 5}
    )
    event = _pubsub_event("tool-runs-dead-letter", data, {"CloudPubSubDeadLetterSourceDeliveryCount": "5"})
    assert _post_event(wired.client("dead_letter"), event).status_code == 200
    tool = wired.deps.state.get(tools_collection("a1"), "get_hosts")
    assert (
        tool["status"] == "failed"
        and "MemoryError: out of memory" in tool["reason"]
        and "5 delivery attempts" in tool["reason"]
    )
    assert [m.tool for m in wired.queued("tool-results")] == ["get_hosts"]
    [(_, letter)] = wired.deps.state.list(DEAD_LETTERS)
    assert letter["source_topic"] == "tool-runs"


def test_a_manual_capture_names_only_run_and_session(wired, h200_profiles):
    for i, workload in enumerate(["healthy", "input_bound"]):
        wired.upload(h200_profiles[workload], f"team/run-c/plugins/profile/s3/host{i}.xplane.pb")
    data = b'{"run_id": "team/run-c", "session_id": "s3"}'
    assert _post_event(wired.client("collect"), _pubsub_event("captures", data)).status_code == 200
    [(analysis_id, analysis)] = wired.deps.state.list(ANALYSES)
    assert (
        len(analysis["profile_uris"]) == 2
        and analysis["output_uri"] == f"gs://{BUCKET}/team/run-c/plugins/profile/s3/xdiag"
    )
    # the same request again names the same analysis (no second one)
    assert _post_event(wired.client("collect"), _pubsub_event("captures", data)).status_code == 200
    assert [k for k, _ in wired.deps.state.list(ANALYSES)] == [analysis_id]


def test_the_whole_chain_through_the_functions_ends_in_summary_html(wired, h200_profiles):
    """Every function in turn, fed what the previous one published, as Pub/Sub would."""
    clients = {
        topic: wired.client(name)
        for topic, name in [
            ("captures", "collect"),
            ("tool-runs", "run_tool"),
            ("tool-results", "aggregate"),
            ("investigations", "investigate"),
            ("reports", "render"),
        ]
    }
    wired.bus.publish("captures", _capture(wired, h200_profiles["recompilation"]))
    while wired.bus._queue:
        topic, message = wired.bus._queue.popleft()
        answer = clients[topic].post(
            f"/projects/{PROJECT}/topics/{topic}", json=_push_body(message.model_dump_json().encode())
        )
        assert answer.status_code == 200, (topic, answer.data)
    analysis = wired.deps.state.get(ANALYSES, "a1")
    assert analysis["status"] == "DONE" and analysis["diagnosis"]["findings"][0]["key"] == "recompile_per_shape"
    assert wired.deps.blobs.exists(analysis["report_uri"]) and set(analysis["timeline"]) == {
        "collect",
        "investigate",
        "render",
    }


# --- issue 39: sessions under load, a full disk, oversized bodies ---------------------------------------------


def _notify(wired: Wired, name: str) -> int:
    """The bucket's Pub/Sub notification of one object, pushed to register."""
    attributes = {"eventType": "OBJECT_FINALIZE", "bucketId": BUCKET, "objectId": name}
    body = _push_body(json.dumps({"name": name}).encode(), attributes)
    return wired.client("register").post(f"/projects/{PROJECT}/topics/profile-uploads", json=body).status_code


def test_notifications_handled_late_one_by_one_announce_the_session_once_with_every_host(wired, h200_profiles):
    """The quiet period counts from the files' upload times, and the session is what its folder holds. Failed before:
    four hosts uploaded within a moment, their notifications handled one by one after a backlog, announced the session
    four times (1, 2, 3 and 4 hosts), each analysis DONE and each writing summary.html."""
    names = [f"run-c/plugins/profile/s3/host{i}.xplane.pb" for i in range(4)]
    profiles = ["healthy", "host_sync", "small_steps", "input_bound"]
    uris = [wired.upload(h200_profiles[p], name) for p, name in zip(profiles, names, strict=True)]
    time.sleep(wired.deps.quiet_period_s * 2)  # the backlog: the quiet period is over before the first is handled
    for name in names:  # in upload order, each after the quiet period of the one before
        assert _notify(wired, name) == 200
        time.sleep(wired.deps.quiet_period_s * 1.5)
    [capture] = wired.queued("captures")
    assert capture.profile_uris == uris
    session = wired.deps.state.get(sessions_collection("run-c"), "s3")
    assert session["hosts"] == ["host0", "host1", "host2", "host3"] and session["status"] == "COMPLETE"


def test_a_report_is_not_the_sessions_while_its_folder_holds_files_the_analysis_did_not_cover(wired, h200_profiles):
    """Failed before: an analysis announced with one host wrote the session's summary.html although a second host's
    file was in the folder (its own announcement still to come), and `upload --wait` returned it."""
    from xdiag.cloud.operations import wait_for_analysis

    capture = _capture(wired, h200_profiles["healthy"])
    wired.upload(h200_profiles["host_sync"], "r/plugins/profile/s1/host1.xplane.pb")  # arrived after the announcement
    wired.bus.publish("captures", capture)
    wired.bus.drain()
    analysis = wired.deps.state.get(ANALYSES, "a1")
    assert analysis["status"] == "DONE" and analysis["report_uri"] == f"{analysis['work_uri']}/summary.html"
    assert wired.deps.blobs.exists(analysis["report_uri"])
    assert not wired.deps.blobs.exists(f"{capture.output_uri}/summary.html")
    wired.deps.state.set(sessions_collection("r"), "s1", {"analysis_id": "a1", "status": "COMPLETE"})
    with pytest.raises(TimeoutError):
        wait_for_analysis(wired.deps.state, "r", "s1", timeout_s=0.5)


class FullDisk(LocalBlobStore):
    """A named fake: the machine's disk is full, so every download into the local cache fails as it then does."""

    def local_path(self, uri: str, generation: str | None = None) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(uri))


def test_a_full_disk_is_the_reason_a_stuck_analysis_fails_with(wired, h200_profiles):
    """Failed before: the analysis FAILED with "collect never read the session"; the real cause was only in
    failures/."""
    capture = _capture(wired, h200_profiles["healthy"])
    wired.deps.blobs = FullDisk(buckets=wired.deps.blobs.buckets)
    wired.deps.sessions = SessionLoader(wired.deps.blobs)
    answer = wired.client("collect").post(f"/projects/{PROJECT}/topics/captures",
                                          json=_push_body(capture.model_dump_json().encode()))
    assert answer.status_code == 500  # retried: the disk may have room later
    wired.deps.stage_deadline_s, wired.deps.max_repairs = 0.0, 0  # the sweeper's deadline has passed
    assert wired.client("sweep").post(f"/projects/{PROJECT}/topics/sweeps", json=_push_body(b"{}")).status_code == 200
    analysis = wired.deps.state.get(ANALYSES, "a1")
    assert analysis["status"] == "FAILED" and "No space left on device" in analysis["failure_reason"]


@pytest.mark.parametrize("name", ["register", "collect", "dead_letter"])
def test_a_body_over_pubsubs_limit_is_refused_at_the_door(wired, name):
    """Failed before: a 30 MB POST was read whole and handled (held a server thread for its ack deadline)."""
    answer = wired.client(name).post(f"/projects/{PROJECT}/topics/t", data=b"x" * (30 * 2**20),
                                     headers={"Content-Type": "application/json"})
    assert answer.status_code == 413
    assert not wired.letters and not wired.bus._queue and not wired.deps.state.list("failures")


def test_an_announcement_collect_never_received_is_published_again_by_the_sweeper(wired, h200_profiles):
    """Failed before: with collect down while register announced, the session stayed COMPLETE with no analysis for
    good (the sweeper watched analyses only, and there was none)."""
    name = "run-d/plugins/profile/s4/host0.xplane.pb"
    wired.upload(h200_profiles["host_sync"], name)
    assert _notify(wired, name) == 200
    [lost] = wired.queued("captures")
    wired.bus._queue.clear()  # pushed to a collect that was down: never delivered again
    assert wired.deps.state.get(ANALYSES, lost.analysis_id) is None
    wired.deps.stage_deadline_s = wired.deps.multi_host_quiet_period_s = 0.0  # past the time register had
    assert wired.client("sweep").post(f"/projects/{PROJECT}/topics/sweeps", json=_push_body(b"{}")).status_code == 200
    [again] = wired.queued("captures")
    assert again.analysis_id == lost.analysis_id and again.profile_uris == lost.profile_uris and again.attempt == 1
    wired.bus.drain()
    analysis = wired.deps.state.get(ANALYSES, lost.analysis_id)
    assert analysis["status"] == "DONE" and analysis["diagnosis"]["findings"][0]["key"] == "python_loop_of_calls"
