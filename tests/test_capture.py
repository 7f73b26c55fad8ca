"""Capture for real: a JAX program in a subprocess serves the profiler (`jax.profiler.start_server`) and attaches
itself with `xdiag.sdk.workload.attach`, the run is created by the official ML Diagnostics SDK, and the capture,
monitor and control-plane functions run on the emulators with the rest of the chain (the `local_stack` fixture).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from xdiag.control.client import ControlPlaneClient, ControlPlaneError
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import ALERTS, get_run
from xdiag.pipeline.topics import ANALYSES, sessions_collection

from tests.test_local_stack import Cloud, wait_until

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Workload:
    """`python -m xdiag.examples.attached …` in its own process group, stopped at the end whatever happens."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_port()
        self.log = tmp_path / f"workload-{self.port}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "xdiag.examples.attached", "--port", str(self.port), *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self, timeout_s: float = 120) -> str:
        """The run the workload attached to (from its READY line)."""
        line = wait_until(lambda: next((l for l in self.output().splitlines() if l.startswith("READY ")), None)
                          or self.process.poll() is not None and f"exited {self.process.returncode}", timeout_s,
                          "the workload to start")
        assert line.startswith("READY "), f"{line}\n{self.output()}"
        return dict(part.split("=", 1) for part in line.split()[1:])["run"]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(15)


@pytest.fixture(scope="module")
def cloud(local_stack) -> Cloud:
    return Cloud(local_stack)


@pytest.fixture(scope="module")
def plane(local_stack) -> ControlPlaneClient:
    return ControlPlaneClient(local_stack.env["XDIAG_CONTROL_PLANE_URL"], local_stack.env["XDIAG_CONTROL_PLANE_TOKEN"])


@pytest.fixture(scope="module")
def sdk_url(local_stack) -> str:
    """The control plane's URL as the SDK is given it: the token as the basic-auth password."""
    return local_stack.env["XDIAG_CONTROL_PLANE_URL"].replace("http://", f"http://xdiag:{local_stack.env['XDIAG_CONTROL_PLANE_TOKEN']}@")


@pytest.fixture(scope="module")
def workload(tmp_path_factory, local_stack, plane, sdk_url):
    """A JAX training loop whose run the SDK created (gcs_path gs://BUCKET/runs) and which attached itself."""
    started = Workload(tmp_path_factory.mktemp("workload"), "--sdk", "--run", f"llama-{uuid.uuid4().hex[:6]}",
                       "--control-plane", sdk_url, "--gcs-path", f"gs://{local_stack.settings.bucket}/runs")
    try:
        run = started.ready()
        wait_until(lambda: _targets(plane, run), 60, "the workload's target registration")
        started.run = run
        yield started
    finally:
        started.stop()


def _targets(plane: ControlPlaneClient, run: str) -> list:
    try:
        return plane.targets(run)
    except ControlPlaneError:
        return []


def _run_on(plane: ControlPlaneClient, workload: Workload, run: str, name: str = "host0") -> str:
    """Another run whose one target is the workload's profiler server (as if a second job used that host)."""
    plane.create_run(run)
    plane.add_target(run, name, "127.0.0.1", workload.port)
    return run


def _xdiag(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


def _alerts(cloud: Cloud, run: str) -> list[dict]:
    return [doc for _, doc in cloud.state.list(ALERTS) if doc.get("run_id") == run]


def _sessions(cloud: Cloud, run: str) -> list[dict]:
    return [doc for _, doc in cloud.state.list(sessions_collection(run))]


def _done(cloud: Cloud, session: dict, timeout_s: float = 120) -> dict:
    return wait_until(lambda: (doc := cloud.state.get(ANALYSES, session["analysis_id"])) and
                      doc["status"] in ("DONE", "FAILED") and doc, timeout_s, "the analysis", cloud)


def test_the_sdk_registers_a_run_with_its_base_blob_path_and_its_phase_update_reaches_it(cloud, sdk_url, tmp_path):
    script = tmp_path / "sdk_run.py"
    script.write_text(
        "from google_cloud_mldiagnostics import machinelearning_run\n"
        f"run = machinelearning_run(name='sdk-only', gcs_path='gs://{cloud.config.bucket}/runs', base_url={sdk_url!r},"
        " run_workload_id='sdk-only-" + uuid.uuid4().hex[:6] + "', metrics_record_interval_sec=0)\n"
        "print('RUN', run.name, flush=True)\n"
    )  # a normal exit: the SDK reports the run SUCCEEDED from its atexit hook
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("RUN "))
    run = get_run(cloud.state, run_id)
    assert run["resource"]["baseBlobPath"] == f"gs://{cloud.config.bucket}/runs"
    assert run["resource"]["displayName"] == "sdk-only" and run["path"] == f"runs/{run_id}"
    assert run["resource"]["workload"]["state"] == "STATE_SUCCEEDED", "the phase update reached the run"


