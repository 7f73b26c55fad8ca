"""What `xdiag upload`, `xdiag status` and `xdiag publish-capture` do against the pipeline (the cloud, or the
local stack: its emulators' hosts are read from the stack's state where the environment does not name them)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xdiag.cloud.runtime import CloudConfig, firestore_client
from xdiag.model import CaptureReady
from xdiag.pipeline.layout import host_file_key, recorded_input, session_prefix, state_key
from xdiag.pipeline.ports import StateStore
from xdiag.pipeline.runs import RUNS
from xdiag.pipeline.sweep import epoch, overdue_s
from xdiag.pipeline.topics import (
    ACTIVE_ANALYSES,
    ANALYSES,
    CLAIMS,
    DEAD_LETTERS,
    TOPIC_CAPTURES,
    files_collection,
    host_maps_collection,
    sessions_collection,
    tools_collection,
)
from xdiag.profile.locate import LocatedSession
from xdiag.tools import BROAD_TOOLS


def client_config(bucket: str | None = None) -> CloudConfig:
    env = dict(os.environ)
    if bucket:
        env["XDIAG_BUCKET"] = bucket
    return CloudConfig.from_env(env)


def state_store(config: CloudConfig) -> StateStore:
    from xdiag.cloud.firestore import FirestoreStateStore

    return FirestoreStateStore(firestore_client(config.project))


EMULATORS = (("Firestore", "FIRESTORE_EMULATOR_HOST"), ("Pub/Sub", "PUBSUB_EMULATOR_HOST"),
             ("Cloud Storage", "STORAGE_EMULATOR_HOST"))


def unreachable_emulators(env: dict[str, str] | None = None, timeout_s: float = 2.0) -> list[str]:
    """Each emulator the environment names that does not accept a connection, in words (none in the cloud)."""
    env = os.environ if env is None else env
    down = []
    for service, variable in EMULATORS:
        address = env.get(variable, "").removeprefix("http://").removeprefix("https://").rstrip("/")
        if not address:
            continue
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
                pass
        except (OSError, ValueError) as exc:
            down.append(f"the {service} emulator at {address} is not answering ({exc.strerror or exc})")
    return down


def within(seconds: float, what: str, work: Callable[[], Any]) -> Any:
    """`work()`'s answer, or TimeoutError saying what did not answer in time (a client that retries for minutes
    against a service that is down never makes a command hang)."""
    answer: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    worker = threading.Thread(target=run, daemon=True, name=what)
    worker.start()
    worker.join(seconds)
    if failure:
        raise failure[0]
    if not answer:
        raise TimeoutError(f"{what} did not answer within {seconds:g} s")
    return answer[0]


def upload_session(located: LocatedSession, run: str, config: CloudConfig) -> list[str]:
    """Writes each host's file to gs://BUCKET/<run>/plugins/profile/<session>/<file>; returns the URIs."""
    from xdiag.cloud.gcs import GcsBlobStore, storage_client

    blobs = GcsBlobStore(storage_client(config.project), config.cache_dir)
    prefix = session_prefix(config.profile_root, run, located.name)
    return [blobs.put_file(path, prefix + path.name) for path in located.files]


def publish_capture(
    config: CloudConfig, run: str, session: str, investigator: str = "rules", analysis_id: str | None = None
) -> CaptureReady:
    """The manual request: a CaptureReady naming the run and session; collect finds the files."""
    from xdiag.cloud.pubsub import PubSubBus

    message = CaptureReady(run_id=run, session_id=session, investigator=investigator, analysis_id=analysis_id)
    PubSubBus(config.project).publish(TOPIC_CAPTURES, message)
    return message


@dataclass
class Stage:
    name: str
    seconds: float
    note: str = ""


def stage_breakdown(state: StateStore, analysis: dict[str, Any], uploaded_at: float | None = None) -> list[Stage]:
    """Where the time from upload to summary.html went, from the timestamps the stages recorded."""
    files = state.list(files_collection(analysis["run_id"], analysis["session_id"]))
    session = state.get(sessions_collection(analysis["run_id"]), state_key(analysis["session_id"])) or {}
    tools = [doc for _, doc in state.list(tools_collection(analysis["analysis_id"]))]
    maps = [doc for _, doc in state.list(host_maps_collection(analysis["analysis_id"]))]
    claim = state.get(CLAIMS, f"{analysis['analysis_id']}.investigate") or {}
    timeline = analysis.get("timeline") or {}
    registered = [doc["registered_at"] for _, doc in files if "registered_at" in doc]
    points = [
        ("notify+register", max(registered) if registered else None, f"{len(registered)} file(s)"),
        ("quiet period", epoch(session.get("completed_at")), ""),
        *([("map hosts", max((epoch(d.get("finished_at")) or 0 for d in maps), default=None),
            f"{len(maps)} map(s), {sum(d.get('duration_ms') or 0 for d in maps) / 1000:.2f} s in the maps")]
          if maps else []),
        ("collect", epoch(timeline.get("collect")), f"read {analysis.get('timings_ms', {}).get('read', 0):.0f} ms"),
        (
            "tools",
            max((epoch(d.get("finished_at")) or 0 for d in tools), default=None),
            f"{len(tools)} runs, {sum(d.get('duration_ms') or 0 for d in tools) / 1000:.2f} s in the tools",
        ),
        ("fan-in", epoch(claim.get("at")), ""),
        ("investigate", epoch(timeline.get("investigate")), ""),
        ("render", epoch(timeline.get("render")), ""),
    ]
    start = (
        uploaded_at
        if uploaded_at is not None
        else (min(registered) if registered else epoch(analysis.get("created_at")))
    )
    stages, previous = [], start
    for name, at, note in points:
        if at is None or previous is None:
            continue
        stages.append(Stage(name, max(at - previous, 0.0), note))
        previous = at
    return stages


