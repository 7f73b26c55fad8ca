"""summary.html: one self-contained page from an Analysis and its tool results.

The page is built in two steps: this module turns the analysis into plain view objects
(text, tables of cells, SVG charts made from escaped parts), and the Jinja2 template
lays them out with autoescaping on. No profile-derived string is ever marked safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from xdiag.model import Analysis, Finding, InvestigatorAudit, Status, ToolResult, ToolStatus
from xdiag.report import charts
from xdiag.report.viewer_links import viewer_links_for
from xdiag.report.format import (
    Block,
    Cell,
    cell,
    format_bytes,
    format_value,
    humanize_key,
    key_values,
    table,
    tone_of,
)

TEMPLATES = Path(__file__).parent / "templates"
PRIORITY_ORDER = {"P0": 0, "P1": 1, "P2": 2}
MAX_NOTE_CHARS = 110  # a metric card's reason line; the whole reason is in its title and in the detail sections

# The order the footer lists tools in: the broad collection (as xdiag.tools.registry.BROAD_TOOLS), then follow-ups.
TOOL_ORDER = (
    "get_xprof_overview", "get_step_trace", "get_kpi_metrics", "get_device_information", "get_hosts",
    "get_utilization_viewer", "get_smart_suggestions", "get_roofline_model", "get_hlo_op_profile",
    "detect_layout_mismatch_copies", "detect_unfused_reshapes", "detect_unnecessary_convert_reduce",
    "list_hlo_modules", "get_memory_profile", "get_peak_allocations", "get_hlo_neighborhood",
    "aggregate_xplane_events", "get_kernel_stats", "llo_load", "llo_query",
)

OP_COLUMNS = (
    "op", "module", "category", "count", "total_ms", "avg_us", "share_of_op_time_percent", "shape",
    "arithmetic_intensity_flops_per_byte", "achieved_gib_per_s", "achieved_gflops_per_s",
)
COLUMN_LABELS = {
    "share_of_op_time_percent": "share %",
    "arithmetic_intensity_flops_per_byte": "arith. intensity (FLOP/byte)",
    "achieved_gib_per_s": "achieved GiB/s",
    "achieved_gflops_per_s": "achieved GFLOP/s",
    "total_ms": "total ms",
    "avg_us": "avg µs",
    "step_ms": "step ms",
}


@dataclass(frozen=True)
class Metric:
    label: str
    path: tuple[str, ...]  # keys into analysis.health
    unit: str
    tool: str  # the tool the number comes from (health.py copies it from that tool's summary)
    hint: str = ""


METRICS = (
    Metric("Step time", ("step_time_ms",), "ms", "get_step_trace"),
    Metric("Device compute", ("breakdown_percent", "compute"), "%", "get_step_trace", "of step time"),
    Metric("Device idle", ("device_idle_percent",), "%", "get_step_trace", "of step time"),
    Metric("Utilization", ("utilization_percent",), "%", "get_utilization_viewer", "mean busy time of the devices"),
    Metric("Achieved compute", ("achieved_gflops_per_s",), "GFLOP/s", "get_kpi_metrics", "while ops run"),
    Metric("Roofline efficiency", ("roofline_efficiency_percent",), "%", "get_roofline_model", "of peak FLOP rate"),
    Metric("Peak memory", ("peak_memory_gib",), "GiB", "get_memory_profile"),
    Metric("Memory headroom", ("memory_headroom_percent",), "%", "get_memory_profile", "of capacity free at peak"),
    Metric("OOM risk", ("oom_risk",), "", "get_memory_profile"),
    Metric("Top op", ("top_op",), "", "get_hlo_op_profile"),
    Metric("Low-intensity op time", ("low_intensity_op_percent",), "%", "get_hlo_op_profile",
           "of op time in ops under 1 FLOP/byte"),
    Metric("Layout copies", ("compiler", "layout_copies_percent"), "%", "detect_layout_mismatch_copies", "of op time"),
    Metric("Unfused data movement", ("compiler", "unfused_data_movement_percent"), "%", "detect_unfused_reshapes",
           "of op time"),
    Metric("Widening converts", ("compiler", "widening_converts_percent"), "%", "detect_unnecessary_convert_reduce",
           "of op time"),
)


@dataclass
class MetricCard:
    label: str
    value: Cell
    unit: str
    tool: str
    note: str = ""
    missing: bool = False
    tone: str = ""
    note_full: str = ""  # the whole note when `note` was cut short


@dataclass
class Part:
    """What one tool contributes to a detail section, or why it cannot."""

    heading: str = ""
    tool: str = ""
    source: str = ""
    unavailable: str = ""  # "not available: …" / "failed: …" / "not run: …"
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Section:
    anchor: str
    title: str
    intro: str = ""
    parts: list[Part] = field(default_factory=list)


def render_summary_html(analysis: Analysis, results: Mapping[str, ToolResult] | None, previous=None) -> str:
    """The complete summary.html: one file with inline CSS and inline SVG, nothing fetched from anywhere.
    `previous`: the comparison with the run's previous session (xdiag.compare's SessionDiff), where there is one."""
    context = _context(analysis, dict(results or {}))
    context["previous"] = previous  # its headline, and diff-previous.html beside the report
    return _environment().get_template("summary.html.j2").render(**context)


@lru_cache(maxsize=1)
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every .j2 here is HTML; profile and model text must be escaped
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


# ---------------------------------------------------------------------------------------------- context


def _context(analysis: Analysis, results: dict[str, ToolResult]) -> dict[str, Any]:
    diagnosis = analysis.diagnosis
    health = analysis.health or {}
    findings = sorted(diagnosis.findings if diagnosis else [], key=lambda f: PRIORITY_ORDER.get(f.priority, 9))
    status = _status(analysis)
    breakdown = health.get("breakdown_percent") or {}
    bar, bar_legend = charts.breakdown_bar(breakdown, health.get("step_time_ms")) if breakdown else (None, [])
    sections = _detail_sections(results) if results else []
    return {
        "a": analysis,
        "header": _header(analysis),
        "status": status,
        "banner": _banner(analysis, status, findings),
        "summary": diagnosis.summary if diagnosis else "",
        "unhealthy_because": list(health.get("unhealthy_because") or []),
        "metrics": _metric_cards(health, results) if health else [],
        "metrics_missing_reason": "" if health else _no_health_reason(analysis),
        "breakdown_svg": bar,
        "breakdown_legend": bar_legend,
        "breakdown_tool": "get_step_trace",
        "breakdown_missing": "" if breakdown else _why_missing(results, "get_step_trace"),
        "findings": [_finding_view(f) for f in findings],
        "diagnosis": diagnosis,
        "hypotheses": list(diagnosis.hypotheses) if diagnosis else [],
        "follow_ups": table(
            [{"tool": c.tool, "args": c.args or None, "hypothesis": c.hypothesis, "status": c.status.value,
              "reason": c.reason} for c in diagnosis.follow_up_calls] if diagnosis else []
        ),
        "sections": sections,
        "viewer_links": viewer_links_for(analysis),  # the session in XProf's viewer (see viewer_links)
        "no_results_reason": "" if results else (
            "No tool ran: the analysis failed before the tools could read the profile."
            if status == "FAILED" else f"No tool results yet (pipeline status: {analysis.status})."
        ),
        "tools": _tool_table(results),
        "timings": key_values(analysis.timings_ms),
    }


def _status(analysis: Analysis) -> str:
    if analysis.status == "FAILED" or analysis.result == Status.FAILED:
        return "FAILED"
    if analysis.result is not None:
        return analysis.result.value
    if analysis.diagnosis is not None:
        return analysis.diagnosis.status.value
    return "INCOMPLETE"


def _model_usage(audit: InvestigatorAudit) -> str:
    """One line of the cost and audit record: model, requests, tokens, waiting time, tool calls."""
    refused = sum(1 for c in audit.tool_calls if (c.reason or "").startswith("refused"))
    return (f"{audit.model} ({audit.location}): {audit.model_calls} request(s)"
            + (f" incl. {audit.retries} retr{'y' if audit.retries == 1 else 'ies'}" if audit.retries else "")
            + f", {audit.total_tokens:,} tokens ({audit.prompt_tokens:,} in, {audit.output_tokens:,} out"
            + (f", {audit.thoughts_tokens:,} thinking" if audit.thoughts_tokens else "")
            + f"), {audit.latency_ms / 1000:.1f} s; {len(audit.tool_calls)} tool call(s) asked"
            + (f", {refused} refused" if refused else ""))


def _header(analysis: Analysis) -> list[tuple[str, Cell]]:
    p = analysis.profile or {}
    d = analysis.diagnosis
    investigator = d.investigator if d else analysis.investigator
    note = d.investigator_note if d else ""
    rows: list[tuple[str, Any]] = [
        ("Run", analysis.run_id),
        ("Session", analysis.session_id),
        ("Analysis", analysis.analysis_id),
        ("Platform", p.get("platform") or (analysis.health or {}).get("platform")),
        ("Hosts", p.get("hosts")),
        ("Devices", p.get("devices") if p.get("devices") is not None else None),
        ("Profile files", p.get("files") or [u.rsplit("/", 1)[-1] for u in analysis.profile_uris]),
        ("Profile size", format_bytes(p["size_bytes"]) if p.get("size_bytes") is not None else None),
        ("Events", p.get("events")),
        ("HLO modules", p.get("hlo_modules")),
        ("Investigator", f"{investigator}; {note}" if note else investigator),
        ("Model usage", _model_usage(d.audit) if d and d.audit else None),
        ("Created", analysis.created_at),
        ("Updated", analysis.updated_at),
    ]
    known = {"platform", "hosts", "devices", "files", "size_bytes", "events", "hlo_modules"}
    rows += [(humanize_key(k).capitalize(), v) for k, v in p.items() if k not in known and v not in (None, [], {}, "")]
    return [(label, cell(value, 200)) for label, value in rows if value not in (None, [], "")]


def _banner(analysis: Analysis, status: str, findings: Sequence[Finding]) -> dict[str, Any]:
    if status == "FAILED":
        return {
            "headline": "The analysis failed",
            "text": analysis.failure_reason or "no reason was recorded",
            "profile_uris": list(analysis.profile_uris),
        }
    if status == "OPTIMAL":
        return {"headline": "Optimal: no bottleneck needs attention", "text": "", "profile_uris": []}
    if status == "NEEDS_ATTENTION":
        counts = [f"{sum(1 for f in findings if f.priority == p)} {p}" for p in PRIORITY_ORDER
                  if any(f.priority == p for f in findings)]
        text = f"{len(findings)} finding(s): {', '.join(counts)}" if findings else "no finding was reported"
        return {"headline": "Needs attention", "text": text, "profile_uris": []}
    return {"headline": "Analysis incomplete", "text": f"pipeline status: {analysis.status}", "profile_uris": []}


def _no_health_reason(analysis: Analysis) -> str:
    if analysis.status == "FAILED" or analysis.result == Status.FAILED:
        return "no metrics: the analysis failed before a health snapshot was taken"
    return f"no metrics yet: the health snapshot is taken after the tools run (status {analysis.status})"


def _why_missing(results: Mapping[str, ToolResult], tool: str) -> str:
    """The reason a value from `tool` is missing, in the tool's own words where it gave them."""
    r = results.get(tool)
    if r is None:
        return f"{tool} was not run"
    if r.status == ToolStatus.NOT_AVAILABLE:
        return f"{tool}: {r.reason or 'not available'}"
    if r.status == ToolStatus.FAILED:
        return f"{tool} failed: {r.reason or 'no reason recorded'}"
    return f"{tool} did not report it"