def test_xdiag_capture_from_an_attached_jax_workload_ends_in_summary_html(cloud, plane, workload):
    [target] = plane.targets(workload.run)
    assert (target["host"], target["port"]) == ("127.0.0.1", workload.port)
    done = _xdiag("capture", "--run", workload.run, "--duration", "2s", "--python-tracer", "0")
    assert done.returncode == 0, done.stderr + cloud.logs()
    report = done.stdout.strip()
    prefix = f"gs://{cloud.config.bucket}/runs/{workload.run}/plugins/profile/"
    assert report.startswith(prefix) and report.endswith("/xdiag/summary.html")
    [session] = _sessions(cloud, workload.run)
    assert session["kind"] == "on_demand" and session["status"] == "COMPLETE" and session["hosts"] == [target["name"]]
    assert session["files"] == [f"{prefix}{session['session_id']}/{target['name']}.xplane.pb"]
    assert cloud.blobs.stat(session["files"][0]).size > 10_000
    analysis = cloud.state.get(ANALYSES, session["analysis_id"])
    assert analysis["status"] == "DONE" and analysis["profile"]["platform"] == "CPU"
    assert b"NEEDS_ATTENTION" in cloud.blobs.get(report) or b"OPTIMAL" in cloud.blobs.get(report)
    # the files the capture wrote were left to it: register announced no second analysis
    assert [a for _, a in cloud.state.list(ANALYSES) if a["run_id"] == workload.run] == [analysis]
    listed = json.loads(_xdiag("sessions", "--run", workload.run, "--json").stdout)
    assert listed[0]["analysis"]["report_uri"] == report
    assert workload.run in _xdiag("runs").stdout


def _incident(run: str, state: str = "open", n: int = 0) -> bytes:
    """Cloud Monitoring's Pub/Sub notification, schema version 1.2."""
    return json.dumps({
        "incident": {
            "incident_id": f"0.{run}.{n}", "scoping_project_id": "p", "scoping_project_number": 1,
            "url": "https://console.cloud.google.com/monitoring/alerting/incidents/0.x", "started_at": int(time.time()),
            "ended_at": int(time.time()) if state == "closed" else None, "state": state,
            "summary": "Step time for llama-8b is above the threshold of 120 with a value of 180.",
            "apigee_url": "", "observed_value": "180", "resource": {"type": "generic_node", "labels": {"node_id": "n1"}},
            "resource_type_display_name": "Generic Node", "resource_id": "", "resource_display_name": "n1",
            "resource_name": "p Generic Node labels {node_id=n1}",
            "metric": {"type": "custom.googleapis.com/step_time_ms", "displayName": "step time",
                       "labels": {"run_id": run}},
            "metadata": {"system_labels": {}, "user_labels": {}},
            "policy_name": "step time degraded", "policy_user_labels": {}, "documentation": {},
            "condition": {"name": "projects/p/alertPolicies/1/conditions/2", "displayName": "step time > 120"},
            "condition_name": "step time > 120", "threshold_value": "120",
        },
        "version": "1.2",
    }).encode()


def test_a_cloud_monitoring_incident_gives_one_capture_and_one_analysis(cloud, plane, workload):
    run = _run_on(plane, workload, f"incident-{uuid.uuid4().hex[:6]}")
    cloud.stack.pubsub.publish("alerts", _incident(run))
    [session] = wait_until(lambda: [s for s in _sessions(cloud, run) if s.get("analysis_id")], 60, "the capture", cloud)
    assert session["kind"] == "auto" and session["trigger"] == "incident" and session["mode"] == "on_demand"
    assert _done(cloud, session)["status"] == "DONE"
    [alert] = _alerts(cloud, run)
    assert alert["outcome"].startswith("captured") and alert["incident_id"] == f"0.{run}.0"


