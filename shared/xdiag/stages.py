"""The pipeline's stages: collect → run_tool ×15 → aggregate → investigate → render.

Each stage is a handler `(message, deps)` that reads and writes through the ports and
publishes the next message. The same handlers run in-process for `xdiag analyze` and
behind Cloud Functions in the cloud. Every handler is idempotent: Pub/Sub delivers at
least once, so a second delivery finds its work done and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from xdiag.errors import ProfileError, UnknownTool
from xdiag.investigators import RuleEngine, health_snapshot
from xdiag.model import (
    Analysis,
    CaptureReady,
    Diagnosis,
    FollowUpCall,
    InvestigationReady,
    ReportReady,
    Status,
    ToolDone,
    ToolResult,
    ToolRun,
    ToolStatus,
    utc_now,
)
from xdiag.ports import BlobStore, Bus, StateStore
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES, read_session
from xdiag.profile.space import Session
from xdiag.tools import BROAD_TOOLS, FOLLOW_UP_TOOLS, REGISTRY
from xdiag.tools import run_tool as execute_tool
from xdiag.tools.registry import validate_args

MAX_FOLLOW_UP_CALLS = 4

TOPIC_CAPTURES = "captures"
TOPIC_TOOL_RUNS = "tool-runs"
TOPIC_TOOL_RESULTS = "tool-results"
TOPIC_INVESTIGATIONS = "investigations"
TOPIC_REPORTS = "reports"

ANALYSES = "analyses"
CLAIMS = "claims"


def tools_collection(analysis_id: str) -> str:
    return f"{ANALYSES}/{analysis_id}/tools"


class Investigator(Protocol):
    name: str

    def investigate(
        self,
        health: dict[str, Any],
        results: dict[str, ToolResult],
        call_tool: Callable[[str, dict[str, Any], str], ToolResult | None],
    ) -> Diagnosis: ...


class SessionLoader:
    """Reads a session's files once and keeps the most recent sessions in memory."""

    def __init__(self, blobs: BlobStore, max_bytes: int = DEFAULT_MAX_PROFILE_BYTES, keep: int = 2, progress=None):
        self._blobs, self._max_bytes, self._keep, self._progress = blobs, max_bytes, keep, progress
        self._sessions: dict[tuple[str, ...], Session] = {}
        self.read_ms: dict[tuple[str, ...], float] = {}

    def load(self, uris: list[str], name: str) -> Session:
        key = tuple(uris)
        if key not in self._sessions:
            started = time.perf_counter()
            try:
                paths = [self._blobs.local_path(uri) for uri in uris]
            except FileNotFoundError as exc:
                raise ProfileError(f"profile object missing: {exc}") from None
            session = read_session(paths, name=name, max_bytes=self._max_bytes, progress=self._progress)
            while len(self._sessions) >= self._keep:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[key] = session
            self.read_ms[key] = (time.perf_counter() - started) * 1000
        return self._sessions[key]


@dataclass
class Dependencies:
    bus: Bus
    blobs: BlobStore
    state: StateStore
    sessions: SessionLoader
    investigators: dict[str, Callable[[], Investigator]] = field(default_factory=lambda: {"rules": RuleEngine})
    on_event: Callable[[str, dict[str, Any]], None] = lambda stage, info: None  # progress reporting


def _join(prefix: str, name: str) -> str:
    return prefix.rstrip("/") + "/" + name


def _load_analysis(deps: Dependencies, analysis_id: str) -> Analysis | None:
    doc = deps.state.get(ANALYSES, analysis_id)
    return Analysis.model_validate(doc) if doc else None


def _save(deps: Dependencies, analysis: Analysis) -> None:
    analysis.updated_at = utc_now()
    deps.state.set(ANALYSES, analysis.analysis_id, analysis.model_dump(mode="json"))


