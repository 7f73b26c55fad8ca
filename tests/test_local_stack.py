"""The event-driven pipeline running for real: the Pub/Sub, Firestore and Cloud Storage emulators, every function
under functions-framework on its own port, push subscriptions with dead-letter topics (the `local_stack` fixture).

Real profiles only: the committed H200 captures, two of them as two hosts of one session."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.conftest import SHARED_PROFILES, missing_shared
from xdiag.cloud.localstack import LocalStack
from xdiag.cloud.stack_config import EMULATOR_JVM_OPTIONS, STATE_FILE
from xdiag.cloud.stack_processes import group_members, listening
from xdiag.cloud.operations import wait_for_analysis
from xdiag.cloud.runtime import CloudConfig, cloud_dependencies
from xdiag.model import CaptureReady, InvestigationReady, ReportReady, ToolDone, ToolRun
from xdiag.pipeline.layout import output_uri, session_prefix
from xdiag.profile.trace_json import KINETO
from xdiag.pipeline.topics import ANALYSES, CLAIMS, DEAD_LETTERS, letter_key, sessions_collection, tools_collection
from xdiag.tools import BROAD_TOOLS


class Cloud:
    """Clients of the stack: the same adapters the functions use."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.config = CloudConfig.from_env()
        self.deps, _ = cloud_dependencies(self.config)
        self.blobs, self.state = self.deps.blobs, self.deps.state

    def upload(self, source: Path | bytes, run: str, session: str, host: str = "host0") -> str:
        uri = session_prefix(self.config.profile_root, run, session) + f"{host}.xplane.pb"
        if isinstance(source, bytes):
            self.blobs.put(uri, source)
        else:
            self.blobs.put_file(source, uri)
        return uri

    def finished(self, run: str, session: str, timeout_s: float = 120.0) -> dict:
        try:
            return wait_for_analysis(self.state, run, session, timeout_s)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def publish(self, topic: str, message) -> str:
        data = message if isinstance(message, bytes) else message.model_dump_json().encode()
        return self.stack.pubsub.publish(topic, data)

    def log(self, name: str) -> str:
        return Path(self.stack.processes[name]["log"]).read_text(errors="replace")

    def handled(self, name: str, topic: str) -> int:
        return len(re.findall(rf"{re.escape(topic)}: message \S+ handled", self.log(name)))

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.stack.log_tail(name, 8)}" for name in self.stack.processes)

    def dead_letters(self, marker: str) -> list[dict]:
        return [doc for _, doc in self.state.list(DEAD_LETTERS) if marker in doc["data"]]