def test_fifty_alerts_in_ten_seconds_give_one_capture(cloud, plane, workload):
    run = _run_on(plane, workload, f"storm-{uuid.uuid4().hex[:6]}")
    for n in range(50):
        cloud.stack.pubsub.publish("alerts", _incident(run, n=n))
        time.sleep(0.2)
    alerts = wait_until(lambda: len(_alerts(cloud, run)) == 50 and _alerts(cloud, run), 60, "50 alerts recorded", cloud)
    outcomes = sorted(a["outcome"].split(":")[0] for a in alerts)
    assert outcomes.count("captured") == 1 and outcomes.count("cool-down") == 49, outcomes
    [session] = _sessions(cloud, run)
    assert _done(cloud, session)["status"] == "DONE"


def test_a_closed_incident_does_nothing(cloud, plane, workload):
    run = _run_on(plane, workload, f"closed-{uuid.uuid4().hex[:6]}")
    cloud.stack.pubsub.publish("alerts", _incident(run, state="closed"))
    [alert] = wait_until(lambda: _alerts(cloud, run), 30, "the alert recorded", cloud)
    assert alert["outcome"] == "ignored: the incident is closed" and not _sessions(cloud, run)


def test_an_alert_for_an_unknown_run_or_an_unregistered_host_is_recorded_and_connects_nowhere(cloud, plane, workload):
    run = _run_on(plane, workload, f"guard-{uuid.uuid4().hex[:6]}")
    with socket.socket() as trap:  # an address a message names: nothing may connect to it
        trap.bind(("127.0.0.1", 0))
        trap.listen()
        trap.setblocking(False)
        address = f"127.0.0.1:{trap.getsockname()[1]}"
        ghost = f"ghost-{uuid.uuid4().hex[:6]}"
        for message in ({"run_id": ghost, "duration_ms": 1000}, {"run_id": run, "hosts": ["stranger"]},
                        {"run_id": run, "hosts": [address]}):
            cloud.stack.pubsub.publish("alerts", json.dumps(message).encode())
        cloud.stack.pubsub.publish("alerts", _incident(ghost))
        recorded = wait_until(lambda: len(_alerts(cloud, run) + _alerts(cloud, ghost)) == 4 and
                              _alerts(cloud, run) + _alerts(cloud, ghost), 30, "four alerts recorded", cloud)
        outcomes = sorted(a["outcome"] for a in recorded)
        assert sum(f"unknown run {ghost!r}" in o for o in outcomes) == 2
        assert any("not registered target(s)" in o and "stranger" in o for o in outcomes)
        assert any(o.startswith("rejected: target name") and address in o for o in outcomes)
        with pytest.raises(BlockingIOError):
            trap.accept()  # no connection was attempted
    assert not _sessions(cloud, run) and not _sessions(cloud, ghost) and get_run(cloud.state, ghost) is None


def test_a_degrading_step_time_reported_by_the_workload_makes_the_monitor_say_bad_and_capture(
    cloud, plane, local_stack, tmp_path
):
    slow = tmp_path / "slow"
    run = f"monitor-{uuid.uuid4().hex[:6]}"
    degrading = Workload(tmp_path, "--run", run, "--control-plane", local_stack.env["XDIAG_CONTROL_PLANE_URL"],
                         "--report-steps", "--pause-ms", "100", "--slowdown-ms", "400", "--slowdown-file", str(slow))
    try:
        degrading.ready()
        monitor = wait_until(lambda: (doc := cloud.state.get("monitors", state_key(run))) and doc.get("baseline_ms")
                             and doc, 120, "the monitor's baseline", cloud)
        assert monitor["verdict"] in ("warming_up", "good") and not _sessions(cloud, run)
        slow.touch()  # every step now takes 400 ms longer (past a baseline taken under load)
        try:
            [session] = wait_until(lambda: [s for s in _sessions(cloud, run) if s.get("analysis_id")], 120,
                                   "the monitor's capture", cloud)
        except AssertionError as timed_out:  # say what the monitor saw, and the run's sessions and alerts
            state = {k: v for k, v in (cloud.state.get("monitors", state_key(run)) or {}).items() if k != "open"}
            raise AssertionError(f"monitor: {state}\nsessions: {_sessions(cloud, run)}\n"
                                 f"alerts: {_alerts(cloud, run)}\n{timed_out}") from None
    finally:
        degrading.stop()
    assert session["kind"] == "auto" and session["trigger"] == "verdict"
    monitor = cloud.state.get("monitors", state_key(run))
    assert monitor["verdict"] == "bad" and monitor["window_median_ms"] > 1.15 * monitor["baseline_ms"]
    [alert] = [a for a in _alerts(cloud, run) if a["source"] == "verdict"]
    assert alert["outcome"].startswith("captured") and "above the baseline" in alert["summary"]
    assert _done(cloud, session)["status"] == "DONE"


