"""What changed between two analysed sessions: a before/after regression report from the analyses' own outputs.

XProf CLI's `diff_sessions` compares total device time and per-kernel totals (kernel stats, KPIs, HLO stats);
HTA's TraceDiff compares op counts and durations between two traces. This goes per step (two captures rarely hold
the same number of steps), splits the step-time change by category (compute, host sync, input, …), ranks the ops
and kernels that got slower or faster, compares the memory peak, and diffs the diagnosis itself: findings that
appeared, went away, or changed priority.

Every number comes from the two analyses' tool outputs (`tools/<tool>.json`, `analysis.json`); where one side has
no data the comparison says so with the tool's reason, never a guessed number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from xdiag.analysis.line_view import NO_LINE
from xdiag.compare.findings import FindingOutcome, finding_outcomes
from xdiag.compare.lines import LinesDiff, lines_diff
from xdiag.compare.steps import LAST_STEP_NOTE, StepTest, compare_steps, start_to_start, trace_step_ms

STEP_TOOL, OPS_TOOL, KERNEL_TOOL, MEMORY_TOOL = "get_step_trace", "get_hlo_op_profile", "get_kernel_stats", "get_memory_profile"
DEVICE_TOOL, ANATOMY_TOOL = "get_device_information", "get_program_anatomy"
HEADLINE_OP_STEP_SHARE = 0.01  # an op gone or new is named in the headline from 1% of its side's mean step


@dataclass
class SessionOutputs:
    """One analysed session: its analysis.json and the tool outputs it wrote (by tool name)."""

    label: str  # what the user named it (a folder, RUN/SESSION)
    analysis: dict[str, Any]
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tool(self, name: str) -> dict[str, Any] | None:
        return self.tools.get(name)


class SessionRef(BaseModel):
    label: str
    run_id: str | None = None
    session_id: str | None = None
    analysis_id: str | None = None
    status: str | None = None  # OPTIMAL | NEEDS_ATTENTION | FAILED
    report_uri: str | None = None
    platform: str | None = None
    device: str | None = None  # the device model (TPU v5e, NVIDIA H200), where the profile says
    steps: int | None = None


class Change(BaseModel):
    """One number on both sides. `delta` = candidate − baseline; `significant` says whether it stands out of the
    step-to-step noise both captures show (None where the noise is unknown)."""

    unit: str
    baseline: float | None = None
    candidate: float | None = None
    delta: float | None = None
    delta_percent: float | None = None
    significant: bool | None = None
    available: bool = True
    reason: str = ""
    source: str = ""


class CategoryChange(BaseModel):
    category: str
    baseline_ms: float
    candidate_ms: float
    delta_ms: float
    share_of_change_percent: float | None = None  # this category's part of the step-time change


class OpChange(BaseModel):
    name: str
    category: str = ""
    modules: list[str] = Field(default_factory=list)
    baseline_ms_per_step: float
    candidate_ms_per_step: float
    delta_ms_per_step: float
    baseline_runs_per_step: float
    candidate_runs_per_step: float
    status: str  # slower | faster | appeared | gone


class OpsDiff(BaseModel):
    """Ops (HLO ops) or kernels, per step: the largest changes first."""

    available: bool = True
    reason: str = ""
    source: str = ""
    baseline_ms_per_step: float | None = None
    candidate_ms_per_step: float | None = None
    slower: list[OpChange] = Field(default_factory=list)
    faster: list[OpChange] = Field(default_factory=list)
    appeared: list[OpChange] = Field(default_factory=list)
    gone: list[OpChange] = Field(default_factory=list)
    note: str = ""


class FindingRef(BaseModel):
    key: str
    title: str
    priority: str


class FindingChange(BaseModel):
    key: str
    title: str
    baseline_priority: str
    candidate_priority: str


class FindingsDiff(BaseModel):
    baseline_status: str | None = None
    candidate_status: str | None = None
    appeared: list[FindingRef] = Field(default_factory=list)
    gone: list[FindingRef] = Field(default_factory=list)
    changed: list[FindingChange] = Field(default_factory=list)  # same finding, another priority
    kept: list[FindingRef] = Field(default_factory=list)


class SessionDiff(BaseModel):
    """diff.json: the answer first (verdict, headline, the step test, the findings' outcomes, the lines that moved),
    then the two sessions and the detail."""

    version: int = 2
    verdict: str  # faster | slower | no_change | not_enough_steps | not_comparable (StepTest's, or why none)
    refused_because: str = ""  # the two captures are of other platforms, devices or programs: no verdict at all
    headline: list[str]  # a few plain sentences, every number from below
    step_test: StepTest  # each side's steps with its interval, the change's interval, the realized gain
    outcomes: list[FindingOutcome] = Field(default_factory=list)  # each finding of the baseline: gone, smaller, …
    lines: LinesDiff = Field(default_factory=LinesDiff)  # the user's lines whose device time moved most
    baseline: SessionRef
    candidate: SessionRef
    baseline_role: str = ""  # in the pipeline: "previous session" or "last healthy session" (xdiag.pipeline.previous)
    step_time: Change
    breakdown: list[CategoryChange] = Field(default_factory=list)
    ops: OpsDiff
    kernels: OpsDiff
    memory_peak: Change
    findings: FindingsDiff


def _summary(outputs: SessionOutputs, tool: str) -> dict[str, Any] | None:
    result = outputs.tool(tool)
    return result.get("summary") if result and result.get("status") == "ok" else None


def _why_missing(outputs: SessionOutputs, tool: str) -> str:
    result = outputs.tool(tool)
    if result is None:
        return f"{outputs.label}: the analysis holds no {tool} output (the tool was not run)"
    return f"{outputs.label}: {tool} {result.get('status')}: {result.get('reason') or 'no reason given'}"


def _ref(outputs: SessionOutputs) -> SessionRef:
    a = outputs.analysis
    steps = (_summary(outputs, STEP_TOOL) or {}).get("steps")
    return SessionRef(
        label=outputs.label, run_id=a.get("run_id"), session_id=a.get("session_id"), analysis_id=a.get("analysis_id"),
        status=a.get("result") or a.get("status"), report_uri=a.get("report_uri"),
        platform=(a.get("health") or {}).get("platform") or (a.get("profile") or {}).get("platform"),
        device=(_summary(outputs, DEVICE_TOOL) or {}).get("device_model"),
        steps=steps if isinstance(steps, int) else None,
    )


def _program_files(outputs: SessionOutputs) -> set[str]:
    """The files of the user's lines that hold device time (their names: a checkout moved between two captures
    keeps them), from the line view; none where it names no user line."""
    rows = ((outputs.tool("get_line_view") or {}).get("detail") or {}).get("lines") or []
    return {str(row["line"]).rsplit(":", 1)[0].rsplit("/", 1)[-1] for row in rows
            if isinstance(row, dict) and row.get("line") and row["line"] != NO_LINE and not row.get("library")
            and isinstance(row.get("self_ms"), (int, float)) and row["self_ms"] > 0}


def incomparable(a: SessionOutputs, b: SessionOutputs) -> str:
    """Why a step-time verdict between these two captures would mean nothing, or "": they ran on other platforms or
    devices, or are other programs (another framework, training against inference, or no file of the user's code
    holding device time in both). A fix keeps all of these (40 TPU captures of 12 programs and their fixes: each
    program's files, framework and phase the same before and after)."""
    ra, rb = _ref(a), _ref(b)
    for what, va, vb in (("platforms", ra.platform, rb.platform), ("devices", ra.device, rb.device)):
        if va and vb and va != vb:
            on_a, on_b = (f"{ref.platform} ({ref.device})" if ref.device else ref.platform for ref in (ra, rb))
            return f"the {what} differ: {a.label} ran on {on_a}, {b.label} on {on_b}"
    pa, pb = _summary(a, ANATOMY_TOOL) or {}, _summary(b, ANATOMY_TOOL) or {}
    for what, key in (("framework", "framework"), ("kind of program", "phase")):
        if pa.get(key) and pb.get(key) and pa[key] != pb[key]:
            return f"the programs differ: {a.label} is {pa[key]}, {b.label} {pb[key]} (its {what})"
    fa, fb = _program_files(a), _program_files(b)
    if fa and fb and not fa & fb:
        return (f"the programs differ: no file holds device time in both ({a.label}: {', '.join(sorted(fa)[:3])}; "
                f"{b.label}: {', '.join(sorted(fb)[:3])})")
    return ""


def _change(unit: str, before: float, after: float, source: str, noise: float | None = None) -> Change:
    delta = after - before
    return Change(
        unit=unit, baseline=round(before, 4), candidate=round(after, 4), delta=round(delta, 4),
        delta_percent=round(100 * delta / before, 2) if before else None,
        significant=None if noise is None else abs(delta) > noise, source=source,
    )


def _step_time(a: SessionOutputs, b: SessionOutputs) -> Change:
    """The mean step time (every step) on each side; whether its change is significant is the step test's."""
    sa, sb = _summary(a, STEP_TOOL), _summary(b, STEP_TOOL)
    if not sa or not sb or sa.get("step_time_ms_mean") is None or sb.get("step_time_ms_mean") is None:
        reason = _why_missing(a, STEP_TOOL) if not sa else _why_missing(b, STEP_TOOL)
        return Change(unit="ms", available=False, reason=reason, source=STEP_TOOL)
    return _change("ms", sa["step_time_ms_mean"], sb["step_time_ms_mean"], STEP_TOOL)


def _category_ms(summary: dict[str, Any], categories: list[str]) -> dict[str, float]:
    step = summary.get("step_time_ms_mean") or 0.0
    return {c: step * (summary.get(f"{c}_percent") or 0.0) / 100 for c in categories}


def _breakdown(a: SessionOutputs, b: SessionOutputs, step: Change) -> list[CategoryChange]:
    sa, sb = _summary(a, STEP_TOOL), _summary(b, STEP_TOOL)
    if not step.available or not sa or not sb:
        return []
    categories = []
    for outputs in (a, b):
        for name in ((outputs.tool(STEP_TOOL) or {}).get("detail") or {}).get("categories") or []:
            if name not in categories:
                categories.append(name)
    before, after = _category_ms(sa, categories), _category_ms(sb, categories)
    rows = []
    for c in categories:
        delta = after[c] - before[c]
        if not before[c] and not after[c]:
            continue  # neither side spent time there
        rows.append(CategoryChange(
            category=c, baseline_ms=round(before[c], 4), candidate_ms=round(after[c], 4), delta_ms=round(delta, 4),
            share_of_change_percent=round(100 * delta / step.delta, 1) if step.delta else None,
        ))
    return sorted(rows, key=lambda r: -abs(r.delta_ms))


@dataclass
class _Row:
    ms: float = 0.0
    runs: float = 0.0
    category: str = ""
    modules: set[str] = field(default_factory=set)


def _rows(outputs: SessionOutputs, tool: str, list_key: str, name_key: str, count_key: str,
          module_key: str | None) -> dict[str, _Row] | None:
    result = outputs.tool(tool)
    if not result or result.get("status") != "ok":
        return None
    rows: dict[str, _Row] = {}
    # Keyed by name alone: a fixed program often has another module name (jit_step → jit_step_fixed) while its
    # ops keep theirs; the modules are listed beside each row.
    for item in (result.get("detail") or {}).get(list_key) or []:
        name = item.get(name_key)
        if not name:
            continue
        row = rows.setdefault(name, _Row(category=item.get("category") or ""))
        row.ms += float(item.get("total_ms") or 0.0)
        row.runs += float(item.get(count_key) or 0)
        module = item.get(module_key) if module_key else None
        if module:
            row.modules.add(module)
    return rows


def _ops_diff(a: SessionOutputs, b: SessionOutputs, tool: str, list_key: str, name_key: str, count_key: str,
              module_key: str | None, top: int) -> OpsDiff:
    rows_a = _rows(a, tool, list_key, name_key, count_key, module_key)
    rows_b = _rows(b, tool, list_key, name_key, count_key, module_key)
    if rows_a is None or rows_b is None:
        return OpsDiff(available=False, source=tool,
                       reason=_why_missing(a, tool) if rows_a is None else _why_missing(b, tool))
    steps_a = (_summary(a, STEP_TOOL) or {}).get("steps") or 0
    steps_b = (_summary(b, STEP_TOOL) or {}).get("steps") or 0
    per_step = bool(steps_a and steps_b)
    div_a, div_b = (steps_a, steps_b) if per_step else (1, 1)
    changes = []
    for name in rows_a.keys() | rows_b.keys():
        ra, rb = rows_a.get(name), rows_b.get(name)
        before = (ra.ms / div_a) if ra else 0.0
        after = (rb.ms / div_b) if rb else 0.0
        status = "appeared" if ra is None else "gone" if rb is None else "slower" if after > before else "faster"
        changes.append(OpChange(
            name=name, category=(rb or ra).category, modules=sorted((ra.modules if ra else set()) | (rb.modules if rb else set())),
            baseline_ms_per_step=round(before, 6), candidate_ms_per_step=round(after, 6),
            delta_ms_per_step=round(after - before, 6),
            baseline_runs_per_step=round(ra.runs / div_a, 2) if ra else 0.0,
            candidate_runs_per_step=round(rb.runs / div_b, 2) if rb else 0.0, status=status,
        ))
    changes.sort(key=lambda c: -abs(c.delta_ms_per_step))
    notes = [((a.tool(tool) or {}).get("detail") or {}).get("note") or "", "" if per_step else
             "one side has no steps: totals over the whole profile, not per step"]
    picked = {s: [c for c in changes if c.status == s and c.delta_ms_per_step != 0][:top]
              for s in ("slower", "faster", "appeared", "gone")}
    return OpsDiff(
        source=tool,
        baseline_ms_per_step=round(sum(r.ms for r in rows_a.values()) / div_a, 4),
        candidate_ms_per_step=round(sum(r.ms for r in rows_b.values()) / div_b, 4),
        note="; ".join(n for n in notes if n),
        **picked,
    )


def _kernel_outputs(outputs: SessionOutputs) -> SessionOutputs:
    """Kernel stats are a broad tool or a follow-up, whichever the analysis ran."""
    if KERNEL_TOOL in outputs.tools:
        return outputs
    follow_up = next((v for k, v in sorted(outputs.tools.items()) if k.startswith("followup-") and k.endswith(KERNEL_TOOL)), None)
    return SessionOutputs(outputs.label, outputs.analysis, {**outputs.tools, KERNEL_TOOL: follow_up} if follow_up else outputs.tools)


def _memory(a: SessionOutputs, b: SessionOutputs) -> Change:
    sa, sb = _summary(a, MEMORY_TOOL), _summary(b, MEMORY_TOOL)
    if not sa or not sb or sa.get("peak_memory_gib") is None or sb.get("peak_memory_gib") is None:
        return Change(unit="GiB", available=False, source=MEMORY_TOOL,
                      reason=_why_missing(a, MEMORY_TOOL) if not sa or sa.get("peak_memory_gib") is None else _why_missing(b, MEMORY_TOOL))
    return _change("GiB", sa["peak_memory_gib"], sb["peak_memory_gib"], MEMORY_TOOL)


def _findings(a: SessionOutputs, b: SessionOutputs) -> FindingsDiff:
    def by_key(outputs: SessionOutputs) -> dict[str, dict[str, Any]]:
        return {f["key"]: f for f in ((outputs.analysis.get("diagnosis") or {}).get("findings") or [])}

    def ref(finding: dict[str, Any]) -> FindingRef:
        return FindingRef(key=finding["key"], title=finding["title"], priority=finding["priority"])

    fa, fb = by_key(a), by_key(b)
    return FindingsDiff(
        baseline_status=a.analysis.get("result") or a.analysis.get("status"),
        candidate_status=b.analysis.get("result") or b.analysis.get("status"),
        appeared=[ref(f) for k, f in fb.items() if k not in fa],
        gone=[ref(f) for k, f in fa.items() if k not in fb],
        changed=[FindingChange(key=k, title=fb[k]["title"], baseline_priority=fa[k]["priority"],
                               candidate_priority=fb[k]["priority"])
                 for k in fa.keys() & fb.keys() if fa[k]["priority"] != fb[k]["priority"]],
        kept=[ref(fb[k]) for k in fb if k in fa and fa[k]["priority"] == fb[k]["priority"]],
    )


def _verdict(step: Change, test: StepTest) -> str:
    if not step.available or step.delta is None:
        return "not_comparable"
    return test.verdict


def _ms(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g} ms"


def _step_sentence(test: StepTest, a: SessionRef, b: SessionRef, step: Change) -> str:
    sa, sb = test.baseline, test.candidate
    if test.verdict == "not_comparable" or not step.available:
        return f"Step times cannot be compared: {test.reason or step.reason}."
    span = f"{_ms(sa.mean_ms)} → {_ms(sb.mean_ms)} per step"
    if test.verdict == "not_enough_steps":
        return f"Not enough steps for a verdict ({span}): {test.reason}."
    interval = f"95% interval {test.ci_low_percent:+.1f}% to {test.ci_high_percent:+.1f}%"
    if test.verdict == "no_change":
        return (f"No change: {span} ({test.change_percent:+.1f}%, {interval}); these captures could show a step "
                f"{test.min_detectable_gain_percent:.1f}% shorter or {test.min_detectable_percent:.1f}% longer, "
                "or more.")
    word = "faster" if test.verdict == "faster" else "slower"
    return f"{abs(test.change_percent):.1f}% {word}: {span} ({test.realized_gain_ms * -1:+.4g} ms, {interval})."


def _realized(verdict: str, o: FindingOutcome) -> str:
    if o.realized_gain_percent is None or verdict in ("not_comparable", "not_enough_steps"):
        return "realized: not measured"
    if verdict == "no_change":
        return f"realized: none beyond the captures' noise ({o.realized_gain_percent:+.2g}%)"
    shorter = o.realized_gain_percent > 0
    return (f"realized: steps {abs(o.realized_gain_percent):.3g}% {'shorter' if shorter else 'longer'} "
            f"({abs(o.realized_gain_ms):.4g} ms {'less' if shorter else 'more'})")


def _named_in_headline(op_ms_per_step: float | None, step_ms: float | None) -> bool:
    """An op gone or new is news only where it held a share of its side's step: a fusion renumbered by a recompile
    or a few microseconds of bookkeeping is not (the ops lists keep every row)."""
    return not step_ms or (op_ms_per_step or 0.0) >= HEADLINE_OP_STEP_SHARE * step_ms


def _headline(verdict: str, test: StepTest, step: Change, a: SessionRef, b: SessionRef, outcomes: list[FindingOutcome],
              lines: LinesDiff, breakdown: list[CategoryChange], ops: OpsDiff, findings: FindingsDiff,
              memory: Change) -> list[str]:
    lines_out = [_step_sentence(test, a, b, step)]
    if a.analysis_id and a.analysis_id == b.analysis_id:
        lines_out.append("Before and after are one capture (the same files): compare a capture made after the change.")
    for o in outcomes[:4]:
        p = o.predicted
        if p.percent_of_step is None:
            predicted = "no predicted number"
        elif p.low_percent_of_step is not None:
            predicted = (f"predicted {p.low_percent_of_step:.3g}–{p.percent_of_step:.3g}% shorter steps"
                         + (f" ({p.low_ms_per_step:.4g}–{p.ms_per_step:.4g} ms)" if p.ms_per_step is not None else ""))
        else:
            predicted = (f"predicted up to {p.percent_of_step:.3g}% of the step"
                         + (f" ({p.ms_per_step:.4g} ms)" if p.ms_per_step is not None else ""))
        said = next((n for n in o.note.split("; ") if n.startswith("gone, but")), o.outcome)
        lines_out.append(f"{o.key} ({o.priority_before}): {said}; {predicted}; {_realized(verdict, o)}.")
    measured = [c for c in lines.moved if c.delta_ms_per_step is not None][:3] if lines.available else []
    if measured:
        lines_out.append(("Lines that moved most: " if verdict in ("faster", "slower") else
                          "Lines that moved most (the step time's change is within these captures' noise): ") + ", ".join(
            f"`{c.line}` {c.delta_ms_per_step:+.4g} ms" for c in measured) + " per step (device self time).")
    if breakdown and step.delta and verdict in ("faster", "slower"):
        top = breakdown[0]
        lines_out.append(f"Most of the change is {top.category.replace('_', ' ')}: {top.baseline_ms:.4g} → "
                         f"{top.candidate_ms:.4g} ms per step ({top.delta_ms:+.4g} ms).")
    if ops.available:
        gone = [c for c in ops.gone if _named_in_headline(c.baseline_ms_per_step, test.baseline.mean_ms)][:3]
        came = [c for c in ops.appeared if _named_in_headline(c.candidate_ms_per_step, test.candidate.mean_ms)][:3]
        if gone:
            lines_out.append("Ops gone: " + ", ".join(f"{c.name} ({c.baseline_ms_per_step:.4g} ms/step)" for c in gone) + ".")
        if came:
            lines_out.append("Ops new: " + ", ".join(f"{c.name} ({c.candidate_ms_per_step:.4g} ms/step)" for c in came) + ".")
    if findings.appeared:
        lines_out.append("Findings that appeared: " + ", ".join(f"{f.key} ({f.priority})" for f in findings.appeared) + ".")
    if memory.available and memory.delta:
        lines_out.append(f"Memory peak {memory.baseline:.4g} → {memory.candidate:.4g} GiB ({memory.delta:+.4g} GiB).")
    return lines_out


def what_changed_since(diff: SessionDiff) -> str:
    """One line for a report's top: "step +18% since <session>: `train.py:62` +40 ms" (the step test's change, the
    line that moved most), or why there is no verdict."""
    test, since = diff.step_test, diff.baseline.session_id or diff.baseline.label
    if diff.verdict in ("not_comparable", "not_enough_steps"):
        return f"no step-time verdict against {since}: {test.reason or diff.step_time.reason}"
    change = f"step {test.change_percent:+.1f}% since {since}" + (" (no change beyond the captures' noise)"
                                                                  if diff.verdict == "no_change" else "")
    moved = [c for c in diff.lines.moved if c.delta_ms_per_step is not None][:2]
    return change + (": " + ", ".join(f"`{c.line}` {c.delta_ms_per_step:+.3g} ms" for c in moved) if moved else "")


def compare_sessions(baseline: SessionOutputs, candidate: SessionOutputs, top: int = 15) -> SessionDiff:
    """The before/after comparison of two analysed sessions (baseline first)."""
    step = _step_time(baseline, candidate)
    breakdown = _breakdown(baseline, candidate, step)
    ops = _ops_diff(baseline, candidate, OPS_TOOL, "ops", "op", "count", "module", top)
    kernels = _ops_diff(_kernel_outputs(baseline), _kernel_outputs(candidate), KERNEL_TOOL, "kernels", "kernel",
                        "launches", "hlo_op", top)
    memory = _memory(baseline, candidate)
    findings = _findings(baseline, candidate)
    test = compare_steps(trace_step_ms(baseline.tool(STEP_TOOL)), trace_step_ms(candidate.tool(STEP_TOOL)))
    for side, outputs in ((test.baseline, baseline), (test.candidate, candidate)):
        side.note = LAST_STEP_NOTE if start_to_start(outputs.tool(STEP_TOOL)) else ""
    refused = incomparable(baseline, candidate)
    if refused:  # each side's steps, and no change, interval or gain between them
        test = StepTest(verdict="not_comparable", baseline=test.baseline, candidate=test.candidate, reason=refused)
    elif not step.available:
        test.verdict, test.reason = "not_comparable", step.reason
    elif not test.baseline.steps_total or not test.candidate.steps_total:
        test.verdict = "not_comparable"
        test.reason = "the step trace lists no per-step rows (an analysis made before they were kept)"
    else:
        step.significant = test.verdict in ("faster", "slower") if test.z is not None else None
    verdict = _verdict(step, test)
    ref_a, ref_b = _ref(baseline), _ref(candidate)
    sides = ((test.baseline.mean_ms, ops.baseline_ms_per_step if ops.available else None),
             (test.candidate.mean_ms, ops.candidate_ms_per_step if ops.available else None))
    outcomes = finding_outcomes(
        (baseline.analysis.get("diagnosis") or {}).get("findings") or [],
        (candidate.analysis.get("diagnosis") or {}).get("findings") or [], sides,
        test.realized_gain_percent, test.realized_gain_ms)
    # per step as the ops are: the profile's totals over its step count (every step, as the step trace counts them)
    line_steps = tuple(int((_summary(o, STEP_TOOL) or {}).get("steps") or 0) for o in (baseline, candidate))
    lines = lines_diff(baseline.tool("get_line_view"), candidate.tool("get_line_view"), line_steps,
                       (baseline.label, candidate.label))
    headline = ([f"Not compared: {refused}; a verdict compares two captures of one program on one kind of device."]
                if refused else _headline(verdict, test, step, ref_a, ref_b, outcomes, lines, breakdown, ops, findings,
                                          memory))
    return SessionDiff(
        baseline=ref_a, candidate=ref_b, verdict=verdict, refused_because=refused, headline=headline,
        step_test=test, outcomes=outcomes, lines=lines,
        step_time=step, breakdown=breakdown, ops=ops, kernels=kernels, memory_peak=memory, findings=findings,
    )