def wait_until(predicate, timeout_s: float, what: str, cloud: Cloud | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{cloud.logs()}" if cloud else ""))


@pytest.fixture(scope="module")
def cloud(local_stack) -> Cloud:
    return Cloud(local_stack)


@pytest.fixture(scope="module")
def healthy_done(cloud, h200_profiles) -> dict:
    """One finished analysis of a one-host session (the H200 `healthy` profile)."""
    cloud.upload(h200_profiles["healthy"], "dup-run", "s1")
    return cloud.finished("dup-run", "s1")


def test_a_two_host_session_uploaded_to_the_bucket_ends_in_summary_html_and_done(cloud, h200_profiles, local_stack):
    run, session = "e2e-run", "2026_11_30_12_00_00"
    sources = {"host0": h200_profiles["recompilation"], "host1": h200_profiles["dispatch_bound"]}
    uris = []
    for host, source in sources.items():  # the files of one session arrive one by one
        uris.append(cloud.upload(source, run, session, host))
        time.sleep(0.3)
    analysis = cloud.finished(run, session)
    assert analysis["status"] == "DONE" and analysis["result"] == "NEEDS_ATTENTION", analysis.get("failure_reason")
    assert analysis["profile_uris"] == uris and sorted(analysis["profile"]["files"]) == [
        "host0.xplane.pb",
        "host1.xplane.pb",
    ]
    tools = dict(cloud.state.list(tools_collection(analysis["analysis_id"])))
    assert sorted(tools) == sorted(BROAD_TOOLS) and all(
        doc["status"] in ("ok", "not_available") for doc in tools.values()
    )
    report = analysis["report_uri"]
    assert report == output_uri(cloud.config.profile_root, run, session) + "/summary.html"
    html = cloud.blobs.get(report).decode()
    assert "NEEDS_ATTENTION" in html and "host0.xplane.pb" in html and "host1.xplane.pb" in html
    assert "XProf&#39;s figures cover all 2 hosts of the session together" in html  # which hosts its views cover
    session_doc = cloud.state.get(sessions_collection(run), session)
    assert session_doc["status"] == "COMPLETE" and session_doc["hosts"] == ["host0", "host1"]
    assert session_doc["analysis_id"] == analysis["analysis_id"]
    for uri, source in zip(uris, sources.values(), strict=True):
        assert cloud.blobs.get(uri) == source.read_bytes(), "the uploaded profile is never modified"
    # XProf's views recorded beside the prepared session of exactly these two files (by register, or by collect where
    # register's quiet period ran out first; an analysis of the first file alone, superseded, may have its own);
    # the tool instances converted nothing
    output = output_uri(cloud.config.profile_root, run, session)
    recorded = cloud.blobs.get(f"{output}/prepared/{session_doc['inputs_key']}.xprof-views.json")
    assert "overview" in json.loads(recorded)["views"]
    assert tools["get_xprof_overview"]["status"] == "ok"
    assert not list((local_stack.state_dir / "tmp" / "run_tool").glob(f"xdiag-xprof-*/plugins/profile/{session}"))


def test_a_16_host_session_is_mapped_one_invocation_per_host_with_the_embedded_findings(cloud, lockstep, tmp_path):
    """Issue 37: each host file of a many-host session decoded by its own map_host delivery (two instances here),
    collect assembling what they stored, and the same findings as `xdiag analyze` of the same folder. Real hosts: the
    two-process straggler_compute job, its fast host copied to make 16."""
    from tests.test_hosts_map import _pod
    from xdiag.cloud.embedded import analyze_session
    from xdiag.profile.locate import locate_session

    run, session = f"pod16-{uuid.uuid4().hex[:6]}", "2026_12_04_15_00_00"
    pod = _pod(tmp_path / "pod", lockstep["straggler_compute"], 16)
    files = sorted(pod.glob("*.xplane.pb"))
    with ThreadPoolExecutor(8) as pool:  # inside the quiet period: one announcement of all 16
        list(pool.map(lambda path: cloud.upload(path, run, session, path.name.removesuffix(".xplane.pb")), files))
    analysis = cloud.finished(run, session, timeout_s=240)
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    assert len(analysis["profile"]["hosts"]) == 16

    shown = _xdiag("status", "--run", run)
    assert shown.returncode == 0, shown.stderr
    maps = re.findall(r"^\s+map (\S+): done [0-9.]+ s", shown.stdout, flags=re.M)
    assert sorted(maps) == [path.name for path in files], shown.stdout  # one map_host invocation per host file
    assert "host maps: 16 host file(s): 16 done" in shown.stdout
    assert cloud.handled("map_host", "host-maps") >= 16

    embedded = analyze_session(locate_session(pod), tmp_path / "embedded")
    findings = [(f["key"], f["priority"], f["title"]) for f in analysis["diagnosis"]["findings"]]
    assert findings == [(f.key, f.priority, f.title) for f in embedded.diagnosis.findings]
    assert any(key == "straggler_host" and "process1" in title for key, _, title in findings)


def test_a_pytorch_trace_uploaded_to_a_session_folder_is_analysed_like_an_xplane(cloud):
    """A Kineto trace (torch.profiler's `<worker>.pt.trace.json.gz`) in a session folder is registered, read and
    reported; XProf's views are not available for it, with the reason."""
    source = SHARED_PROFILES.parent / "traces" / "kineto_TraceLens_h100_bert-small.json.gz"
    if not source.exists():
        missing_shared(source)
    run, session = "torch-run", "2026_12_04_11_00_00"
    uri = session_prefix(cloud.config.profile_root, run, session) + "worker0.1764846000000.pt.trace.json.gz"
    cloud.blobs.put_file(source, uri)
    analysis = cloud.finished(run, session)
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    assert analysis["profile_uris"] == [uri] and analysis["profile"]["format"] == KINETO
    assert cloud.state.get(sessions_collection(run), session)["hosts"] == ["worker0.1764846000000"]
    tools = dict(cloud.state.list(tools_collection(analysis["analysis_id"])))
    assert sorted(tools) == sorted(BROAD_TOOLS)
    overview = json.loads(cloud.blobs.get(tools["get_xprof_overview"]["uri"]))  # xdiag's own, XProf's not available
    assert overview["detail"]["xprof"]["available"] is False and "Perfetto" in overview["detail"]["xprof"]["reason"]
    html = cloud.blobs.get(analysis["report_uri"]).decode()
    assert KINETO in html and "worker0.1764846000000.pt.trace.json.gz" in html
    assert cloud.blobs.get(uri) == source.read_bytes(), "the uploaded trace is never modified"


def test_every_stage_message_delivered_again_changes_nothing(cloud, healthy_done):
    analysis_id = healthy_done["analysis_id"]
    before = cloud.state.get(ANALYSES, analysis_id)
    tools_before = cloud.state.list(tools_collection(analysis_id))
    claim_before = cloud.state.get(CLAIMS, f"{analysis_id}.investigate")
    report_before = cloud.blobs.stat(healthy_done["report_uri"])
    counts = {
        ("aggregate", "tool-results"): cloud.handled("aggregate", "tool-results"),
        ("render", "reports"): cloud.handled("render", "reports"),
    }
    capture = CaptureReady(
        **{k: before[k] for k in ("analysis_id", "run_id", "session_id", "profile_uris", "output_uri", "investigator")}
    )
    ids = {("collect", "captures"): [cloud.publish("captures", capture)]}
    ids[("run_tool", "tool-runs")] = [
        cloud.publish("tool-runs", ToolRun(analysis_id=analysis_id, tool=t)) for t in BROAD_TOOLS
    ]
    ids[("aggregate", "tool-results")] = [
        cloud.publish("tool-results", ToolDone(analysis_id=analysis_id, tool=t)) for t in BROAD_TOOLS
    ]
    ids[("investigate", "investigations")] = [
        cloud.publish("investigations", InvestigationReady(analysis_id=analysis_id))
    ]
    ids[("render", "reports")] = [cloud.publish("reports", ReportReady(analysis_id=analysis_id))]
    for (name, topic), message_ids in ids.items():
        wait_until(
            lambda name=name, topic=topic, ids=message_ids: all(f"{topic}: message {i} handled" in cloud.log(name)
                                                                for i in ids),
            60,
            f"{name} to handle the copies",
            cloud,
        )
    # the copies publish nothing new in turn: the tool runs' copies only re-announce their results (to a fan-in that
    # takes them as before), the other stages' copies publish nothing
    wait_until(
        lambda: cloud.handled("aggregate", "tool-results") >= counts[("aggregate", "tool-results")] + len(BROAD_TOOLS),
        30,
        "the copies of the results",
    )
    wait_until(
        lambda: cloud.handled("render", "reports") >= counts[("render", "reports")] + 1, 30, "the copy of the report"
    )
    assert cloud.state.get(ANALYSES, analysis_id) == before  # one analysis, one diagnosis, untouched
    assert cloud.state.list(tools_collection(analysis_id)) == tools_before  # no tool ran twice
    assert cloud.state.get(CLAIMS, f"{analysis_id}.investigate") == claim_before  # one investigation
    assert cloud.blobs.stat(healthy_done["report_uri"]) == report_before  # one report, never rewritten


def test_the_same_capture_delivered_three_times_at_once_gives_one_analysis_and_one_report(cloud, h200_profiles):
    run, session = "triple-run", "s1"
    cloud.upload(h200_profiles["input_bound"], run, session)  # register announces it once…
    request = CaptureReady(run_id=run, session_id=session)  # …and a manual request names the same files twice
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: cloud.publish("captures", request), range(2)))
    analysis = cloud.finished(run, session)
    assert analysis["status"] == "DONE"
    analyses = [doc for _, doc in cloud.state.list(ANALYSES) if doc["run_id"] == run]
    assert [a["analysis_id"] for a in analyses] == [analysis["analysis_id"]]
    time.sleep(1.5)  # let any late copy finish
    report = f"{run}/plugins/profile/{session}/xdiag/summary.html"
    assert cloud.log("register").count(report) == 1, "summary.html was written once"  # each write notifies register


