"""The capture stage (topic `alerts`): a profile captured from a run's registered targets, then analysed.

An alert (a Cloud Monitoring incident, a monitor's `bad` verdict, a manual request, a snapshot request: see
`xdiag.model.Alert`) names a run. The stage resolves the run and its registered profiler targets, calls every
selected target's profiler server in parallel (gRPC ProfilerService through the `Profiler` port), writes the
xplane files to `gs://BUCKET/<run path>/plugins/profile/<session>/<target>.xplane.pb`, records the session with
its kind (`on_demand`, `snapshot` or `auto`) and publishes a CaptureReady on `captures`.

It only ever connects to registered targets: a message selects targets by name, and a name that is not
registered stops the request before any connection. Every alert and what became of it is in `alerts/{key}`.
Automatic captures (incidents, verdicts) are rate-limited per run by a cool-down; a manual request is not.
Where continuous profiling is on, an automatic capture takes a snapshot instead; where the platform keeps no
buffer (CPU and GPU servers answer but write nothing), it says so and captures on demand instead.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xdiag.model import Alert, CaptureReady, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import analysis_id_for, output_uri, session_prefix, state_key
from xdiag.pipeline.ports import BlobInfo
from xdiag.errors import InvalidRequest
from xdiag.ids import check_name, check_run_id
from xdiag.pipeline.runs import (
    ALERTS,
    KIND_AUTO,
    KIND_ON_DEMAND,
    KIND_SNAPSHOT,
    RUNS,
    CaptureSettings,
    check_duration_ms,
    check_hosts,
    check_tracer_levels,
    get_run,
    list_targets,
    resolve_target,
    run_path,
)
from xdiag.pipeline.topics import CLAIMS, TOPIC_ALERTS, TOPIC_CAPTURES, letter_key, sessions_collection

DEFAULT_TRACERS = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0}
NO_BUFFER = (
    "the profiler server keeps no continuous-profiling buffer on this platform: the snapshot wrote nothing "
    "(continuous profiling in snapshot mode needs a TPU with libtpu's circular buffer; CPU and GPU servers answer "
    "but record nothing)"
)
CONTINUOUS_TIMEOUT_S = 15.0


def new_session_id(kind: str) -> str:
    """XProf's timestamp form, with the kind and a short random suffix (two captures in one second differ)."""
    return f"{datetime.now(timezone.utc):%Y_%m_%d_%H_%M_%S}_{kind}_{secrets.token_hex(2)}"


def capture(alert: Alert, deps: Dependencies) -> None:
    """Handles one message on `alerts`; records what became of it in `alerts/{key}`. Never connects to an address
    the message names."""
    key = letter_key(TOPIC_ALERTS, alert.model_dump_json().encode())
    record: dict[str, Any] = {"source": alert.source, "received_at": utc_now(), "summary": alert.summary,
                              "detail": alert.detail}  # the analyser's own numbers, for `xdiag events describe`
    try:
        outcome = _handle(alert, deps, record)
    except InvalidRequest as exc:
        outcome = f"rejected: {exc}"
    record["outcome"] = outcome
    deps.state.set(ALERTS, key, record)
    deps.on_event("capture", {"alert": alert.source, "run": record.get("run_id"), "outcome": outcome})


