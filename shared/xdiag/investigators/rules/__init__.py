"""The rule engine: a deterministic investigator that needs no network.

Each rule (one per finding, registered with `@rule` in the family modules below) reads the health snapshot and the
broad tools' outputs, and when its signal is present forms a hypothesis with a score (the share of step or op time
at stake). The strongest hypotheses get the follow-up tool calls (at most four, counted by the caller), and each
becomes a finding whose evidence quotes tool outputs by name.
"""

from __future__ import annotations

from xdiag.analysis.roofline import MEMORY_BOUND_FINDING_MIN_PERCENT
from xdiag.investigators.health import DOMINANT_EFFICIENCY_MIN_PERCENT, HealthSnapshot
# The family modules register their rules on import.
from xdiag.investigators.rules import (  # noqa: F401
    collectives, compiler, components, host, idioms, kernels, memory, roofline, transfers)
from xdiag.investigators.rules.host import with_profiler_caveat
from xdiag.investigators.rules.hypothesis import CallTool, Hypothesis
from xdiag.investigators.rules.hypothesis import summary as tool_summary
from xdiag.investigators.rules.ranking import MIN_FINDING_PERCENT, by_realisable_gain, ranked
from xdiag.investigators.rules.registry import Facts, ordered_rules
from xdiag.investigators.source_lines import HOST_EVENT_FINDINGS, LINE_VIEW, host_source_lines
from xdiag.model import Diagnosis, FollowUpCall, Status, ToolResult

__all__ = ["CallTool", "Hypothesis", "RuleEngine", "hypotheses"]


def hypotheses(health: HealthSnapshot, results: dict[str, ToolResult]) -> list[Hypothesis]:
    """Every registered rule's hypothesis, in RULE_ORDER, reconciled and ranked; none without a step trace; and
    where the health check finds a reason and no rule its cause, the finding that says what is measured."""
    facts = Facts(health, results)
    if not facts.step:
        return []
    found: list[Hypothesis] = []
    for rule in ordered_rules():
        formed = rule(facts, found)
        found.extend(formed if isinstance(formed, list) else [formed] if formed is not None else [])
    found = idioms.superseded(found)
    with_profiler_caveat(facts, found)
    out = ranked(found, facts.breakdown, facts.step_ms, facts.step)
    if not out and not health.healthy:  # never NEEDS_ATTENTION without a finding
        out = [components.unexplained(facts)]
    return out


def _roofline_sentence(health: HealthSnapshot) -> str:
    """How well the device's ops use it while they run, beside XProf's window figure when that differs."""
    efficiency, bound = health.roofline_efficiency_percent, health.bound_by
    if efficiency is None or not bound:
        return ""
    peaks = health.peaks
    device_model = peaks.device_model if peaks else None
    flops_source = peaks.flops_source if peaks and peaks.flops_source is not None else "profile"
    at_most = "at most " if health.dominant_ops_efficiency_is_upper_bound else ""
    text = (f"While they run, the device's ops reach {at_most}{efficiency}% of their "
            f"{'compute' if bound == 'compute' else 'bandwidth'} roof ({device_model or 'device'} peaks from the "
            f"{str(flops_source).split(' (')[0]})"
            + ("; an upper bound: the busiest kernels' costs assume full pages" if at_most else ""))
    xprof = health.xprof_roofline_efficiency_percent
    if xprof is not None and abs(xprof - efficiency) > max(5.0, 0.2 * efficiency):
        text += (f"; XProf's {xprof}% is over the capture window, idle included, with its own FLOP counts "
                 "(get_roofline_model's xprof_note reconciles the two)")
    return text + ". "