def _lookup(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _metric_cards(health: Mapping[str, Any], results: Mapping[str, ToolResult]) -> list[MetricCard]:
    cards = []
    for m in METRICS:
        value = _lookup(health, m.path)
        if value is None:
            why = _why_missing(results, m.tool).removeprefix(f"{m.tool}: ")
            short = why if len(why) <= MAX_NOTE_CHARS else why[: MAX_NOTE_CHARS - 1] + "…"
            cards.append(MetricCard(m.label, Cell(text="not available", missing=True), "", m.tool,
                                    note=short, note_full=why if short != why else "", missing=True))
            continue
        note = m.hint
        if m.path == ("step_time_ms",):
            steps, source = health.get("steps"), health.get("step_source")
            note = f"mean over {format_value(steps)} steps" + (f" ({source})" if source else "")
            if health.get("step_time_cv_percent") is not None:
                note += f"; spread (CV) {format_value(health['step_time_cv_percent'])}%"
        elif m.path == ("peak_memory_gib",):
            capacity = health.get("memory_capacity_gib")
            # The peak came from the tool, so a missing capacity is the profile's gap, not the tool's.
            note = f"of {format_value(capacity)} GiB capacity" if capacity is not None else "capacity not recorded"

        elif m.path == ("top_op",):
            share, category = health.get("top_op_share_percent"), health.get("top_category")
            note = ", ".join(x for x in (f"{format_value(share)}% of op time" if share is not None else "",
                                         f"top category {category}" if category else "") if x)
        text = cell(value, 34) if isinstance(value, str) else Cell(text=format_value(value), numeric=True)
        tone = tone_of(value) if m.path == ("oom_risk",) else ""
        cards.append(MetricCard(m.label, text, m.unit, m.tool, note=note, tone=tone))
    return cards


def _finding_view(f: Finding) -> dict[str, Any]:
    rows = [[Cell(text=e.tool, wrap=False), cell(e.metric, 70), cell(e.value, 60), cell(e.note or "", 90)]
            for e in f.evidence]
    return {
        "priority": f.priority,
        "key": f.key,
        "title": f.title,
        "whats_happening": f.whats_happening,
        "evidence": rows,
        "evidence_tools": sorted({e.tool for e in f.evidence}),
        "expected_impact": f.expected_impact,
        "fix": f.fix,
        "verified": f.verified,
    }


def _tool_table(results: Mapping[str, ToolResult]):
    order = {t: i for i, t in enumerate(TOOL_ORDER)}
    names = sorted(results, key=lambda t: (order.get(t, len(order)), t))
    return table(
        [{"tool": t, "status": results[t].status.value, "duration_ms": round(results[t].duration_ms, 1),
          "source": results[t].source or None, "reason": results[t].reason} for t in names],
        limit=len(names),
    )


# ----------------------------------------------------------------------------------- detail sections


def _part(results: Mapping[str, ToolResult], tool: str, heading: str = "") -> tuple[Part, ToolResult | None]:
    """A part for `tool`, with `unavailable` set (and None returned) unless the tool is ok."""
    r = results.get(tool)
    part = Part(heading=heading, tool=tool)
    if r is None:
        part.unavailable = f"not run: {tool} was not called for this profile"
        return part, None
    part.source = r.source
    if r.status == ToolStatus.NOT_AVAILABLE:
        part.unavailable = f"not available: {r.reason or 'no reason given'}"
        return part, None
    if r.status == ToolStatus.FAILED:
        part.unavailable = f"failed: {r.reason or 'no reason recorded'}"
        return part, None
    return part, r


def _kv(data: Mapping[str, Any] | None, title: str = "", skip: Sequence[str] = ()) -> list[Block]:
    """A summary as label/value pairs; a None value with a reason under `unavailable` shows that reason."""
    data = dict(data or {})
    reasons: dict[str, Any] = {}
    for marker in UNAVAILABLE_KEYS:
        if isinstance(data.get(marker), Mapping):
            reasons.update(data.pop(marker))
    rows = key_values(data, skip=skip)
    for row in rows:
        if row.value.missing and row.key in reasons:
            row.value = cell(f"not available: {format_value(reasons.pop(row.key))}", 160)
            row.value.missing = True
    blocks = [Block(kind="kv", title=title, kv=rows)] if rows else []
    blocks += [Block(kind="text", text=f"{humanize_key(k)}: not available: {format_value(v)}", muted=True)
               for k, v in reasons.items()]
    return blocks


def _tbl(rows: Any, title: str = "", preferred: Sequence[str] = (), empty: str = "",
         only: Sequence[str] | None = None) -> list[Block]:
    t = table(rows, preferred=preferred, labels=COLUMN_LABELS, only=only) if isinstance(rows, list) else None
    if t is None:
        return [Block(kind="text", text=empty, muted=True)] if empty else []
    return [Block(kind="table", title=title, table=t)]


UNAVAILABLE_KEYS = ("unavailable", "not_available")
MAX_DETAIL_DEPTH = 3


def _generic_detail(detail: Mapping[str, Any], skip: Sequence[str] = (), shown: Mapping[str, Any] | None = None,
                    prefix: str = "", depth: int = 0) -> list[Block]:
    """Blocks for detail fields no section knows by name, at any nesting up to MAX_DETAIL_DEPTH: lists of dicts
    as tables, 'not available' markers and long notes as one line, other scalars as label/value pairs.
    Scalars equal to what `shown` (the summary above) already says are left out."""
    shown = shown or {}
    blocks: list[Block] = []
    scalars: dict[str, Any] = {}
    for key, value in detail.items():
        if key in skip:
            continue
        label = f"{prefix}{humanize_key(key)}"
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            blocks += _tbl(value, title=label)
        elif isinstance(value, list) and not value:
            blocks.append(Block(kind="text", text=f"{label}: none", muted=True))
        elif isinstance(value, Mapping) and value.get("available") is False:
            blocks.append(Block(kind="text", text=f"{label}: not available: {value.get('reason') or 'no reason given'}",
                                muted=True))
        elif isinstance(value, Mapping) and key in UNAVAILABLE_KEYS:
            blocks += [
                Block(kind="text", text=f"{prefix}{humanize_key(k)}: not available: {format_value(v)}", muted=True)
                for k, v in value.items()
                if not (k in shown and shown[k] is None)  # the summary above already says it is missing
            ]
        elif isinstance(value, Mapping) and value and depth < MAX_DETAIL_DEPTH and _is_nested(value):
            inner = prefix if key == "detail" else f"{label} · "  # "XProf · detail · x" is just "XProf · x"
            blocks += _generic_detail(value, shown=shown, prefix=inner, depth=depth + 1)
        elif isinstance(value, str) and len(value) > 60:
            blocks.append(Block(kind="text", text=f"{label}: {value}", muted=True))
        elif key in shown and shown[key] == value:
            continue  # the summary above already shows it
        else:
            scalars[key] = value
    if scalars:
        blocks = _kv(scalars, title=prefix.rstrip(" ·") or "more detail") + blocks
    return blocks


def _is_nested(value: Mapping[str, Any]) -> bool:
    """Worth its own blocks: holds lists, dicts, or more fields than fit on one line."""
    return len(value) > 4 or any(isinstance(v, (list, Mapping)) for v in value.values())


def _step_time_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("step-time", "Step time")
    part, r = _part(results, "get_step_trace")
    section.parts.append(part)
    if r is None:
        return section
    part.blocks += _kv(r.summary)
    steps = r.detail.get("steps") or []
    categories = r.detail.get("categories") or list(charts.STEP_CATEGORY_COLORS)
    if steps:
        svg, legend = charts.step_columns(steps, categories)
        meaning = r.detail.get("category_meaning") or {}
        shown = min(len(steps), charts.MAX_STEP_COLUMNS)
        title = "Time per step, split by category (ms)"
        if len(steps) > shown:
            title += f" — first {shown} of {len(steps)} steps"
        part.blocks.append(Block(kind="chart", title=title, svg=svg,
                                 legend=[(c, color, meaning.get(c, "")) for c, color, _ in legend]))
    part.blocks += _tbl(steps, title="Per-step rows", preferred=("host", "step", "step_ms", *categories))
    part.blocks += _generic_detail(r.detail, skip=("steps", "categories", "category_meaning"), shown=r.summary)
    return section


def _roofline_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("roofline", "Roofline")
    part, r = _part(results, "get_roofline_model")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary) + _generic_detail(r.detail, shown=r.summary)
    return section