def _analysis_of(cloud: Cloud, run: str, session: str) -> dict | None:
    doc = cloud.state.get(sessions_collection(run), session) or {}
    return cloud.state.get(ANALYSES, doc["analysis_id"]) if doc.get("analysis_id") else None


def test_a_function_killed_mid_request_is_retried_and_the_analysis_completes(local_stack, cloud, h200_profiles):
    run, session = "crash-run", "s1"
    cloud.upload(h200_profiles["recompilation"], run, session)  # the largest: its first tool runs take a second or more
    wait_until(
        lambda: (a := _analysis_of(cloud, run, session)) and a["status"] == "RUNNING_TOOLS", 60, "the fan-out", cloud
    )
    killed = local_stack.crash("run_tool")  # both instances die holding a delivery
    done_at_crash = len(cloud.state.list(tools_collection(_analysis_of(cloud, run, session)["analysis_id"])))
    assert killed and done_at_crash < len(BROAD_TOOLS)
    analysis = cloud.finished(run, session)
    assert analysis["status"] == "DONE" and analysis["diagnosis"]["findings"][0]["key"] == "recompile_per_shape"
    tools = dict(cloud.state.list(tools_collection(analysis["analysis_id"])))
    assert sorted(tools) == sorted(BROAD_TOOLS) and not [t for t, d in tools.items() if d["status"] == "failed"]