def _flags_not_findings(health: HealthSnapshot, keys: set[str]) -> str:
    """The health flags the report shows that are not findings, each with why: a flag never stands unexplained."""
    notes = []
    low, compute = health.low_intensity_op_percent, health.breakdown_percent.get("compute", 0.0)
    if low is not None:
        low = round(low + (health.memory_wait_percent or 0), 2)  # waits for HBM prefetches count with them
    if health.memory_bound_is_defect and "memory_bound" not in keys:
        passes = health.memory_passes
        flag = f"the op profile's memory-bound defect ({low}% of op time" + (f", {passes:g} passes" if passes and passes > 1 else "") + ")"
        if (low or 0) < MEMORY_BOUND_FINDING_MIN_PERCENT:
            notes.append(f"{flag} is not a finding: under the {MEMORY_BOUND_FINDING_MIN_PERCENT:g}% of op time at which "
                         "it becomes one")
        elif compute < 30:
            notes.append(f"{flag} is not a finding: the devices compute only {compute}% of the step, so op time is "
                         "not where the step's time goes")
        elif "materialised_attention" in keys:
            notes.append(f"{flag} is not a finding of its own: the materialised attention finding covers the "
                         "memory-bound ops that read and write its scores")
    efficiency = health.dominant_ops_roofline_efficiency_percent
    if efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT and "low_kernel_efficiency" not in keys:
        covered = keys & {"memory_bound", "memory_transfers"}
        notes.append(f"the busiest ops' {efficiency}% of their roofline is not a finding of its own: "
                     + (f"the {' and '.join(sorted(covered)).replace('_', ' ')} finding covers the same ops" if covered
                        else f"the time it could recover is under {MIN_FINDING_PERCENT:g}% of the step"))
    return ("Not findings: " + "; ".join(notes) + ". ") if notes else ""


class RuleEngine:
    """Deterministic investigator: rules over the tool outputs, no network."""

    name = "rules"

    def investigate(self, health: HealthSnapshot, results: dict[str, ToolResult], call_tool: CallTool) -> Diagnosis:
        if health.healthy:
            b = health.breakdown_percent
            return Diagnosis(
                status=Status.OPTIMAL,
                summary=(
                    f"The workload is healthy: over {health.steps} {'step' if health.steps == 1 else 'steps'} of "
                    f"{health.step_time_ms:.4g} ms the "
                    f"devices compute {b.get('compute')}% of the time, with {b.get('host_other', 0)}% host work, "
                    f"{b.get('collective', 0)}% collectives and {b.get('compile', 0)}% compilation. "
                    f"The busiest op is {health.top_op} ({health.top_op_share_percent}% of op time, "
                    f"{health.top_category}). " + _roofline_sentence(health)
                    + _flags_not_findings(health, set()) + "No follow-up investigation was needed."
                ),
                investigator=self.name,
            )
        found = hypotheses(health, results)
        calls: list[FollowUpCall] = []
        for hypothesis in found:
            if hypothesis.follow_up is None:
                continue
            name, args = hypothesis.follow_up
            result = call_tool(name, args, hypothesis.title)
            if result is None:
                break  # the follow-up budget is spent
            calls.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis.title, status=result.status, reason=result.reason))
            if result.ok and hypothesis.extra_evidence:
                hypothesis.evidence.extend(hypothesis.extra_evidence(result))
            if hypothesis.key in HOST_EVENT_FINDINGS:  # host time is in no HLO: the Python frames around it
                traced = tool_summary(results, "get_step_trace").get("python_tracer_events_per_step")
                framework = tool_summary(results, "get_device_information").get("framework")
                hypothesis.host_lines, hypothesis.no_host_line = host_source_lines(
                    hypothesis.key, result, (health.step_time_ms or 0) * (health.steps or 0), bool(traced), framework,
                    results.get(LINE_VIEW))
        components.with_levers(found, Facts(health, results))  # each fix led by the lever that fits the program
        found = by_realisable_gain(found)
        findings = [h.finding() for h in found]
        reasons = health.unhealthy_because
        if not findings or [f.key for f in findings] == ["measured_not_explained"]:
            summary = (
                "Not OPTIMAL: " + "; ".join(reasons) + ". No rule matched a known bottleneck pattern strongly enough "
                "to name its cause; the finding below says what is measured and which capture would tell more."
            )
        else:
            top = findings[0]
            b = health.breakdown_percent
            summary = (
                f"{len(findings)} {'issue' if len(findings) == 1 else 'issues'} found; the biggest: "
                f"{top.title[:1].lower() + top.title[1:]} ({top.priority}). "
                f"Steps take {health.step_time_ms:.4g} ms, of which the devices compute {b.get('compute')}%. "
                + _roofline_sentence(health)
                + (f"Also: {', '.join(f.title.lower() for f in findings[1:3])}. " if len(findings) > 1 else "")
                + _flags_not_findings(health, {f.key for f in findings})
                + (f"{len(calls)} follow-up {'call' if len(calls) == 1 else 'calls'} to the tools gathered the "
                   "evidence below." if calls else "")
            )
        return Diagnosis(
            status=Status.NEEDS_ATTENTION,
            summary=summary,
            findings=findings,
            hypotheses=[f"{h.title} (score {h.score:.1f})" for h in found],
            follow_up_calls=calls,
            investigator=self.name,
        )