def _memory_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("memory", "Memory")
    part, r = _part(results, "get_memory_profile", "Memory use and OOM risk")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary) + _generic_detail(r.detail, shown=r.summary)
    part, r = _part(results, "get_peak_allocations", "Largest buffers")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary)
        part.blocks += _tbl(r.detail.get("buffers"), title="Buffers", empty="no buffers listed")
        part.blocks += _generic_detail(r.detail, skip=("buffers",), shown=r.summary)
    return section


def _op_profile_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("hlo-op-profile", "HLO op profile")
    part, r = _part(results, "get_hlo_op_profile")
    section.parts.append(part)
    if r is None:
        return section
    part.blocks += _kv(r.summary)
    categories = r.detail.get("categories_ms") or {}
    if categories:
        svg = charts.horizontal_bars(categories)
        part.blocks.append(Block(kind="chart", title="Op time by category (ms)", svg=svg))
    ops = [o for o in r.detail.get("ops") or [] if isinstance(o, Mapping)]
    part.blocks += _tbl(ops, title="Slowest ops", preferred=OP_COLUMNS, only=OP_COLUMNS, empty="no ops listed")
    # Every other field of the same ops (opcode, framework op, shapes, FLOPs, bytes, source …): nothing hidden.
    extra = [{"op": o.get("op"), **{k: v for k, v in o.items() if k not in OP_COLUMNS}} for o in ops]
    if any(len(e) > 1 for e in extra):
        part.blocks += _tbl(extra, title="Slowest ops: HLO detail")
    part.blocks += _generic_detail(r.detail, skip=("ops", "categories_ms"), shown=r.summary)
    return section