def test_a_handler_that_fails_is_retried_with_backoff_until_it_succeeds(cloud, h200_profiles):
    """A tool run delivered before its analysis exists fails (500) and is redelivered until collect has run."""
    run, session, analysis_id = "retry-run", "s1", f"retry-{uuid.uuid4().hex[:8]}"
    cloud.upload(h200_profiles["widening_convert"], run, session)
    early = ToolRun(analysis_id=analysis_id, tool="get_hosts")
    cloud.publish("tool-runs", early)
    key = letter_key("tool-runs", early.model_dump_json().encode())
    wait_until(lambda: cloud.state.get("failures", key), 30, "the first failed delivery", cloud)
    cloud.publish("captures", CaptureReady(run_id=run, session_id=session, analysis_id=analysis_id))
    analysis = wait_until(
        lambda: (doc := cloud.state.get(ANALYSES, analysis_id)) and doc["status"] == "DONE" and doc, 60, "DONE", cloud
    )
    assert analysis["result"] == "NEEDS_ATTENTION"
    failure = cloud.state.get("failures", key)
    assert "unknown analysis" in failure["last_error"] and failure["attempts"] >= 1
    assert not cloud.dead_letters(analysis_id), "the retry succeeded: nothing was dead-lettered"


def test_poison_messages_end_on_dead_letter_topics_recorded_and_block_nothing(cloud, h200_profiles):
    marker = uuid.uuid4().hex[:8]
    cloud.publish("captures", f'{{"run_id": "{marker}", not json'.encode())
    cloud.publish("captures", CaptureReady(run_id=f"nope-{marker}", session_id="none"))
    missing = f"gone-{marker}/plugins/profile/s/host0.xplane.pb"
    cloud.stack.pubsub.publish(
        "profile-uploads",
        json.dumps({"name": missing}).encode(),
        {"eventType": "OBJECT_FINALIZE", "bucketId": cloud.config.bucket, "objectId": missing},
    )
    cloud.publish("investigations", InvestigationReady(analysis_id=f"unknown-{marker}"))  # raises on every delivery
    cloud.upload(h200_profiles["small_steps"], f"good-{marker}", "s1")  # real work beside the poison
    analysis = cloud.finished(f"good-{marker}", "s1")
    assert analysis["status"] == "DONE"
    letters = wait_until(
        lambda: len(cloud.dead_letters(marker)) >= 4 and cloud.dead_letters(marker), 90, "four dead letters", cloud
    )
    reasons = {(letter["source_topic"], letter["reason"]) for letter in letters}
    assert any(t == "captures" and "malformed CaptureReady" in r for t, r in reasons)
    assert any(t == "captures" and "unknown session" in r for t, r in reasons)
    assert any(t == "profile-uploads" and "missing object" in r and missing in r for t, r in reasons)
    # the one that raised was retried with backoff, then moved by Pub/Sub itself after its last attempt
    [retried] = [letter for letter in letters if letter["source_topic"] == "investigations"]
    assert "5 delivery attempts" in retried["reason"] and "unknown analysis" in retried["reason"]
    assert retried["attributes"]["CloudPubSubDeadLetterSourceSubscription"].endswith("investigations-push")


