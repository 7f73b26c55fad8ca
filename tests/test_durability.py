"""The local stack's durability, on the real emulators (a stack of this module's own: these tests kill its emulators):
kill -9 of any one service, `xdiag up` restarting only what is down, `down`/`up` with nothing lost, and the sweeper
covering every state between an upload and its analysis (a notification pushed to a register that was down, a
Firestore that lost its last writes). Real profiles only (tests/profiles/h200).

Settings: quiet period 1 s (4 s while hosts are missing), the sweeper every 2 s, a stage deadline of 15 s: a session
with files and no analysis is announced again once its newest file is 19 s old.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from xdiag.cloud import localstack
from xdiag.cloud.localstack import LocalStack, latest_firestore_export
from xdiag.cloud.stack_config import DATA_DIR, FIRESTORE_EXPORTS, StackSettings

from tests.conftest import running_local_stack
from tests.test_local_stack import Cloud, _xdiag, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory):
    """The stack's folder; each test attaches the stack afresh (`xdiag up` restarts services from another process,
    so the process groups it started are in the state file, not in one object)."""
    settings = StackSettings(quiet_period_s=1.0, multi_host_quiet_period_s=4.0, stage_deadline_s=15.0, max_repairs=3,
                             sweep_interval_s=2.0, min_backoff_s=1.0, max_backoff_s=2.0)
    with running_local_stack(tmp_path_factory, settings) as stack:
        yield stack.state_dir


def _cloud(stack_dir: Path) -> Cloud:
    stack = LocalStack.attach(stack_dir)
    os.environ.update(stack.env)  # a `down`/`up` moves every port
    return Cloud(stack)


def _up(stack_dir: Path):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    return _xdiag("up", "--stack-dir", str(stack_dir), env=env)


def _everything(cloud: Cloud) -> tuple[dict, dict, dict]:
    """The bucket's objects (URI -> generation), the analyses (id -> status) and the reports' bytes."""
    objects = {info.uri: info.generation for info in cloud.blobs.list(cloud.config.profile_root + "/")}
    analyses = {key: doc["status"] for key, doc in cloud.state.list("analyses")}
    reports = {uri: cloud.blobs.get(uri) for uri in objects if uri.endswith("/xdiag/summary.html")}
    return objects, analyses, reports


def test_a_session_pushed_to_a_register_that_was_down_is_announced_by_the_sweeper(stack_dir, h200_profiles):
    """Failed before: the emulator pushed the notification to nobody and never again (ack deadline 600 s); no run,
    nothing in `xdiag status`, after 42 minutes."""
    cloud = _cloud(stack_dir)
    cloud.stack.kill("register")
    run = f"lost-push-{uuid.uuid4().hex[:6]}"
    try:
        cloud.upload(h200_profiles["host_sync"], run, "s1")
        time.sleep(3)  # the push finds nothing listening
    finally:
        up = _up(stack_dir)
    assert up.returncode == 0 and "restarted register" in up.stderr, up.stderr
    analysis = cloud.finished(run, "s1", timeout_s=120)
    assert analysis["status"] == "DONE" and analysis["diagnosis"]["findings"][0]["key"] == "python_loop_of_calls"


def test_the_stack_survives_kill_9_of_each_emulator_and_a_down_up_losing_nothing(stack_dir, h200_profiles):
    """Failed before: the bucket and Firestore lived in the emulators' memory; kill -9 of Firestore then `xdiag down;
    xdiag up` took the bucket from 8,689 objects to 0 and the analyses from 465 to 0."""
    cloud = _cloud(stack_dir)
    run = f"durable-{uuid.uuid4().hex[:6]}"
    cloud.upload(h200_profiles["healthy"], run, "before")
    first = cloud.finished(run, "before")
    assert first["status"] == "DONE"
    exports = stack_dir / DATA_DIR / FIRESTORE_EXPORTS
    done_at = time.time()
    wait_until(lambda: (m := latest_firestore_export(exports)) and m.stat().st_mtime > done_at + 0.5, 30,
               "the timer's export of Firestore", cloud)
    # an analysis finished after the last export: kill -9 of Firestore loses its documents, the sweeper redoes it
    cloud.upload(h200_profiles["small_steps"], run, "after-export")
    second = cloud.finished(run, "after-export")
    before = _everything(cloud)
    for service in ("firestore", "storage", "pubsub"):
        LocalStack.attach(stack_dir).kill(service)  # SIGKILL, the whole process group
        if service == "firestore":
            status = _xdiag("status", "--stack-dir", str(stack_dir))
            assert status.returncode == 1 and "Firestore" in status.stderr and "not answering" in status.stderr, (
                status.stdout + status.stderr)
        up = _up(stack_dir)
        assert up.returncode == 0 and f"restarted {service}" in up.stderr, up.stderr
        cloud = _cloud(stack_dir)
        if service == "firestore":  # the second analysis came after the export: announced again, the same one
            assert cloud.state.get("analyses", first["analysis_id"])["status"] == "DONE"
            again = cloud.finished(run, "after-export", timeout_s=120)
            assert again["analysis_id"] == second["analysis_id"] and again["status"] == "DONE"
        objects, analyses, reports = _everything(cloud)
        assert set(before[0]) <= set(objects), service  # no object lost (an analysis redone rewrites its outputs)
        assert all(objects[uri] == g for uri, g in before[0].items() if uri.endswith(".xplane.pb")), service
        assert all(analyses.get(key) == status for key, status in before[1].items()), service
        assert all(reports.get(uri) is not None for uri in before[2]), service
        fresh = f"after-{service}"
        cloud.upload(h200_profiles["healthy"], run, fresh)  # the chain works again: notifications, stages, Firestore
        assert cloud.finished(run, fresh, timeout_s=120)["status"] == "DONE"
    before = _everything(cloud)
    assert not _xdiag("down", "--stack-dir", str(stack_dir)).returncode
    up = _up(stack_dir)
    assert up.returncode == 0, up.stderr
    cloud = _cloud(stack_dir)
    after = _everything(cloud)
    assert after[0] == before[0] and after[1] == before[1] and after[2] == before[2]
    assert cloud.blobs.get(first["report_uri"]) == before[2][first["report_uri"]]


def test_an_object_name_that_climbs_out_of_the_bucket_writes_nothing_outside_its_folder(stack_dir):
    """Failed before: fake-gcs-server's filesystem backend stored `a/../../../../../../victim-escape.txt` outside its
    folder (here: beside the stack's own folder)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    cloud = _cloud(stack_dir)
    storage = Path(stack_dir) / DATA_DIR / "storage"
    outside = Path(stack_dir).parent
    victim = f"victim-escape-{uuid.uuid4().hex[:6]}.txt"
    # <storage>/<bucket>/a/ and then up to the folder the stack's folder is in
    climbs = "../" * (2 + len(storage.relative_to(outside).parts))
    name = urllib.parse.quote(f"a/{climbs}{victim}", safe="")
    request = urllib.request.Request(
        f"{cloud.stack.env['STORAGE_EMULATOR_HOST']}/upload/storage/v1/b/{cloud.stack.settings.bucket}/o"
        f"?uploadType=media&name={name}", data=b"written by whoever can reach the bucket", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert not (outside / victim).exists(), "the object was written outside the emulator's folder"
    assert status >= 400
    assert not list(Path(stack_dir).rglob(victim))  # nor anywhere in the stack's own folder


def _export_files(data_dir: Path) -> dict[Path, tuple[int, int]]:
    """Every document file of every Firestore export under the data dir (finished or being written): mtime, size."""
    found = {}
    for path in (p for top in data_dir.glob("firestore*") for p in top.rglob("output-*")):
        with contextlib.suppress(FileNotFoundError):  # an older export being removed
            found[path] = (path.stat().st_mtime_ns, path.stat().st_size)
    return found


def _second_of(export_path: Path) -> str:
    """The second the emulator named an export by (`firestore_export_<epoch s>`: two exports of one second share it)."""
    return next(part for part in reversed(export_path.parts) if part.startswith("firestore_export_")).split(".")[0]


def test_an_export_cut_short_in_the_second_of_the_last_complete_one_is_not_what_up_imports(stack_dir):
    """Failed before: the Firestore emulator names an export by the second, and every export went to one folder: the
    timer's export, begun in the second of the one `xdiag down` had just made and cut short by the emulator's stop,
    rewrote that export's documents file, so the folder held the complete export's metadata beside a part of the
    documents, and `xdiag up` imported 1 analysis of 6 (56 of 3,000 documents here). The race is forced: the second
    export is cut (SIGKILL) while it writes, and only when the emulator gave it the second of the first."""
    cloud = _cloud(stack_dir)
    ballast = f"ballast-{uuid.uuid4().hex[:6]}"  # enough that writing an export takes a while (16 MB)
    assert all(cloud.state.create_many(ballast, [(f"{i:05d}", {"pad": "x" * 8000}) for i in range(2000)]))
    analyses = {key: doc["status"] for key, doc in cloud.state.list("analyses")}
    stack = LocalStack.attach(stack_dir)
    stack.kill("timer")  # its own exports would come between these two
    data_dir = stack_dir / DATA_DIR
    for _attempt in range(5):
        while time.time() % 1 > 0.1:  # both exports in one second, where the first is quick enough
            time.sleep(0.005)
        complete = stack.export_firestore()  # `xdiag down`'s
        assert complete is not None
        before = _export_files(data_dir)
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(stack.export_firestore)  # the timer's, at the bad moment
            while not (writing := [p for p, seen in _export_files(data_dir).items() if before.get(p) != seen]):
                assert not second.done() or second.result() is None, "the second export was not seen writing"
                time.sleep(0.001)
            if _second_of(writing[0]) == _second_of(complete):
                stack.kill("firestore")  # the stop's signal, while the second export writes
                assert second.result() is None, "the second export finished before the stop"
                break
    else:
        pytest.fail("the emulator never named two exports by one second in 5 attempts")
    up = _up(stack_dir)
    assert up.returncode == 0 and "restarted firestore, timer" in up.stderr, up.stderr
    cloud = _cloud(stack_dir)
    assert len(cloud.state.list(ballast)) == 2000
    assert {key: doc["status"] for key, doc in cloud.state.list("analyses")} == analyses


def test_a_stop_whose_firestore_export_fails_says_so_and_the_next_start_has_the_last_export(stack_dir, monkeypatch):
    """Failed before: `xdiag down` stopped a Firestore emulator that did not answer its export and said nothing; what
    was written since the timer's last export was gone at the next `xdiag up`. (This test stops the module's stack.)"""
    cloud = _cloud(stack_dir)
    marker = f"marker-{uuid.uuid4().hex[:6]}"
    cloud.state.set(marker, "exported", {"at": time.time()})
    stack = LocalStack.attach(stack_dir)
    assert stack.export_firestore() is not None
    cloud.state.set(marker, "not-exported", {"at": time.time()})
    monkeypatch.setattr(localstack, "FIRESTORE_EXPORT_TIMEOUT_S", 2.0, raising=False)
    stack.freeze("firestore")  # a hung emulator: it takes the export's connection and never answers
    left = stack.stop()
    assert len(left) == 1 and "Firestore's documents were not exported" in left[0], left
    assert "the next start has those of" in left[0], left
    up = _up(stack_dir)
    assert up.returncode == 0, up.stderr
    assert [key for key, _ in _cloud(stack_dir).state.list(marker)] == ["exported"]