def _compiler_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("compiler-checks", "Compiler checks")
    for tool, heading in (
        ("detect_layout_mismatch_copies", "Layout-changing copies and transposes"),
        ("detect_unfused_reshapes", "Unfused reshapes, transposes and copies"),
        ("detect_unnecessary_convert_reduce", "Widening converts around reductions"),
    ):
        part, r = _part(results, tool, heading)
        section.parts.append(part)
        if r is not None:
            part.blocks += _kv(r.summary)
            part.blocks += _tbl(r.detail.get("ops"), preferred=("op", "module"), empty="no such ops found")
            part.blocks += _generic_detail(r.detail, skip=("ops",), shown=r.summary)
    return section


def _kernel_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("kernel-stats", "Kernel statistics", intro="GPU kernels by total time (GPU profiles only).")
    part, r = _part(results, "get_kernel_stats")
    if r is None and "get_kernel_stats" not in results:
        part.unavailable = "not collected: get_kernel_stats is a follow-up tool (GPU only) and was not called"
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary)
        part.blocks += _tbl(r.detail.get("kernels"), title="Kernels", preferred=("kernel", "launches", "total_ms"),
                            empty="no kernels listed")
        part.blocks += _generic_detail(r.detail, skip=("kernels",), shown=r.summary)
    return section