def _handle(alert: Alert, deps: Dependencies, record: dict[str, Any]) -> str:
    settings = deps.capture
    run_id = alert.run_id or alert.labels.get(settings.run_label)
    record["run_id"] = run_id
    if alert.source == "incident":
        record["incident_id"] = alert.incident_id
        if alert.incident_state == "closed":
            return "ignored: the incident is closed"
    if alert.source == "verdict" and alert.verdict.lower() != "bad":
        return f"ignored: verdict {alert.verdict!r}"
    if not run_id:
        return f"ignored: the alert names no run (label {settings.run_label!r})"
    check_run_id(run_id)
    run = get_run(deps.state, run_id)
    if run is None:
        return f"ignored: unknown run {run_id!r}; nothing was captured"
    targets = {doc["name"]: doc for doc in list_targets(deps.state, run_id)}
    wanted = check_hosts(alert.hosts)
    unknown = [name for name in wanted if name not in targets]
    if unknown:
        return f"refused: not registered target(s) of run {run_id!r}: {', '.join(unknown)}; nothing was captured"
    selected = [targets[name] for name in (wanted or sorted(targets))]
    if not selected:
        return f"ignored: run {run_id!r} has no registered profiler targets"
    automatic = alert.source in ("incident", "verdict")
    duration_ms = check_duration_ms(alert.duration_ms or settings.duration_ms, settings)
    tracers = {**DEFAULT_TRACERS, **check_tracer_levels(alert.model_dump())}
    session_id = check_name(alert.session_id, "session id") if alert.session_id else None
    if automatic:
        blocked = _cool_down(deps, run_id)
        if blocked:
            return blocked
    kind = KIND_AUTO if automatic else KIND_SNAPSHOT if alert.source == "snapshot" else KIND_ON_DEMAND
    snapshot = alert.source == "snapshot" or automatic and (run.get("continuous") or {}).get("state") == "on"
    session_id = session_id or new_session_id(kind)
    record["session_id"] = session_id
    session = {
        "run_id": run_id, "session_id": session_id, "kind": kind, "status": "CAPTURING",
        "mode": "snapshot" if snapshot else "on_demand", "trigger": alert.source, "requested_at": utc_now(),
        "duration_ms": None if snapshot else duration_ms, "tracers": None if snapshot else tracers,
        "targets": {t["name"]: {"address": _address(t), "status": "pending"} for t in selected},
        "updated_at": utc_now(),
    }
    if not deps.state.create(CLAIMS, f"{state_key(run_id)}.session.{session_id}", {"at": utc_now()}):
        return f"ignored: session {session_id!r} was captured already (a redelivery)"
    requested = deps.state.get(sessions_collection(run_id), state_key(session_id)) or {}
    session["requested_at"] = requested.get("requested_at", session["requested_at"])
    _save_session(deps, run_id, session)
    continuous = (run.get("continuous") or {}) if snapshot and automatic else None
    return _capture_session(deps, run_id, session, selected, snapshot, continuous, duration_ms, tracers)


