"""The sweeper (topic `sweeps`, every minute from Cloud Scheduler; every few seconds from the local stack's timer):
no upload stays without its analysis, and no analysis stays stuck.

Between an upload and its analysis: a notification Pub/Sub never delivered (Pub/Sub down, register down when it was
pushed), a register that died waiting out the quiet period, an announcement collect never received. The sweeper
lists the bucket's session files and finds every session whose newest file is older than the quiet period plus
`stage_deadline_s` and that has no analysis of exactly its files (none announced, or the one announced never recorded
by collect); it announces it again, as a new message: the newest file's notification to register, or, where register
announced an analysis collect never recorded, that CaptureReady. After `max_repairs` it gives up and records why on the
session (`FAILED`). Sessions are remembered as settled by the upload time of their newest file (`sweeper/uploads`,
`since`): a sweep reads the state of the sessions with a file uploaded since, not of the whole bucket; a Firestore
that lost its documents has lost that mark too, and the next sweep checks every session again.

A function killed mid-delivery, a message the emulator or Pub/Sub holds back, a fan-in whose claim was made but
whose message was lost: each leaves an analysis with no progress. Every active analysis has a deadline: its last
progress (its own last write, its newest tool result, its fan-in claim) plus `stage_deadline_s`. Past it (and at
most once per deadline), the sweeper repairs what is missing, as new messages (numbered by the repair, so the
publish-once keys let them through):

    PENDING          the CaptureReady again (collect reads the session and fans out)
    MAPPING_HOSTS    the CaptureReady again (collect publishes a HostMapRun for every host file without a map
                     record, or, with all in, assembles the session and fans out)
    RUNNING_TOOLS    a ToolRun for every tool without a result; with all in, a ToolDone (the fan-in check) or,
                     where the fan-in was claimed already, the InvestigationReady
    INVESTIGATING    the InvestigationReady again (investigate keeps a diagnosis it has)
    RENDERING        the ReportReady again

After `max_repairs` repairs without the analysis finishing, it is FAILED with the reason (which stage, what was
missing, and the last error a stage recorded on it), and the report says so. An analysis whose session moved on to
newer files is marked SUPERSEDED instead. Concurrent sweeps repair each analysis once: repair n is a create-if-absent
claim.

Every time is compared with the state store's clock (`StateStore.now`), never the sweeper's own: a sweeper whose
clock is off repairs nothing that is on time.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from xdiag.model import (
    Analysis,
    CaptureReady,
    InvestigationReady,
    ProfileUploaded,
    ReportReady,
    SweepRequest,
    ToolDone,
    utc_now,
)
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import host_file_key, inputs_key, output_uri, recorded_input, state_key
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.runs import CAPTURED_KINDS, run_for_path
from xdiag.pipeline.stages.analysis_record import fail_analysis, is_current, valid_profile_object
from xdiag.pipeline.stages.collect import publish_tool_runs
from xdiag.pipeline.topics import (
    ACTIVE,
    ACTIVE_ANALYSES,
    ANALYSES,
    CLAIMS,
    TOPIC_CAPTURES,
    TOPIC_INVESTIGATIONS,
    TOPIC_PROFILE_UPLOADS,
    TOPIC_REPORTS,
    TOPIC_TOOL_RESULTS,
    host_maps_collection,
    sessions_collection,
    tools_collection,
)
from xdiag.tools import BROAD_TOOLS


def epoch(value: Any) -> float | None:
    """Seconds since the epoch of a time the stages wrote (ISO 8601 text, or seconds already); None where none."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def last_progress(analysis: dict[str, Any], tools: list[dict[str, Any]], claim: dict[str, Any] | None) -> float:
    """When a stage last moved the analysis: its own last write, its newest tool result (or host map), its fan-in
    claim (a repair is no progress: an analysis the sweeper keeps repairing stays overdue until a stage moves it)."""
    moments = [epoch(analysis.get("updated_at")), epoch(analysis.get("created_at")),
               *(epoch(doc.get("finished_at")) for doc in tools), epoch((claim or {}).get("at"))]
    return max((m for m in moments if m is not None), default=0.0)


def overdue_s(state, analysis: dict[str, Any], deadline_s: float, now: float | None = None) -> float:
    """How far past its deadline an active analysis is (0 where it is not), by the store's clock: what `xdiag status`
    shows."""
    if analysis.get("status") not in ACTIVE:
        return 0.0
    collection = (host_maps_collection if analysis.get("status") == "MAPPING_HOSTS" else tools_collection)
    tools = [doc for _, doc in state.list(collection(analysis["analysis_id"]))]
    claim = state.get(CLAIMS, f"{analysis['analysis_id']}.investigate")
    late = (now if now is not None else state.now()) - last_progress(analysis, tools, claim) - deadline_s
    return max(late, 0.0)