def _custom_kernel_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("custom-kernels", "Custom kernels",
                      intro="Custom calls (Pallas, Mosaic, Triton and other hand-written kernels) from the op profile.")
    part, r = _part(results, "get_hlo_op_profile")
    section.parts.append(part)
    if r is None:
        return section
    ops = [o for o in r.detail.get("ops") or []
           if isinstance(o, Mapping) and (o.get("category") == "custom_call" or o.get("opcode") == "custom-call")]
    total = (r.detail.get("categories_ms") or {}).get("custom_call")
    if ops:
        part.blocks += _tbl(ops, preferred=OP_COLUMNS)
    elif total:
        part.blocks.append(Block(kind="text", text=f"custom calls take {format_value(total)} ms of op time, "
                                 "but none is among the slowest ops listed", muted=True))
    else:
        part.blocks.append(Block(kind="text", text="none in this profile", muted=True))
    return section


def _modules_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("modules", "HLO modules")
    part, r = _part(results, "list_hlo_modules")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary)
        part.blocks += _tbl(r.detail.get("modules"), empty="no modules listed")
        part.blocks += _generic_detail(r.detail, skip=("modules",), shown=r.summary)
    return section


def _device_section(results: Mapping[str, ToolResult]) -> Section:
    section = Section("devices", "Device & hosts")
    part, r = _part(results, "get_device_information", "Device")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary)
        part.blocks += _tbl(r.detail.get("devices"), title="Devices")
        part.blocks += _generic_detail(r.detail, skip=("devices",), shown=r.summary)
    part, r = _part(results, "get_hosts", "Hosts")
    section.parts.append(part)
    if r is not None:
        part.blocks += _kv(r.summary)
        part.blocks += _tbl(r.detail.get("hosts"), title="Hosts")
        part.blocks += _generic_detail(r.detail, skip=("hosts",), shown=r.summary)
    return section