def test_a_corrupt_profile_ends_failed_with_its_reason_and_stays_as_uploaded(cloud, h200_profiles):
    corrupt = h200_profiles["healthy"].read_bytes()[:50_000]  # a real profile cut short
    uri = cloud.upload(corrupt, "corrupt-run", "s1")
    analysis = cloud.finished("corrupt-run", "s1")
    assert analysis["status"] == "FAILED" and analysis["result"] == "FAILED"
    assert re.search("truncated|malformed|not an XSpace", analysis["failure_reason"])
    html = cloud.blobs.get(analysis["report_uri"]).decode()
    assert "FAILED" in html and analysis["failure_reason"].split(":")[0] in html
    assert cloud.blobs.get(uri) == corrupt


def _xdiag(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xdiag.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env or dict(os.environ),
        cwd=cwd,
    )


def test_manual_publish_with_gcloud_and_with_xdiag(cloud, healthy_done):
    """The two ways docs/howto/local-stack.md (Ask for an analysis by hand) gives of asking for an analysis of a
    session already in the bucket."""
    gcloud_env = {
        **os.environ,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{os.environ['PUBSUB_EMULATOR_HOST']}/",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_PROJECT": cloud.config.project,
    }
    message = json.dumps({"run_id": "dup-run", "session_id": "s1", "analysis_id": "by-gcloud"})
    done = subprocess.run(
        ["gcloud", "pubsub", "topics", "publish", "captures", f"--message={message}"],
        capture_output=True,
        text=True,
        env=gcloud_env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    done = _xdiag("publish-capture", "--run", "dup-run", "--session", "s1", "--analysis-id", "by-xdiag")
    assert done.returncode == 0, done.stderr
    for analysis_id in ("by-gcloud", "by-xdiag"):
        analysis = wait_until(
            lambda analysis_id=analysis_id: (doc := cloud.state.get(ANALYSES, analysis_id))
            and doc["status"] == "DONE"
            and doc,
            60,
            analysis_id,
            cloud,
        )
        assert analysis["result"] == "OPTIMAL" and analysis["profile_uris"] == healthy_done["profile_uris"]
    status = json.loads(_xdiag("status", "--run", "dup-run", "--json").stdout)
    [session] = status["runs"][0]["sessions"]
    assert session["status"] == "COMPLETE" and session["analysis"]["status"] == "DONE"
    assert set(session["analysis"]["tools"].values()) <= {"ok", "not_available"}
    assert [s["name"] for s in session["analysis"]["stages"]][-3:] == ["fan-in", "investigate", "render"]


def test_xdiag_up_and_down_start_the_stack_and_leave_nothing_behind(tmp_path, h200_profiles):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_EMULATOR_HOST") and k not in ("XDIAG_BUCKET", "GOOGLE_CLOUD_PROJECT")
    }
    up = _xdiag("up", "--stack-dir", str(tmp_path / "stack"), "--quiet-period", "0.5", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert "export PUBSUB_EMULATOR_HOST=127.0.0.1:" in up.stdout
        stack = LocalStack.attach(tmp_path / "stack")
        assert all(listening(port) for port in stack.ports.values())
        for emulator in ("pubsub", "firestore"):  # each JVM says which options it picked up, first in its log
            log = Path(stack.processes[emulator]["log"]).read_text(errors="replace")
            assert f"Picked up JAVA_TOOL_OPTIONS: {EMULATOR_JVM_OPTIONS}" in log, log[:500]
        done = _xdiag(
            "upload",
            str(h200_profiles["memory_bound"]),
            "--run",
            "cli-run",
            "--wait",
            "--stack-dir",
            str(tmp_path / "stack"),
            env=env,
        )
        assert done.returncode == 0, done.stderr + stack.log_tail("collect")
        assert done.stdout.strip().endswith("cli-run/plugins/profile/memory_bound/xdiag/summary.html")
        assert re.search(r"render\s+\d+\.\d+ s", done.stderr) and "DONE" in done.stderr
        # the device profile's tool runs answer XProf's views from register's record (xdiag.analysis.xprof.stored):
        # no private copy in their function's TMPDIR, no conversion
        assert not list((tmp_path / "stack" / "tmp" / "run_tool").glob("xdiag-xprof-*"))
    finally:
        down = _xdiag("down", "--stack-dir", str(tmp_path / "stack"), env=env)
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "stack" / "tmp").exists()  # whatever an instance left there (a killed one leaves it all)
    assert not any(listening(port) for port in stack.ports.values())
    assert not [name for name, p in stack.processes.items() if group_members(p["pid"])], (
        "a process of the stack outlived it"
    )