def describe(session: Session) -> dict[str, Any]:
    return {
        "platform": session.platform,
        "hosts": [h.hostname for h in session.hosts],
        "files": [str(h.path.name) for h in session.hosts],
        "devices": len(session.device_planes()) or None,
        "devices_with_events": len(session.device_planes(with_events=True)) or None,
        "size_bytes": session.size_bytes,
        "events": session.event_count,
        "hlo_modules": len(session.hlo_modules),
        "warnings": [w for h in session.hosts for w in h.warnings][:5],
    }


def collect(message: CaptureReady, deps: Dependencies) -> None:
    """Fan-out: record the analysis, read the session once, publish one ToolRun per broad tool."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        fresh = Analysis(
            analysis_id=message.analysis_id, run_id=message.run_id, session_id=message.session_id,
            profile_uris=message.profile_uris, output_uri=message.output_uri, investigator=message.investigator,
        )
        deps.state.create(ANALYSES, message.analysis_id, fresh.model_dump(mode="json"))
        analysis = _load_analysis(deps, message.analysis_id)
    if analysis.status in ("DONE", "FAILED"):
        return
    started = time.perf_counter()
    try:
        session = deps.sessions.load(analysis.profile_uris, analysis.session_id)
    except ProfileError as exc:
        analysis.status, analysis.result, analysis.failure_reason = "FAILED", Status.FAILED, str(exc)
        _save(deps, analysis)
        deps.on_event("collect", {"failed": str(exc)})
        deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id))
        return
    analysis.profile = describe(session)
    analysis.status = "RUNNING_TOOLS"
    analysis.timings_ms["read"] = round(deps.sessions.read_ms.get(tuple(analysis.profile_uris), 0.0), 1)
    analysis.timings_ms["collect"] = round((time.perf_counter() - started) * 1000, 1)
    _save(deps, analysis)
    deps.on_event("collect", analysis.profile)
    done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    for tool in BROAD_TOOLS:
        if tool not in done:
            deps.bus.publish(TOPIC_TOOL_RUNS, ToolRun(analysis_id=analysis.analysis_id, tool=tool))


def _store_result(deps: Dependencies, analysis: Analysis, result: ToolResult, name: str) -> str:
    uri = _join(analysis.output_uri, f"tools/{name}.json")
    deps.blobs.put(uri, result.model_dump_json(indent=2).encode(), "application/json")
    return uri


def run_tool(message: ToolRun, deps: Dependencies) -> None:
    """Runs one tool on the session and stores its result; a second delivery only re-announces it."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    collection = tools_collection(analysis.analysis_id)
    if deps.state.get(collection, message.tool) is None:
        try:
            session = deps.sessions.load(analysis.profile_uris, analysis.session_id)
            result = execute_tool(session, message.tool, message.args)
        except (ProfileError, UnknownTool) as exc:
            result = ToolResult(tool=message.tool, status=ToolStatus.FAILED, reason=str(exc))
        uri = _store_result(deps, analysis, result, message.tool)
        deps.state.set(
            collection,
            message.tool,
            {"status": result.status.value, "reason": result.reason, "summary": result.summary, "uri": uri,
             "duration_ms": round(result.duration_ms, 2), "source": result.source},
        )
        deps.on_event("run_tool", {"tool": message.tool, "status": result.status.value, "duration_ms": result.duration_ms})
    deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=message.tool))