SECTION_TOOLS = {
    "get_step_trace", "get_roofline_model", "get_memory_profile", "get_peak_allocations", "get_hlo_op_profile",
    "detect_layout_mismatch_copies", "detect_unfused_reshapes", "detect_unnecessary_convert_reduce",
    "get_kernel_stats", "list_hlo_modules", "get_device_information", "get_hosts",
}


def _other_tools_section(results: Mapping[str, ToolResult]) -> Section | None:
    order = {t: i for i, t in enumerate(TOOL_ORDER)}
    others = sorted((t for t in results if t not in SECTION_TOOLS), key=lambda t: (order.get(t, len(order)), t))
    if not others:
        return None
    section = Section("other-tools", "Other tool outputs")
    for tool in others:
        part, r = _part(results, tool, tool)
        section.parts.append(part)
        if r is not None:
            part.blocks += _kv(r.summary) + _generic_detail(r.detail, shown=r.summary)
    return section


def _detail_sections(results: Mapping[str, ToolResult]) -> list[Section]:
    sections = [
        _step_time_section(results),
        _roofline_section(results),
        _memory_section(results),
        _op_profile_section(results),
        _compiler_section(results),
        _kernel_section(results),
        _custom_kernel_section(results),
        _modules_section(results),
        _device_section(results),
    ]
    other = _other_tools_section(results)
    return sections + ([other] if other else [])


__all__ = ["render_summary_html"]