SWEEPER = "sweeper"  # `uploads`: {since}: sessions whose newest file is older are settled
UPLOAD_REPAIRS = "upload_repairs"  # one per session the sweeper announced again: repairs, when, what was missing


def sweep(message: SweepRequest, deps: Dependencies) -> None:
    now = deps.state.now()  # the store's clock: the times compared below were written by other machines
    sweep_uploads(deps, now)
    for key, _ in deps.state.list(ACTIVE_ANALYSES):
        doc = deps.state.get(ANALYSES, key)
        if doc is None or doc.get("status") not in ACTIVE:
            deps.state.delete(ACTIVE_ANALYSES, key)  # finished since (or never recorded): nothing to watch
            continue
        repaired_at = epoch((doc.get("last_repair") or {}).get("at")) or 0.0
        if overdue_s(deps.state, doc, deps.stage_deadline_s, now) <= 0 or now - repaired_at < deps.stage_deadline_s:
            continue  # on time, or repaired less than a deadline ago: the repair gets its chance
        analysis = Analysis.model_validate(doc)
        if not is_current(deps, analysis):
            continue  # marked SUPERSEDED: a newer analysis covers the session
        repair = analysis.repairs + 1
        if not deps.state.create(CLAIMS, f"{analysis.analysis_id}.repair.{repair}", {"at": utc_now()}):
            continue  # another sweep is repairing it
        missing = _missing(deps, analysis)
        if analysis.repairs >= deps.max_repairs:
            analysis.repairs = repair  # its report request is a new message too
            fail_analysis(deps, analysis, (
                f"stuck in {analysis.status} past its deadline ({deps.stage_deadline_s:g} s without progress) after "
                f"{repair - 1} repair(s): {missing}"))
            deps.on_event("sweep", {"analysis_id": analysis.analysis_id, "failed": missing})
            continue
        deps.state.update(ANALYSES, analysis.analysis_id, {"repairs": repair, "last_repair": {
            "at": datetime.fromtimestamp(now, timezone.utc).isoformat(), "status": analysis.status, "missing": missing}})
        _repair(deps, analysis, repair)
        deps.on_event("sweep", {"analysis_id": analysis.analysis_id, "repair": repair, "missing": missing})


def sweep_uploads(deps: Dependencies, now: float) -> None:
    """Announces again every session with files in the bucket and no analysis of exactly them, once its newest file
    is older than the quiet period plus the stage deadline (register had its chance)."""
    if not deps.profile_root:
        return
    settle_s = max(deps.quiet_period_s, deps.multi_host_quiet_period_s) + deps.stage_deadline_s
    since = float((deps.state.get(SWEEPER, "uploads") or {}).get("since") or 0.0)
    sessions: dict[tuple[str, str], list[BlobInfo]] = {}
    for info in deps.blobs.list(deps.profile_root.rstrip("/") + "/"):
        named = valid_profile_object(info.uri)
        if named is not None:
            sessions.setdefault((named.run, named.session), []).append(info)
    next_since = now - settle_s  # what is younger is checked again at the next sweep
    for (folder, session), files in sessions.items():
        newest = max(files, key=lambda info: (info.updated or 0.0, info.uri))
        uploaded = newest.updated if newest.updated is not None else now
        if uploaded < since or now - uploaded < settle_s:
            continue  # settled at an earlier sweep, or register still has its chance
        if _repair_announcement(deps, folder, session, sorted(files, key=lambda i: i.uri), newest, now):
            next_since = min(next_since, uploaded)  # not settled yet: checked again until it is
    deps.state.set(SWEEPER, "uploads", {"since": next_since, "at": utc_now()})