def test_continuous_profiling_on_a_cpu_server_says_no_buffer_and_an_alert_falls_back_to_on_demand(
    cloud, plane, workload
):
    run = _run_on(plane, workload, f"continuous-{uuid.uuid4().hex[:6]}")
    started = _xdiag("continuous", "start", "--run", run)
    try:
        assert started.returncode == 0 and "host0: ok" in started.stderr, started.stderr
        assert plane.run(run)["continuous"]["state"] == "on"
        snapshot = _xdiag("continuous", "snapshot", "--run", run, "--name", "snap-1")
        assert snapshot.returncode == 1 and "no continuous-profiling buffer on this platform" in snapshot.stderr
        [session] = _sessions(cloud, run)
        assert session["kind"] == "snapshot" and session["status"] == "NO_BUFFER" and "CPU and GPU" in session["reason"]
        cloud.stack.pubsub.publish("alerts", json.dumps({"run_id": run, "verdict": "bad", "metric": "step_time_ms"}).encode())
        [auto] = wait_until(lambda: [s for s in _sessions(cloud, run) if s["kind"] == "auto" and s.get("analysis_id")],
                            60, "the fallback capture", cloud)
        assert auto["mode"] == "on_demand" and "captured on demand instead" in auto["note"]
        assert _done(cloud, auto)["status"] == "DONE"
        assert plane.run(run)["continuous"]["state"] == "on", "continuous profiling resumed after the fallback"
    finally:
        stopped = _xdiag("continuous", "stop", "--run", run)  # the workload's profiler serves the other tests too
    assert stopped.returncode == 0 and plane.run(run)["continuous"]["state"] == "off"


def test_an_unreachable_target_gives_a_failed_session_with_the_grpc_status(cloud, plane):
    run = f"dead-{uuid.uuid4().hex[:6]}"
    plane.create_run(run)
    plane.add_target(run, "gone", "127.0.0.1", free_port())  # nothing listens there
    requested = plane.capture(run, duration_ms=500)
    session = wait_until(lambda: (doc := plane.session(run, requested["session_id"]))["status"] == "FAILED" and doc,
                         60, "the failed session", cloud)
    assert "UNAVAILABLE" in session["reason"] and session["targets"]["gone"]["status"] == "failed"
    assert not session.get("analysis_id")


def test_the_control_plane_on_the_stack_refuses_a_request_without_the_token(local_stack):
    anonymous = ControlPlaneClient(local_stack.env["XDIAG_CONTROL_PLANE_URL"])
    with pytest.raises(ControlPlaneError) as refused:
        anonymous.create_run("sneaky-run")
    assert refused.value.status == 401
    with pytest.raises(ControlPlaneError) as escaped:
        ControlPlaneClient(local_stack.env["XDIAG_CONTROL_PLANE_URL"], local_stack.env["XDIAG_CONTROL_PLANE_TOKEN"]) \
            .create_run("..", base_blob_path="gs://elsewhere/runs")
    assert escaped.value.status in (400, 404)


def test_a_workload_whose_xdiag_is_unreachable_runs_on(tmp_path):
    lonely = Workload(tmp_path, "--run", "r", "--control-plane", f"http://127.0.0.1:{free_port()}", "--seconds", "3",
                      "--report-steps")
    try:
        assert lonely.process.wait(120) == 0, lonely.output()
    finally:
        lonely.stop()
    assert lonely.output().count("xdiag: control plane unreachable") == 1, lonely.output()