def _cool_down(deps: Dependencies, run_id: str) -> str | None:
    """Claims the run's automatic capture for now; a reason where another capture is inside the cool-down.

    Claims are create-if-absent documents per cool-down bucket (no transaction, no counter): an alert storm
    delivered to many instances at once still makes one claim."""
    window = deps.capture.cooldown_s
    if window <= 0:
        return None
    now = time.time()
    bucket = int(now // window)
    previous = deps.state.get(CLAIMS, f"{state_key(run_id)}.capture.{bucket - 1}")
    if previous and now - previous["at"] < window:
        return f"cool-down: run {run_id!r} was captured automatically {now - previous['at']:.0f} s ago"
    if not deps.state.create(CLAIMS, f"{state_key(run_id)}.capture.{bucket}", {"at": now, "at_utc": utc_now()}):
        return f"cool-down: run {run_id!r} is being captured already (one automatic capture per {window:.0f} s)"
    deps.state.update(RUNS, state_key(run_id), {"last_capture_at": utc_now()})
    return None


def _address(target: dict[str, Any]) -> str:
    host = target["host"]
    return f"[{host}]:{target['port']}" if ":" in host else f"{host}:{target['port']}"


def _resolved_address(target: dict[str, Any], settings: CaptureSettings) -> str:
    """What the profiler calls: the target's name resolved and checked again now (a name re-pointed since its
    registration reaches nothing registration would have refused), as an IP address."""
    return _address({"host": resolve_target(target["host"], target["port"], settings.allow_loopback),
                     "port": target["port"]})


def _capture_session(
    deps: Dependencies, run_id: str, session: dict[str, Any], selected: list[dict[str, Any]], snapshot: bool,
    continuous: dict[str, Any] | None, duration_ms: int, tracers: dict[str, int],
) -> str:
    """`continuous`: the run's continuous-profiling state, where an automatic capture took a snapshot (and falls back
    to an on-demand capture when the platform keeps no buffer)."""
    prefix = session_prefix(deps.profile_root, run_path(deps.state, run_id), session["session_id"])
    session["started_at"] = utc_now()  # when the targets were called: the captured window begins about here
    with tempfile.TemporaryDirectory(prefix="xdiag-capture-") as folder:
        results = _from_all(deps, selected, Path(folder), snapshot, duration_ms, tracers)
        if continuous is not None and all(r["status"] == "no_buffer" for r in results.values()):
            # The continuous session holds the profiler: pause it for the on-demand capture, then resume it.
            session["note"] = (f"{NO_BUFFER}; captured on demand instead (continuous profiling paused for the "
                               "capture and resumed)")
            session["mode"], session["duration_ms"], session["tracers"] = "on_demand", duration_ms, tracers
            results = _from_all(deps, selected, Path(folder) / "on-demand", False, duration_ms, tracers,
                                resume={"device_tracer_level": continuous.get("device_tracer_level") or 1,
                                        "host_tracer_level": 0, "python_tracer_level": 0})
        files: list[BlobInfo] = []
        for name, result in sorted(results.items()):
            if result.get("path"):
                uri = deps.blobs.put_file(Path(result.pop("path")), f"{prefix}{name}.xplane.pb")
                files.append(deps.blobs.stat(uri) or BlobInfo(uri=uri, size=0, generation=""))
                result["file"] = uri
    session["targets"] = {name: {"address": session["targets"][name]["address"], **r} for name, r in results.items()}
    session["updated_at"] = session["completed_at"] = utc_now()
    failed = {name: r for name, r in results.items() if r["status"] != "ok"}
    if not files:
        session["status"] = "NO_BUFFER" if all(r["status"] == "no_buffer" for r in results.values()) else "FAILED"
        session["reason"] = "; ".join(f"{name} ({session['targets'][name]['address']}): {r['error']}"
                                      for name, r in sorted(failed.items()))
        _save_session(deps, run_id, session)
        return f"{session['status']}: session {session['session_id']!r}: {session['reason']}"
    root = deps.profile_root
    path = run_path(deps.state, run_id)
    message = CaptureReady(
        analysis_id=analysis_id_for(run_id, session["session_id"], files, deps.default_investigator),
        run_id=run_id, session_id=session["session_id"], profile_uris=sorted(f.uri for f in files),
        output_uri=output_uri(root, path, session["session_id"]), investigator=deps.default_investigator,
    )
    session.update({
        "status": "COMPLETE", "analysis_id": message.analysis_id, "files": message.profile_uris,
        "hosts": sorted(name for name, r in results.items() if r["status"] == "ok"),
    })
    if failed:
        session["reason"] = "; ".join(f"{name}: {r['error']}" for name, r in sorted(failed.items()))
    _save_session(deps, run_id, session)
    deps.bus.publish(TOPIC_CAPTURES, message)
    return f"captured: session {session['session_id']!r} from {len(files)} target(s), analysis {message.analysis_id}"


def _save_session(deps: Dependencies, run_id: str, session: dict[str, Any]) -> None:
    deps.state.set(sessions_collection(run_id), state_key(session["session_id"]), session)


def _from_all(
    deps: Dependencies, selected: list[dict[str, Any]], folder: Path, snapshot: bool, duration_ms: int,
    tracers: dict[str, int], resume: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every target at once (the client's calls release the GIL); each result: status ok | failed | no_buffer.
    With `resume`, each target's continuous profiling is stopped before the trace and started again after it."""

    def one(target: dict[str, Any]) -> dict[str, Any]:
        logdir = folder / target["name"]
        logdir.mkdir(parents=True, exist_ok=True)
        try:
            address = _resolved_address(target, deps.capture)
        except InvalidRequest as exc:
            return {"status": "failed", "error": f"refused: {exc}"}
        try:
            if snapshot:
                deps.profiler.snapshot(address, logdir)
            elif resume is not None:
                try:
                    deps.profiler.stop_continuous(address)
                    deps.profiler.trace(address, logdir, duration_ms, deps.capture.attempts, tracers)
                finally:
                    deps.profiler.start_continuous(address, resume)
            else:
                deps.profiler.trace(address, logdir, duration_ms, deps.capture.attempts, tracers)
        except Exception as exc:  # the client raises RuntimeError with the gRPC status text
            return {"status": "failed", "error": str(exc)[:2000] or type(exc).__name__}
        written = sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))
        if not written:
            if snapshot:
                return {"status": "no_buffer", "error": NO_BUFFER}
            return {"status": "failed", "error": "the profiler server answered but wrote no profile"}
        return {"status": "ok", "path": str(written[-1]), "size": written[-1].stat().st_size}

    with ThreadPoolExecutor(max_workers=min(len(selected), 64)) as pool:
        return dict(zip((t["name"] for t in selected), pool.map(one, selected), strict=True))


def set_continuous(
    deps: Dependencies, run_id: str, start: bool, hosts: list[str] | None = None, device_tracer_level: int = 1
) -> dict[str, Any]:
    """Starts or stops continuous profiling (snapshot mode) on the run's targets (all, or those named); records
    the state on the run and returns it with each target's answer."""
    run = get_run(deps.state, run_id)
    if run is None:
        raise LookupError(f"unknown run {run_id!r}")
    targets = {doc["name"]: doc for doc in list_targets(deps.state, run_id)}
    unknown = [name for name in hosts or [] if name not in targets]
    if unknown:
        raise InvalidRequest(f"not registered target(s) of run {run_id!r}: {', '.join(unknown)}")
    selected = [targets[name] for name in (hosts or sorted(targets))]
    if not selected:
        raise InvalidRequest(f"run {run_id!r} has no registered profiler targets")
    options = {"device_tracer_level": device_tracer_level, "host_tracer_level": 0, "python_tracer_level": 0}

    def one(target: dict[str, Any]) -> dict[str, Any]:
        address = _resolved_address(target, deps.capture)
        if start:
            deps.profiler.start_continuous(address, options)
        else:
            deps.profiler.stop_continuous(address)
        return {"status": "ok"}

    answers: dict[str, dict[str, Any]] = {}
    pool = ThreadPoolExecutor(max_workers=min(len(selected), 64))
    futures = {t["name"]: pool.submit(one, t) for t in selected}
    for name, future in futures.items():
        try:
            answers[name] = future.result(timeout=CONTINUOUS_TIMEOUT_S)
        except FutureTimeout:
            answers[name] = {"status": "failed", "error": f"no answer within {CONTINUOUS_TIMEOUT_S:.0f} s"}
        except Exception as exc:
            answers[name] = {"status": "failed", "error": str(exc)[:2000]}
    pool.shutdown(wait=False)
    started = [name for name, a in answers.items() if a["status"] == "ok"]
    state = {
        "state": "on" if start and started else "off",
        "since": utc_now() if start and started else None,
        "targets": started if start else [],
        "device_tracer_level": device_tracer_level if start else None,
        "answers": answers,
        "note": "snapshots keep data only where the platform has a circular buffer (TPU); on CPU and GPU a snapshot "
                "writes nothing, and an alert then captures on demand",
        "updated_at": utc_now(),
    }
    deps.state.update(RUNS, state_key(run_id), {"continuous": state})
    return state