def _repair_announcement(deps: Dependencies, folder: str, session: str, files: list[BlobInfo], newest: BlobInfo,
                         now: float) -> bool:
    """Announces the session again where it has no analysis of exactly `files`; True while it is not settled."""
    run = run_for_path(deps.state, folder)
    doc = deps.state.get(sessions_collection(run), state_key(session)) or {}
    if doc.get("kind") in CAPTURED_KINDS:
        return False  # xdiag captured it: the capture announces it and records what fails
    key = inputs_key(files)
    announced = doc.get("inputs_key") == key and doc.get("analysis_id")
    if announced and deps.state.get(ANALYSES, doc["analysis_id"]) is not None:
        return False  # analysed (or under way: the analyses' sweep watches it)
    repair_key = hashlib.sha256(f"{run}\n{session}\n{key}".encode()).hexdigest()[:24]
    record = deps.state.get(UPLOAD_REPAIRS, repair_key) or {}
    if record.get("gave_up"):
        return False
    if now - float(record.get("at_s") or 0.0) < deps.stage_deadline_s:
        return True  # repaired less than a deadline ago: the repair gets its chance
    repair = int(record.get("repairs") or 0) + 1
    if not deps.state.create(CLAIMS, f"{repair_key}.announce.{repair}", {"at": utc_now()}):
        return True  # another sweep is repairing it
    missing = (f"analysis {doc['analysis_id']} was announced but collect never recorded it" if announced else
               f"no analysis of its {len(files)} file(s) was announced (the upload's notification never reached "
               "register, or register stopped before the quiet period ended)")
    where = {"run_id": run, "session_id": session, "inputs_key": key, "missing": missing}
    if repair > deps.max_repairs:
        reason = f"never analysed after {repair - 1} repair(s): {missing}"
        deps.state.set(UPLOAD_REPAIRS, repair_key, {**where, "repairs": repair - 1, "at_s": now, "gave_up": True})
        deps.state.update(sessions_collection(run), state_key(session), {
            "run_id": run, "session_id": session, "status": "FAILED", "failure_reason": reason, "updated_at": utc_now()})
        deps.on_event("sweep", {"session": f"{run}/{session}", "failed": reason})
        return False
    deps.state.set(UPLOAD_REPAIRS, repair_key, {**where, "repairs": repair, "at_s": now, "at": utc_now()})
    if announced:
        deps.bus.publish(TOPIC_CAPTURES, CaptureReady(
            analysis_id=doc["analysis_id"], run_id=run, session_id=session, profile_uris=[f.uri for f in files],
            output_uri=output_uri(deps.profile_root, folder, session), investigator=deps.default_investigator,
            attempt=repair))
    else:
        deps.bus.publish(TOPIC_PROFILE_UPLOADS, ProfileUploaded(
            uri=newest.uri, generation=newest.generation, size=newest.size, attempt=repair))
    deps.on_event("sweep", {"session": f"{run}/{session}", "repair": repair, "missing": missing})
    return True


def _missing(deps: Dependencies, analysis: Analysis) -> str:
    """What the analysis waits for, in words, with the last error a stage raised on it (the real cause: a full disk,
    a service that refused)."""
    waiting = _waiting_for(deps, analysis)
    error = analysis.last_error or {}
    return f"{waiting}; last error on {error.get('topic')}: {error.get('error')}" if error.get("error") else waiting


def _waiting_for(deps: Dependencies, analysis: Analysis) -> str:
    if analysis.status == "RUNNING_TOOLS":
        done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
        lost = [tool for tool in BROAD_TOOLS if tool not in done]
        if lost:
            return f"{len(lost)} tool(s) never reported: {', '.join(lost)}"
        return "every tool reported but the fan-in never started the investigation"
    if analysis.status == "MAPPING_HOSTS":
        mapped = {key for key, _ in deps.state.list(host_maps_collection(analysis.analysis_id))}
        lost = [i["uri"].rsplit("/", 1)[-1] for i in analysis.inputs if host_file_key(recorded_input(i)) not in mapped]
        if lost:
            return f"{len(lost)} host file(s) never mapped: {', '.join(lost[:10])}{' …' if len(lost) > 10 else ''}"
        return "every host file was mapped but the session was never assembled"
    return {"PENDING": "collect never read the session", "INVESTIGATING": "the investigation never finished",
            "RENDERING": "the report was never written"}.get(analysis.status, analysis.status)


def _repair(deps: Dependencies, analysis: Analysis, repair: int) -> None:
    aid = analysis.analysis_id
    if analysis.status in ("PENDING", "MAPPING_HOSTS"):
        deps.bus.publish(TOPIC_CAPTURES, CaptureReady(
            analysis_id=aid, run_id=analysis.run_id, session_id=analysis.session_id,
            profile_uris=analysis.profile_uris, output_uri=analysis.output_uri, investigator=analysis.investigator,
            attempt=repair))
    elif analysis.status == "RUNNING_TOOLS":
        if not publish_tool_runs(deps, analysis, attempt=repair):
            if deps.state.get(CLAIMS, f"{aid}.investigate") is None:
                deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=aid, tool=BROAD_TOOLS[-1], attempt=repair))
            else:
                deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=aid, attempt=repair))
    elif analysis.status == "INVESTIGATING":
        deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=aid, attempt=repair))
    elif analysis.status == "RENDERING":
        deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=aid, attempt=repair))
