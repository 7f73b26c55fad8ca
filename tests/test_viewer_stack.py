"""The viewer, share links, monitored events and before/after on the local stack (the real emulators, every function,
a real JAX workload attached through the ML Diagnostics SDK):

- `xdiag view` serves a session captured by `xdiag capture` and one uploaded by `xdiag upload` from the stack's
  bucket (mirrored read-only: XProf cannot read the emulator), checked against XProf's own endpoints, and skips
  objects whose names would leave its tree or cannot be file names;
- `xdiag share` gives a link that fetches the report and stops working after its expiry (checked by the control
  plane's link endpoint: fake-gcs-server serves V4 signed URLs whatever their expiry or signature);
- `xdiag events` lists an alert storm's one capture and its cool-downs, and describes them;
- `xdiag diff` on a bundled workload captured before and after its fix shows the fix's gain.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from xdiag.sharing.links import LINKS
from xdiag.examples.capture import capture_workload

from tests import test_capture
from tests.test_capture import _incident, _run_on, _xdiag
from tests.test_local_stack import wait_until
from tests.test_viewer import View, get

pytestmark = pytest.mark.slow
# test_capture's module fixtures, here too: the stack's clients, the control plane, a JAX workload the SDK registered
cloud, plane, sdk_url, workload = test_capture.cloud, test_capture.plane, test_capture.sdk_url, test_capture.workload


def _ok(answer) -> str:
    assert answer.returncode == 0, f"{answer.args}\n{answer.stdout}\n{answer.stderr}"
    return answer.stdout.strip()


@pytest.fixture(scope="module")
def uploaded(local_stack, h200_profiles, tmp_path_factory) -> tuple[str, str]:
    """A session uploaded with `xdiag upload --wait`: (run, session)."""
    session = tmp_path_factory.mktemp("upload") / "plugins" / "profile" / "uploaded_1"
    session.mkdir(parents=True)
    (session / "vm.xplane.pb").write_bytes(h200_profiles["healthy"].read_bytes())
    run = f"uploads-{uuid.uuid4().hex[:6]}"
    _ok(_xdiag("upload", str(session), "--run", run, "--wait"))
    return run, "uploaded_1"


@pytest.fixture(scope="module")
def captured(workload, plane) -> tuple[str, str, str]:
    """A session captured with `xdiag capture` from the SDK-registered run: (run id, its folder, session)."""
    report = _ok(_xdiag("capture", "--run", workload.run, "--duration", "1s"))
    session = report.split("/plugins/profile/")[1].split("/")[0]
    return workload.run, plane.run(workload.run)["path"], session


def test_xdiag_view_serves_a_captured_and_an_uploaded_session_from_the_stack_bucket(uploaded, captured, tmp_path):
    run, folder, session = captured
    view = View(tmp_path, "--store", str(tmp_path / "no-local-store"), "--view-dir", str(tmp_path / "v"))
    try:
        status, runs = get(view.url + "/data/plugin/profile/runs")
        listed = json.loads(runs)
        assert f"{uploaded[0]}/{uploaded[1]}" in listed and f"{folder}/{session}" in listed, listed
        for name in (f"{uploaded[0]}/{uploaded[1]}", f"{folder}/{session}"):
            status, tools = get(f"{view.url}/data/plugin/profile/run_tools?run={name}")
            assert "op_profile" in json.loads(tools)
            status, hosts = get(f"{view.url}/data/plugin/profile/hosts?run={name}&tag=op_profile")
            host = json.loads(hosts)[0]["hostname"]
            status, data = get(f"{view.url}/data/plugin/profile/data?run={name}&tag=op_profile&host={host}")
            assert status == 200 and json.loads(data)
        said = view.err.read_text()
        assert "mirrored read-only" in said and "XProf cannot read the Cloud Storage emulator" in said
        assert f"{folder}/{session}  on_demand" in said and f"{uploaded[0]}/{uploaded[1]}  programmatic" in said
    finally:
        assert view.stop() == 0, view.err.read_text()


def test_xdiag_view_skips_objects_whose_names_leave_its_tree_or_are_too_long_and_says_so(
        local_stack, h200_profiles, tmp_path):
    """Object names are anyone's who can write to the bucket: `..` segments once made `xdiag view` delete and relink
    folders outside its tree, and one run name longer than a file name crashed every view of the bucket."""
    from google.cloud import storage as gcs
    from xdiag.cloud.gcs import storage_client

    bucket = storage_client().create_bucket(f"view-names-{uuid.uuid4().hex[:8]}")
    profile = h200_profiles["healthy"].read_bytes()
    # the view's tree is tmp_path/v/tree, so "../../" from a run folder is tmp_path
    victims = {tmp_path / "victim" / "plugins" / "profile" / "keep" / "vm.xplane.pb": b"the user's profile",
               tmp_path / "victim2" / "plugins" / "profile" / "other" / "x.xplane.pb": b"another profile"}
    for path, data in victims.items():
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    names = ["good-run/plugins/profile/s1/vm.xplane.pb",
             "../../victim/plugins/profile/keep/vm.xplane.pb",  # would relink the user's file to these bytes
             "../../victim2/plugins/profile/../h.xplane.pb",  # would remove victim2/plugins
             f"{'r' * 300}/plugins/profile/s1/vm.xplane.pb"]  # a run folder name longer than a file name may be
    for name in names:
        gcs.Blob(name, bucket).upload_from_string(profile if name.startswith("good") else b"attacker's bytes")
    view = View(tmp_path, "--store", str(tmp_path / "no-local-store"), "--view-dir", str(tmp_path / "v"),
                env={"XDIAG_BUCKET": bucket.name})
    try:
        status, runs = get(view.url + "/data/plugin/profile/runs")
        assert json.loads(runs) == ["good-run/s1"]
        said = view.err.read_text()
        assert "skipped 3 object(s) whose names are not xdiag ids" in said, said
        assert "../../victim/plugins/profile/keep/vm.xplane.pb" in said and "is not valid" in said
    finally:
        assert view.stop() == 0, view.err.read_text()
    for path, data in victims.items():
        assert not path.is_symlink() and path.read_bytes() == data
    assert not list((tmp_path / "v" / "tree").glob("r*"))


def _fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_xdiag_report_fetches_and_share_gives_a_link_that_stops_after_its_expiry(cloud, uploaded, captured, tmp_path):
    run, session = uploaded
    saved = Path(_ok(_xdiag("report", f"{run}/{session}", "--out", str(tmp_path / "reports"))))
    assert saved.is_relative_to(tmp_path / "reports") and session in saved.read_text()
    answer = _xdiag("share", f"{run}/{session}", "--expires", "4s")
    link = _ok(answer)
    status, body = _fetch(link)
    assert status == 200 and b"<html" in body.lower() and session.encode() in body
    [record] = [doc for _, doc in cloud.state.list(LINKS) if doc["run_id"] == run]
    assert record["by"] and record["at"] and record["object"].endswith("/xdiag/summary.html")
    time.sleep(5)
    status, body = _fetch(link)
    assert status == 410 and b"expired" in body
    # the SDK gave the captured run a UUID; its display name finds it too
    display = next(r["display_name"] for r in json.loads(_ok(_xdiag("runs", "--json"))) if r["id"] == captured[0])
    assert display != captured[0]
    assert _fetch(_ok(_xdiag("share", f"{display}/{captured[2]}", "--expires", "1m")))[0] == 200


def test_xdiag_events_list_an_alert_storm_s_one_capture_and_its_cool_downs(cloud, plane, workload):
    run = _run_on(plane, workload, f"storm-{uuid.uuid4().hex[:6]}")
    for n in range(10):
        cloud.stack.pubsub.publish("alerts", _incident(run, n=n))
    events = wait_until(lambda: len(found := json.loads(_ok(_xdiag("events", "--run", run, "--json")))) == 10 and found,
                        90, "ten events", cloud)
    outcomes = [e["outcome"] for e in events]
    assert outcomes.count("captured") == 1 and outcomes.count("cool-down") == 9, outcomes
    [captured] = [e for e in events if e["outcome"] == "captured"]
    assert captured["source"] == "incident" and captured["session_id"]
    listing = _ok(_xdiag("events", "--run", run))
    assert listing.count("cool-down") == 9 and f"session {captured['session_id']}" in listing
    described = wait_until(lambda: (e := json.loads(_ok(_xdiag("events", "describe", captured["id"])))) and
                           (e["capture"]["analysis"] or {}).get("status") == "DONE" and e, 180, "the capture's report",
                           cloud)
    assert described["capture"]["kind"] == "auto" and described["capture"]["analysis"]["report_uri"]
    cooled = json.loads(_ok(_xdiag("events", "describe", next(e["id"] for e in events if e["outcome"] == "cool-down"))))
    assert cooled["cooled_down_by"] == captured["id"]


def test_xdiag_diff_of_a_workload_before_and_after_its_fix_shows_the_gain(cloud, tmp_path):
    run = f"layout-{uuid.uuid4().hex[:6]}"
    # Both captured before either is uploaded: the steps are timed on a CPU the pipeline's analysis is not busy on.
    profiles = [capture_workload("layout_transpose", tmp_path / "profiles", fixed=fixed) for fixed in (False, True)]
    sessions = []
    for profile in profiles:
        _ok(_xdiag("upload", str(profile.parent), "--run", run, "--wait"))
        sessions.append(profile.parent.name)
    out = tmp_path / "diff"
    html = Path(_ok(_xdiag("diff", f"{run}/{sessions[0]}", f"{run}/{sessions[1]}", "--out", str(out))))
    diff = json.loads((out / "diff.json").read_text())
    assert html == out / "diff.html" and html.exists()
    assert diff["verdict"] == "faster" and diff["step_time"]["delta"] < 0 and diff["step_time"]["significant"]
    assert "transposed_outputs" in [f["key"] for f in diff["findings"]["gone"]]
    gone = [op["name"] for op in diff["ops"]["gone"]]
    assert any("transpose" in name or "copy" in name for name in gone), gone
    # the pipeline compared the second session with the run's first itself: a report section and diff-previous.*
    output = f"{cloud.config.profile_root}/{run}/plugins/profile/{sessions[1]}/xdiag"
    previous = json.loads(cloud.blobs.get(f"{output}/diff-previous.json"))
    assert previous["baseline"]["session_id"] == sessions[0] and previous["verdict"] == "faster"
    summary = cloud.blobs.get(f"{output}/summary.html").decode()
    assert "Compared with the previous session" in summary and 'href="diff-previous.html"' in summary
    assert previous["headline"][0] in summary
    assert "Compared with the previous session" not in cloud.blobs.get(
        f"{cloud.config.profile_root}/{run}/plugins/profile/{sessions[0]}/xdiag/summary.html").decode()


def test_an_automatic_capture_s_report_opens_with_what_changed_since_the_run_s_last_healthy_session(
        cloud, plane, workload, tmp_path):
    """An on-demand capture of the attached JAX job (healthy), then a degradation alert's automatic capture of the
    same job: the automatic one is compared with the healthy one, and its report opens with what changed since,
    naming the baseline and the lines whose device time moved; the run's sessions list links it to its baseline."""
    from tests.test_capture import _done, _sessions

    run = _run_on(plane, workload, f"since-{uuid.uuid4().hex[:6]}")
    _ok(_xdiag("capture", "--run", run, "--duration", "1s"))
    [healthy] = _sessions(cloud, run)
    cloud.stack.pubsub.publish("alerts", _incident(run))
    [auto] = wait_until(lambda: [s for s in _sessions(cloud, run) if s.get("kind") == "auto" and s.get("analysis_id")],
                        90, "the automatic capture", cloud)
    analysis = _done(cloud, auto, 180)
    assert analysis["status"] == "DONE"
    baseline = analysis["baseline"]
    assert baseline["session_id"] == healthy["session_id"] and baseline["role"] == "last healthy session"
    output = analysis["report_uri"].rsplit("/", 1)[0]
    diff = json.loads(cloud.blobs.get(f"{output}/diff-previous.json"))
    assert diff["baseline"]["session_id"] == healthy["session_id"] and diff["baseline_role"] == "last healthy session"
    assert diff["verdict"] in ("faster", "slower", "no_change") and diff["step_test"]["baseline"]["steps_used"] >= 2
    moved = [m for m in diff["lines"]["moved"] if m["delta_ms_per_step"] is not None]
    assert diff["lines"]["available"] and moved, diff["lines"]
    summary = cloud.blobs.get(analysis["report_uri"]).decode()
    opening = summary[summary.index('id="since"'):summary.index('role="status"')]
    assert f"since the last healthy session {healthy['session_id']}" in opening
    assert f"step {diff['step_test']['change_percent']:+.1f}% since {healthy['session_id']}" in opening
    assert f"`{moved[0]['line']}`" in opening or f"`{moved[0]['line']}`".replace("`", "&#96;") in opening
    assert 'href="diff-previous.html"' in opening
    listing = _ok(_xdiag("sessions", "--run", run))
    assert f"baseline (last healthy session): {healthy['session_id']}" in listing and "diff-previous.html" in listing
    folder = plane.run(run)["path"]  # the viewer lists the run's sessions, each with its baseline's page beside it
    view = View(tmp_path, "--store", str(tmp_path / "no-local-store"), "--view-dir", str(tmp_path / "v"), "--run", folder)
    try:
        said = view.err.read_text()
        assert f"{folder}/{auto['session_id']}  auto" in said
        assert f"baseline (last healthy session): {folder}/{healthy['session_id']}" in said, said
        assert f"run={folder}/{healthy['session_id']}" in said.replace("%2F", "/")
    finally:
        assert view.stop() == 0, view.err.read_text()