OWNER_KILLED_WHILE_STARTING = """
import os, signal, sys
from pathlib import Path
from xdiag.cloud.localstack import LocalStack

def killed(self, deadline):  # the emulators and every function are spawned by now, and Firestore is not ready yet
    os.kill(os.getpid(), signal.SIGKILL)

LocalStack._wait_firestore = killed
LocalStack(Path(sys.argv[1])).start(owner_pid=os.getpid())
"""


def _running_in(folder: Path) -> list[str]:
    """The command lines of the processes whose working directory is `folder` or under it (the stack starts each
    of its services there, and their children inherit it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120])
        except OSError:
            continue
    return found


def test_a_stack_whose_owner_is_killed_while_it_starts_leaves_nothing_running(tmp_path):
    """A test run killed (SIGKILL, nothing of it runs after) while its stack starts: the reaper, the first process
    the stack starts, stops what was started."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    folder = tmp_path / "stack"
    owner = subprocess.run([sys.executable, "-c", OWNER_KILLED_WHILE_STARTING, str(folder)], env=env, timeout=180,
                           capture_output=True, text=True)
    assert owner.returncode == -9, owner.stderr
    deadline = time.monotonic() + 60
    while _running_in(folder) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _running_in(folder) == []
    assert not (folder / STATE_FILE).exists()
    assert {"pubsub.log", "firestore.log", "collect.log"} <= {log.name for log in (folder / "logs").iterdir()}


def test_without_the_google_cloud_cli_the_stack_says_what_to_install(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {"PATH": str(bare), "HOME": str(tmp_path)}
    done = _xdiag("up", "--stack-dir", str(tmp_path / "stack"), env=env)
    assert done.returncode == 1
    assert "Google Cloud CLI" in done.stderr and "pubsub-emulator" in done.stderr and "Java" in done.stderr


def test_a_gzip_bomb_is_refused_while_it_is_decoded_never_inflated_whole(cloud, tmp_path):
    """Failed before: an object stored with Content-Encoding: gzip was inflated whole into the cache (3.1 MB stored,
    3.0 GiB decoded) before any size check."""
    import gzip

    from xdiag.cloud.gcs import GcsBlobStore, split_uri, storage_client
    from xdiag.errors import ProfileError

    member = gzip.compress(bytes(64 * 2**20), compresslevel=9)  # 64 MiB of zeros in ~64 KiB
    uri = session_prefix(cloud.config.profile_root, "bomb-run", "s1") + "host0.xplane.pb"
    bucket, name = split_uri(uri)
    blob = storage_client(cloud.config.project).bucket(bucket).blob(name)
    blob.content_encoding = "gzip"
    blob.upload_from_string(member * 8, content_type="application/octet-stream")  # 512 MiB decoded, 8 gzip members
    limit = 16 * 2**20
    store = GcsBlobStore(storage_client(cloud.config.project), tmp_path / "cache", max_object_bytes=limit)
    with pytest.raises(ProfileError, match="Content-Encoding: gzip .* decodes to more than"):
        store.local_path(uri)
    assert sum(f.stat().st_size for f in (tmp_path / "cache").rglob("*") if f.is_file()) == 0  # nothing kept
    small = session_prefix(cloud.config.profile_root, "bomb-run", "s2") + "host0.xplane.pb"
    blob = storage_client(cloud.config.project).bucket(bucket).blob(split_uri(small)[1])
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(b"profile bytes" * 1000) * 2)  # within the limit: decoded, every member
    assert store.local_path(small).read_bytes() == b"profile bytes" * 2000
    # Members whose ends fall on the inflater's output step (1 MiB): each member's remainder was read twice, so the
    # decoded bytes doubled with every member (the stack's collect grew past 11 GiB on the bomb above, unlimited).
    aligned = session_prefix(cloud.config.profile_root, "bomb-run", "s3") + "host0.xplane.pb"
    blob = storage_client(cloud.config.project).bucket(bucket).blob(split_uri(aligned)[1])
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(bytes(2 * 2**20)) * 3)
    assert store.local_path(aligned).stat().st_size == 6 * 2**20