def aggregate(message: ToolDone, deps: Dependencies) -> None:
    """Fan-in: when every broad tool has a result, claim the investigation exactly once."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None or analysis.status in ("DONE", "FAILED"):
        return
    done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    if not set(BROAD_TOOLS) <= done:
        return
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.investigate", {"at": utc_now()}):
        deps.on_event("aggregate", {"tools": len(done)})
        deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=analysis.analysis_id))


def load_results(deps: Dependencies, analysis: Analysis) -> dict[str, ToolResult]:
    results = {}
    for tool, doc in deps.state.list(tools_collection(analysis.analysis_id)):
        if doc.get("uri") and deps.blobs.exists(doc["uri"]):
            results[tool] = ToolResult.model_validate_json(deps.blobs.get(doc["uri"]))
    return results


def investigate(message: InvestigationReady, deps: Dependencies) -> None:
    """Health snapshot → OPTIMAL, or hypotheses with at most MAX_FOLLOW_UP_CALLS follow-up tools → findings."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.diagnosis is None and analysis.status != "FAILED":
        started = time.perf_counter()
        results = load_results(deps, analysis)
        health = health_snapshot(results)
        session = deps.sessions.load(analysis.profile_uris, analysis.session_id)
        refused: list[FollowUpCall] = []
        made: list[int] = [0]

        def call_tool(name: str, args: dict[str, Any], hypothesis: str) -> ToolResult | None:
            if name not in FOLLOW_UP_TOOLS:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: {name!r} is not a follow-up tool"))
                return ToolResult(tool=name, status=ToolStatus.FAILED, reason=refused[-1].reason)
            try:  # a call with bad arguments is refused before it spends any of the budget
                validate_args(REGISTRY[name], args)
            except ValueError as exc:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: bad arguments: {exc}"))
                return ToolResult(tool=name, status=ToolStatus.FAILED, reason=refused[-1].reason)
            if made[0] >= MAX_FOLLOW_UP_CALLS:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: the limit of {MAX_FOLLOW_UP_CALLS} follow-up calls is reached"))
                return None
            made[0] += 1
            result = execute_tool(session, name, args)
            _store_result(deps, analysis, result, f"followup-{made[0]}-{name}")
            deps.on_event("follow_up", {"tool": name, "status": result.status.value})
            return result

        chosen = analysis.investigator if analysis.investigator in deps.investigators else "rules"
        investigator = deps.investigators[chosen]()
        diagnosis = investigator.investigate(health, results, call_tool)
        diagnosis.follow_up_calls.extend(refused)
        if chosen != analysis.investigator and not diagnosis.investigator_note:
            diagnosis.investigator_note = f"investigator {analysis.investigator!r} is not configured; used the rule engine"
        analysis.health = health
        analysis.diagnosis = diagnosis
        analysis.result = diagnosis.status
        analysis.status = "RENDERING"
        analysis.tools = {t: {"status": r.status.value, "reason": r.reason, "duration_ms": round(r.duration_ms, 2)} for t, r in results.items()}
        analysis.timings_ms["tools"] = round(sum(r.duration_ms for r in results.values()), 1)
        analysis.timings_ms["investigate"] = round((time.perf_counter() - started) * 1000, 1)
        _save(deps, analysis)
        deps.on_event("investigate", {"status": diagnosis.status.value, "findings": len(diagnosis.findings)})
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id))


def render(message: ReportReady, deps: Dependencies) -> None:
    """Writes summary.html and analysis.json next to the profile; marks the analysis DONE (or FAILED)."""
    from xdiag.report import render_summary_html

    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    started = time.perf_counter()
    results = load_results(deps, analysis)
    report_uri = _join(analysis.output_uri, "summary.html")
    analysis.report_uri = report_uri
    if analysis.status != "FAILED":
        analysis.status = "DONE"
    html = render_summary_html(analysis, results)
    deps.blobs.put(report_uri, html.encode(), "text/html; charset=utf-8")
    analysis.timings_ms["render"] = round((time.perf_counter() - started) * 1000, 1)
    deps.blobs.put(_join(analysis.output_uri, "analysis.json"), analysis.model_dump_json(indent=2).encode(), "application/json")
    _save(deps, analysis)
    deps.on_event("render", {"report": report_uri, "status": analysis.status})


HANDLERS: dict[str, tuple[type, Callable[[Any, Dependencies], None]]] = {
    TOPIC_CAPTURES: (CaptureReady, collect),
    TOPIC_TOOL_RUNS: (ToolRun, run_tool),
    TOPIC_TOOL_RESULTS: (ToolDone, aggregate),
    TOPIC_INVESTIGATIONS: (InvestigationReady, investigate),
    TOPIC_REPORTS: (ReportReady, render),
}
"""Topic -> (message type, handler): the wiring every bus adapter uses."""
