"""The sweeper (topic `sweeps`, every minute from Cloud Scheduler; every few seconds from the local stack's timer):
no analysis stays stuck.

A function killed mid-delivery, a message the emulator or Pub/Sub holds back, a fan-in whose claim was made but
whose message was lost: each leaves an analysis with no progress. Every active analysis has a deadline: its last
progress (its own last write, its newest tool result, its fan-in claim) plus `stage_deadline_s`. Past it (and at
most once per deadline), the sweeper repairs what is missing, as new messages (numbered by the repair, so the
publish-once keys let them through):

    PENDING          the CaptureReady again (collect reads the session and fans out)
    RUNNING_TOOLS    a ToolRun for every tool without a result; with all in, a ToolDone (the fan-in check) or,
                     where the fan-in was claimed already, the InvestigationReady
    INVESTIGATING    the InvestigationReady again (investigate keeps a diagnosis it has)
    RENDERING        the ReportReady again

After `max_repairs` repairs without the analysis finishing, it is FAILED with the reason (which stage, what was
missing), and the report says so. An analysis whose session moved on to newer files is marked SUPERSEDED instead.
Concurrent sweeps repair each analysis once: repair n is a create-if-absent claim.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from xdiag.model import Analysis, CaptureReady, InvestigationReady, ReportReady, SweepRequest, ToolDone, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.stages import fail_analysis, is_current, publish_tool_runs
from xdiag.pipeline.topics import (
    ACTIVE,
    ACTIVE_ANALYSES,
    ANALYSES,
    CLAIMS,
    TOPIC_CAPTURES,
    TOPIC_INVESTIGATIONS,
    TOPIC_REPORTS,
    TOPIC_TOOL_RESULTS,
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
    """When a stage last moved the analysis: its own last write, its newest tool result, its fan-in claim (a repair
    is no progress: an analysis the sweeper keeps repairing stays overdue until a stage moves it)."""
    moments = [epoch(analysis.get("updated_at")), epoch(analysis.get("created_at")),
               *(epoch(doc.get("finished_at")) for doc in tools), epoch((claim or {}).get("at"))]
    return max((m for m in moments if m is not None), default=0.0)


def overdue_s(state, analysis: dict[str, Any], deadline_s: float, now: float | None = None) -> float:
    """How far past its deadline an active analysis is (0 where it is not): what `xdiag status` shows."""
    if analysis.get("status") not in ACTIVE:
        return 0.0
    tools = [doc for _, doc in state.list(tools_collection(analysis["analysis_id"]))]
    claim = state.get(CLAIMS, f"{analysis['analysis_id']}.investigate")
    late = (now or time.time()) - last_progress(analysis, tools, claim) - deadline_s
    return max(late, 0.0)


def sweep(message: SweepRequest, deps: Dependencies) -> None:
    now = time.time()
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
        deps.state.update(ANALYSES, analysis.analysis_id, {
            "repairs": repair, "last_repair": {"at": utc_now(), "status": analysis.status, "missing": missing}})
        _repair(deps, analysis, repair)
        deps.on_event("sweep", {"analysis_id": analysis.analysis_id, "repair": repair, "missing": missing})


def _missing(deps: Dependencies, analysis: Analysis) -> str:
    """What the analysis waits for, in words."""
    if analysis.status == "RUNNING_TOOLS":
        done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
        lost = [tool for tool in BROAD_TOOLS if tool not in done]
        if lost:
            return f"{len(lost)} tool(s) never reported: {', '.join(lost)}"
        return "every tool reported but the fan-in never started the investigation"
    return {"PENDING": "collect never read the session", "INVESTIGATING": "the investigation never finished",
            "RENDERING": "the report was never written"}.get(analysis.status, analysis.status)


def _repair(deps: Dependencies, analysis: Analysis, repair: int) -> None:
    aid = analysis.analysis_id
    if analysis.status == "PENDING":
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
