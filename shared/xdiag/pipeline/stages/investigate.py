"""Stage `investigate` (`investigations` → `reports`): the health snapshot and the investigator's verdict, its
follow-up tool calls bounded in number and by the investigation's deadline (`FollowUps`)."""

from __future__ import annotations

import threading
import time
from typing import Any

from xdiag.investigators import MAX_FOLLOW_UP_CALLS, checked_verdict, health_snapshot
from xdiag.investigators.source_lines import with_source_lines
from xdiag.model import Analysis, FollowUpCall, InvestigationReady, ReportReady, ToolResult, ToolStatus, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.stages.analysis_record import analysis_session, is_current, load_analysis, save_analysis
from xdiag.pipeline.stages.tool_runs import load_results, store_result
from xdiag.pipeline.topics import TOPIC_REPORTS
from xdiag.profile.space import Session
from xdiag.tools import FOLLOW_UP_TOOLS, REGISTRY
from xdiag.tools import run_tool as execute_tool
from xdiag.tools.registry import validate_args


class FollowUps:
    """The follow-up calls of one investigation: unknown tools and bad arguments refused before they are charged,
    at most MAX_FOLLOW_UP_CALLS run, each inside what is left of the investigation's deadline."""

    def __init__(self, deps: Dependencies, analysis: Analysis, session: Session, deadline_s: float) -> None:
        self.deps, self.analysis, self.session = deps, analysis, session
        self.deadline_s, self.started = deadline_s, time.monotonic()
        self.refused: list[FollowUpCall] = []
        self.made = 0

    def _refuse(self, name: str, args: dict[str, Any], hypothesis: str, reason: str) -> ToolResult:
        self.refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                         reason=reason))
        return ToolResult(tool=name, status=ToolStatus.FAILED, reason=reason)

    def __call__(self, name: str, args: dict[str, Any], hypothesis: str) -> ToolResult | None:
        if name not in FOLLOW_UP_TOOLS:
            return self._refuse(name, args, hypothesis, f"refused: {name!r} is not a follow-up tool")
        try:  # a call with bad arguments is refused before it spends any of the budget
            validate_args(REGISTRY[name], args)
        except ValueError as exc:
            return self._refuse(name, args, hypothesis, f"refused: bad arguments: {exc}")
        if self.made >= MAX_FOLLOW_UP_CALLS:
            self._refuse(name, args, hypothesis, f"refused: the limit of {MAX_FOLLOW_UP_CALLS} follow-up calls is reached")
            return None
        left = self.deadline_s - (time.monotonic() - self.started)
        if left <= 0:
            return self._refuse(name, args, hypothesis,
                                f"refused: the investigation's deadline of {self.deadline_s:g} s has passed")
        self.made += 1
        result = self._run_within(name, args, left)
        store_result(self.deps, self.analysis, result, f"followup-{self.made}-{name}")
        self.deps.on_event("follow_up", {"tool": name, "status": result.status.value})
        return result

    def _run_within(self, name: str, args: dict[str, Any], left: float) -> ToolResult:
        """The tool in a worker thread, waited for no longer than the deadline allows; past it the call is answered
        as failed and the investigation goes on without it (the thread finishes on its own, its result unused)."""
        outcome: list[ToolResult] = []
        worker = threading.Thread(target=lambda: outcome.append(execute_tool(self.session, name, args)),
                                  name=f"follow-up {name}", daemon=True)
        worker.start()
        worker.join(left)
        if outcome:
            return outcome[0]
        return ToolResult(tool=name, status=ToolStatus.FAILED, args=args, duration_ms=left * 1000,
                          reason=f"stopped: still running at the investigation's deadline of {self.deadline_s:g} s")


def investigate(message: InvestigationReady, deps: Dependencies) -> None:
    """Health snapshot → OPTIMAL, or hypotheses with at most MAX_FOLLOW_UP_CALLS follow-up tools → findings."""
    analysis = load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.status == "SUPERSEDED" or not is_current(deps, analysis):
        return
    if analysis.diagnosis is None and analysis.status != "FAILED":
        started = time.perf_counter()
        results = load_results(deps, analysis)
        health = health_snapshot(results)
        follow_ups = FollowUps(deps, analysis, analysis_session(deps, analysis, events=True),
                               deps.investigation_deadline_s)
        chosen = analysis.investigator if analysis.investigator in deps.investigators else "rules"
        investigator = deps.investigators[chosen]()
        diagnosis = with_source_lines(checked_verdict(investigator.investigate(health, results, follow_ups), health, results),
                                      results)
        diagnosis.follow_up_calls.extend(follow_ups.refused)
        if chosen != analysis.investigator and not diagnosis.investigator_note:
            diagnosis.investigator_note = f"investigator {analysis.investigator!r} is not configured; used the rule engine"
        analysis.health = health.as_dict()
        analysis.diagnosis = diagnosis
        analysis.result = diagnosis.status
        analysis.status = "RENDERING"
        analysis.tools = {t: {"status": r.status.value, "reason": r.reason, "duration_ms": round(r.duration_ms, 2)} for t, r in results.items()}
        analysis.timings_ms["tools"] = round(sum(r.duration_ms for r in results.values()), 1)
        analysis.timings_ms["investigate"] = round((time.perf_counter() - started) * 1000, 1)
        analysis.timeline["investigate"] = utc_now()
        save_analysis(deps, analysis)
        deps.on_event("investigate", {"status": diagnosis.status.value, "findings": len(diagnosis.findings)})
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id, attempt=message.attempt))