def test_a_gzip_bomb_writes_nothing_decoded_to_the_download_cache_before_it_is_refused(cloud, tmp_path):
    """Failed before: the bomb was refused only once its decoded bytes reached the limit, written to the cache as they
    came (2 GiB on the stack); the cache is watched here while it is refused."""
    import gzip
    import threading

    from xdiag.cloud.gcs import GcsBlobStore, split_uri, storage_client
    from xdiag.errors import ProfileError

    uri = session_prefix(cloud.config.profile_root, "bomb-run", "s4") + "host0.xplane.pb"
    blob = storage_client(cloud.config.project).bucket(split_uri(uri)[0]).blob(split_uri(uri)[1])
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(bytes(64 * 2**20), compresslevel=9) * 8)  # 512 MiB decoded
    store = GcsBlobStore(storage_client(cloud.config.project), tmp_path / "cache", max_object_bytes=256 * 2**20)
    largest, done = [0], threading.Event()

    def watch() -> None:  # the decoded bytes on disk (the stored, compressed download ends in .gz)
        while not done.is_set():
            sizes = [f.stat().st_size for f in (tmp_path / "cache").rglob("*.part") if f.is_file()]
            largest[0] = max([largest[0], *sizes])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(ProfileError, match="decodes to more than the 256 MiB limit"):
            store.local_path(uri)
    finally:
        done.set()
        watcher.join()
    assert largest[0] == 0, f"{largest[0]} decoded bytes written before the refusal"