def wait_for_analysis(
    state: StateStore, run: str, session: str, timeout_s: float, since: float = 0.0
) -> dict[str, Any]:
    """Polls until the session's current analysis is DONE or FAILED with its report written; TimeoutError otherwise.
    A late host or a replaced file makes a newer analysis current: that is the one waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = state.get(sessions_collection(run), state_key(session)) or {}
        if doc.get("analysis_id") and (epoch(doc.get("completed_at")) or 0) >= since:
            analysis = state.get(ANALYSES, doc["analysis_id"])
            if (analysis and analysis.get("status") in ("DONE", "FAILED")
                    and analysis.get("report_uri") == f"{analysis['output_uri']}/summary.html"):
                return analysis  # its report is the session's (not one written while more files were arriving)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no finished analysis of {run}/{session} after {timeout_s:.0f} s (`xdiag status --run {run}`)"
            )
        time.sleep(0.25)


def overdue_analyses(state: StateStore, deadline_s: float, run: str | None = None) -> list[dict[str, Any]]:
    """Every analysis not finished and past its deadline (no progress for `deadline_s`): what the sweeper repairs,
    and what `xdiag status` flags."""
    now, found = state.now(), []  # the store's clock, which the stages' times are compared with
    for key, _ in state.list(ACTIVE_ANALYSES):
        doc = state.get(ANALYSES, key)
        if doc is None or (run is not None and doc.get("run_id") != run):
            continue
        late = overdue_s(state, doc, deadline_s, now)
        if late > 0:
            found.append({"analysis_id": key, "run_id": doc.get("run_id"), "session_id": doc.get("session_id"),
                          "status": doc.get("status"), "overdue_s": round(late, 1), "repairs": doc.get("repairs", 0),
                          "last_repair": doc.get("last_repair")})
    return found


def _host_maps(state: StateStore, analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """The map stage's invocations of a many-host analysis, one per host file in the session's order (pending where
    none has recorded it yet); empty for a session read whole."""
    recorded = dict(state.list(host_maps_collection(analysis["analysis_id"])))
    if not recorded and analysis.get("status") != "MAPPING_HOSTS":
        return []
    rows = []
    for info in sorted(analysis.get("inputs") or [], key=lambda i: i["uri"]):
        key = host_file_key(recorded_input(info))
        doc = recorded.get(key, {})
        rows.append({"host": info["uri"].rsplit("/", 1)[-1], "status": doc.get("status", "pending"),
                     "duration_ms": doc.get("duration_ms"), "input_bytes": int(info["size"]),
                     "prepared_bytes": doc.get("prepared_bytes"), "reused": bool(doc.get("reused")),
                     "reason": doc.get("reason")})
    return rows


def read_status(state: StateStore, run: str | None = None, deadline_s: float = 900.0) -> dict[str, Any]:
    """Runs → sessions → analyses (with their tools' status), the analyses past their deadline, the dead letters."""
    runs = [(key, doc) for key, doc in state.list(RUNS) if run is None or doc.get("run_id") == run]
    out: dict[str, Any] = {"runs": [], "dead_letters": [doc for _, doc in state.list(DEAD_LETTERS)],
                           "overdue": overdue_analyses(state, deadline_s, run)}
    for key, run_doc in runs:
        sessions = []
        for _, session in state.list(sessions_collection(run_doc.get("run_id", key))):
            analysis = state.get(ANALYSES, session["analysis_id"]) if session.get("analysis_id") else None
            if analysis is not None:
                tools = dict(state.list(tools_collection(analysis["analysis_id"])))
                analysis = {
                    "analysis_id": analysis["analysis_id"],
                    "status": analysis["status"],
                    "result": analysis.get("result"),
                    "failure_reason": analysis.get("failure_reason"),
                    "report_uri": analysis.get("report_uri"),
                    "repairs": analysis.get("repairs", 0),
                    "overdue_s": round(overdue_s(state, analysis, deadline_s), 1),
                    "tools": {t: (tools[t]["status"] if t in tools else "pending") for t in BROAD_TOOLS},
                    "host_maps": _host_maps(state, analysis),
                    "timings_ms": analysis.get("timings_ms", {}),
                    "stages": [vars(s) for s in stage_breakdown(state, analysis)],
                }
            sessions.append(
                {**{k: session.get(k) for k in ("session_id", "status", "hosts", "completed_at")}, "analysis": analysis}
            )
        out["runs"].append(
            {"run_id": run_doc.get("run_id", key), "base_uri": run_doc.get("base_uri"), "sessions": sessions}
        )
    return out