def test_a_sweeper_whose_clock_is_an_hour_ahead_repairs_no_analysis_that_is_on_time(cloud):
    """Failed before: the sweeper compared the stages' times with its own clock and "repaired" 46 of 50 healthy
    analyses when that clock was an hour ahead. It runs here in a process whose clock is an hour ahead (its
    time.time(), the clock the sweeper read), against the stack's Firestore."""
    analysis_id = f"on-time-{uuid.uuid4().hex[:8]}"
    analysis = {"analysis_id": analysis_id, "run_id": "clock-run", "session_id": "s1", "profile_uris": [],
                "output_uri": f"{cloud.config.profile_root}/clock-run/plugins/profile/s1/xdiag", "status": "PENDING"}
    from xdiag.model import Analysis, utc_now
    from xdiag.pipeline.topics import ACTIVE_ANALYSES

    cloud.state.set(ANALYSES, analysis_id, Analysis.model_validate(analysis).model_dump(mode="json"))  # collect is reading
    cloud.state.set(ACTIVE_ANALYSES, analysis_id, {"at": utc_now()})
    script = (
        "import time\n"
        "_real = time.time\n"
        "time.time = lambda: _real() + 3600  # this machine's clock, an hour ahead\n"
        "from xdiag.cloud.runtime import CloudConfig, cloud_dependencies\n"
        "from xdiag.model import SweepRequest\n"
        "from xdiag.pipeline.sweep import sweep\n"
        "deps, _ = cloud_dependencies(CloudConfig.from_env())\n"
        "deps.stage_deadline_s = 600.0\n"
        "sweep(SweepRequest(), deps)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    after = cloud.state.get(ANALYSES, analysis_id)
    assert after["repairs"] == 0 and after["status"] == "PENDING" and after.get("last_repair") is None
    cloud.state.delete(ACTIVE_ANALYSES, analysis_id)


FULL_DISK_SCRIPT = """
import json, sys
from pathlib import Path
from xdiag.cloud.gcs import GcsBlobStore, storage_client
cache, uris = Path(sys.argv[1]), sys.argv[2:]
store = GcsBlobStore(storage_client(), cache, cache_bytes=2**30)  # its own limit far above the disk's room
answers = []
for uri in uris:
    try:
        answers.append({"uri": uri, "kept": [p.name for p in cache.rglob("*.xplane.pb")],
                        "size": store.local_path(uri).stat().st_size})
    except OSError as exc:
        answers.append({"uri": uri, "error": str(exc)})
print(json.dumps(answers))
"""


def test_a_full_disk_evicts_the_download_cache_and_then_says_no_space_left_on_device(cloud, tmp_path):
    """Failed before: a download that found the disk full failed (the cache full of older downloads stayed full), and
    the analysis said "collect never read the session". The cache here is a 3 MiB tmpfs of its own (a user and mount
    namespace: no root needed), against the stack's Cloud Storage emulator."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("unprivileged user namespaces are off here: no small file system of our own to fill")
    sizes = {"a": 1_200_000, "b": 1_200_000, "c": 1_200_000, "huge": 4_000_000}
    uris = [cloud.upload(os.urandom(size), "full-disk-run", name) for name, size in sizes.items()]
    cache = tmp_path / "cache"
    cache.mkdir()
    mount = f"mount -t tmpfs -o size=3m tmpfs {cache} && exec \"$0\" -c \"$1\" {cache} {' '.join(uris)}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", mount, sys.executable, FULL_DISK_SCRIPT],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    a, b, c, huge = json.loads(done.stdout)
    assert a["size"] == b["size"] == c["size"] == 1_200_000  # c fitted once a and b were evicted
    assert sorted(c["kept"]) == ["host0.xplane.pb", "host0.xplane.pb"]  # a and b were in the cache before c
    assert "No space left on device" in huge["error"] and "every other download evicted" in huge["error"]


def _hold_over_limit_upload(port: int, path: str) -> "socket.socket":
    """A client that announces a 100 MB body, sends 1 KB of it and keeps the connection open."""
    import socket

    held = socket.create_connection(("127.0.0.1", port), timeout=30)
    held.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: 100000000\r\n\r\n".encode() + b"x" * 1000)
    return held


def _status_line(sock) -> bytes:
    return sock.recv(200).split(b"\r\n", 1)[0]


@pytest.mark.parametrize("function, path", [("register", f"/projects/p/topics/{'profile-uploads'}"),
                                            ("control_plane", "/v1/runs")])
def test_clients_holding_over_limit_uploads_open_stall_no_other_request_to_the_function(local_stack, function, path):
    """Failed before: each over-limit upload was answered 413 at once, but the server then drained its body (5 s on
    a server thread) and lingered over closing it (2 s on its event-loop thread, one connection after another):
    with 24 such clients held open, another request to the same function waited 14 s or timed out at 30 s."""
    import http.client

    port = local_stack.ports[function]
    held = [_hold_over_limit_upload(port, path) for _ in range(24)]
    try:
        assert {_status_line(sock) for sock in held[:4]} == {b"HTTP/1.1 413 Request Entity Too Large"}
        # Another request, while the 24 are held: answered (what it answers does not matter here). The deadline
        # is what a caller's own timeout would be; the stall was 14 s to 30 s and more.
        other = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        other.request("GET", path)
        assert other.getresponse().status in (200, 401, 404, 405), function
    finally:
        for sock in held:
            sock.close()


def test_a_chunked_body_over_the_limit_is_refused_413(local_stack):
    """Failed before: a chunked body over the limit got 500 (the limit was found while the function read it)."""
    import socket

    with socket.create_connection(("127.0.0.1", local_stack.ports["control_plane"]), timeout=30) as sock:
        sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"30000\r\n" + b"x" * 0x30000 + b"\r\n0\r\n\r\n")
        assert _status_line(sock) == b"HTTP/1.1 413 Request Entity Too Large"


def test_a_hostile_trace_fails_on_its_first_delivery_with_a_one_line_reason(cloud):
    """Failed before: a string `ts` raised in collect (a traceback); the analysis failed only after five deliveries,
    with the raw exception as its reason."""
    import gzip

    from xdiag.cloud.runtime import FAILURES

    run, session = f"hostile-trace-{uuid.uuid4().hex[:6]}", "s1"
    uri = session_prefix(cloud.config.profile_root, run, session) + "rank0.pt.trace.json.gz"
    cloud.blobs.put(uri, gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}'))
    analysis = cloud.finished(run, session)
    reason = analysis["failure_reason"]
    assert analysis["status"] == "FAILED" and reason == "rank0.pt.trace.json.gz: event 0: 'ts' is 'soon', not a time in µs"
    retried = [doc for _, doc in cloud.state.list(FAILURES) if analysis["analysis_id"] in json.dumps(doc)]
    assert not retried, retried  # refused on its first delivery: nothing was redelivered
