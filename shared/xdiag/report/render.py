"""summary.html: one self-contained page from an Analysis and its tool results.

The page is built in two steps: this module turns the analysis into plain view objects
(text, tables of cells, SVG charts made from escaped parts), and the Jinja2 template
lays them out with autoescaping on. No profile-derived string is ever marked safe.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import BytecodeCache, Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined
from jinja2.bccache import Bucket

from xdiag.model import Analysis, Finding, InvestigatorAudit, Status, ToolResult
from xdiag.report import charts
from xdiag.report.format import (
    Cell,
    Limits,
    cell,
    format_bytes,
    format_measure,
    humanize_key,
    humanize_numbers,
    key_values,
    measured_cell,
    metric_label,
    source_text,
    table,
    unit_of,
)
from xdiag.report.sections.hosts import hosts_section
from xdiag.report.sections.inventory import device_section, modules_section, tool_table
from xdiag.report.sections.kernels import custom_kernel_section, kernel_section
from xdiag.report.sections.lines import lines_section
from xdiag.report.sections.memory import memory_section
from xdiag.report.sections.ops import compiler_section, op_profile_section
from xdiag.report.sections.parts import Section
from xdiag.report.sections.peaks import Peaks, device_peaks
from xdiag.report.sections.roofline import roofline_section
from xdiag.report.sections.source_lines import source_lines_section
from xdiag.report.sections.steps import step_time_section
from xdiag.report.sections.xprof_comparison import xprof_section
from xdiag.report.summary import metric_cards, priority_counts, summary_sentences, why_missing
from xdiag.report.viewer_links import viewer_links_for

TEMPLATES = Path(__file__).parent / "templates"
PRIORITY_ORDER = {"P0": 0, "P1": 1, "P2": 2}

# The order the Tools table lists tools in: the broad collection (as xdiag.tools.registry.BROAD_TOOLS), then follow-ups.
TOOL_ORDER = (
    "get_xprof_overview", "get_step_trace", "get_kpi_metrics", "get_device_information", "get_hosts",
    "get_utilization_viewer", "get_smart_suggestions", "get_roofline_model", "get_hlo_op_profile",
    "get_line_view", "detect_layout_mismatch_copies", "detect_unfused_reshapes", "detect_unnecessary_convert_reduce",
    "list_hlo_modules", "get_memory_profile", "get_peak_allocations", "get_kernel_stats", "get_custom_kernels",
    "get_hlo_neighborhood", "aggregate_xplane_events", "llo_load", "llo_query",
)


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
        bytecode_cache=bytecode_cache(),
    )


class _BestEffortBytecodeCache(FileSystemBytecodeCache):
    """Jinja's cache of compiled templates in a folder of the user's own under the temporary directory (Jinja checks
    it is theirs alone), keyed by each template's source: compiling the report's template costs ~55 ms in every
    process, loading it ~1 ms. A cache that cannot be read or written is no cache; the template compiles."""

    def load_bytecode(self, bucket: Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - unreadable or damaged: compile instead
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        with contextlib.suppress(Exception):
            super().dump_bytecode(bucket)


@lru_cache(maxsize=1)
def bytecode_cache() -> BytecodeCache | None:
    """The cache of compiled templates every Jinja environment of xdiag's pages uses."""
    try:
        return _BestEffortBytecodeCache()
    except (OSError, RuntimeError):  # no private folder to be had: compile every time
        return None


# ---------------------------------------------------------------------------------------------- context


def _context(analysis: Analysis, results: dict[str, ToolResult]) -> dict[str, Any]:
    diagnosis = analysis.diagnosis
    health = analysis.health or {}
    findings = sorted(diagnosis.findings if diagnosis else [], key=lambda f: PRIORITY_ORDER.get(f.priority, 9))
    status = _status(analysis)
    peaks = device_peaks(results)
    limits = peaks.limits
    breakdown = health.get("breakdown_percent") or {}
    bar, bar_legend = charts.breakdown_bar(breakdown, health.get("step_time_ms")) if breakdown else (None, [])
    detail = _detail_sections(results, peaks) if results else []
    own_summary = summary_sentences(analysis, status, findings)
    # The rule engine's own summary says what the sentences above say; another investigator's is its own view.
    investigator_summary = humanize_numbers(diagnosis.summary) if diagnosis and diagnosis.investigator != "rules" else ""
    return {
        "a": analysis,
        "header": _header(analysis),
        "status": status,
        "banner": _banner(analysis, status, findings),
        "summary_sentences": own_summary,
        "investigator_summary": investigator_summary,
        "investigator_name": diagnosis.investigator if diagnosis else "",
        "unhealthy_because": [humanize_numbers(str(x)) for x in health.get("unhealthy_because") or []],
        "metrics": metric_cards(health, results, limits) if health else [],
        "metrics_missing_reason": "" if health else _no_health_reason(analysis),
        "breakdown_svg": bar,
        "breakdown_legend": bar_legend,
        "breakdown_tool": "get_step_trace",
        "breakdown_missing": "" if breakdown else why_missing(results, "get_step_trace"),
        "findings": [_finding_view(f, limits) for f in findings],
        "diagnosis": diagnosis,
        "hypotheses": list(diagnosis.hypotheses) if diagnosis else [],
        "follow_ups": table(
            [{"tool": c.tool, "args": c.args or None, "hypothesis": c.hypothesis, "status": c.status.value,
              "reason": c.reason} for c in diagnosis.follow_up_calls] if diagnosis else [],
        ),
        "sections": detail,
        **_viewer(analysis),
        "no_results_reason": "" if results else (
            "No tool ran: the analysis failed before the tools could read the profile."
            if status == "FAILED" else f"No tool results yet (pipeline status: {analysis.status})."
        ),
        "tools": tool_table(results, TOOL_ORDER) if results else None,
        "timings": key_values({f"{k}_ms": v for k, v in (analysis.timings_ms or {}).items()}),
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
    return (f"{audit.model} ({audit.location}): {audit.model_calls} request{'' if audit.model_calls == 1 else 's'}"
            + (f" incl. {audit.retries} retr{'y' if audit.retries == 1 else 'ies'}" if audit.retries else "")
            + f", {audit.total_tokens:,} tokens ({audit.prompt_tokens:,} in, {audit.output_tokens:,} out"
            + (f", {audit.thoughts_tokens:,} thinking" if audit.thoughts_tokens else "")
            + f"), {format_measure(audit.latency_ms, 'ms')}; {len(audit.tool_calls)} tool "
            + ("call" if len(audit.tool_calls) == 1 else "calls") + " asked"
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
        text = priority_counts(findings) if findings else "no finding was reported"
        return {"headline": "Needs attention", "text": text, "profile_uris": []}
    return {"headline": "Analysis incomplete", "text": f"pipeline status: {analysis.status}", "profile_uris": []}


def _no_health_reason(analysis: Analysis) -> str:
    if analysis.status == "FAILED" or analysis.result == Status.FAILED:
        return "no metrics: the analysis failed before a health snapshot was taken"
    return f"no metrics yet: the health snapshot is taken after the tools run (status {analysis.status})"


def _metric_key(metric: str) -> str:
    """The field name inside an evidence metric ('category_percent.async_copy+memcpy' -> 'category_percent'),
    whose unit the value is in; '' when none names a unit."""
    return next((t for t in re.split(r"[\s.+]", metric) if unit_of(t)), "")


def _finding_view(f: Finding, limits: Limits) -> dict[str, Any]:
    # metric, value, tool, note: on a phone the metric and its value are what the first screen width shows.
    rows = [[Cell(text=metric_label(e.metric)[:70], full=e.metric),
             measured_cell(_metric_key(e.metric), humanize_numbers(e.value) if isinstance(e.value, str) else e.value,
                           limits, 60),
             Cell(text=e.tool, wrap=False), cell(humanize_numbers(e.note or ""), 90)]
            for e in f.evidence]
    return {
        "priority": f.priority,
        "key": f.key,
        "title": humanize_numbers(f.title),
        "whats_happening": humanize_numbers(f.whats_happening),
        "evidence": rows,
        "evidence_tools": sorted({e.tool for e in f.evidence}),
        "expected_impact": humanize_numbers(f.expected_impact),
        "fix": humanize_numbers(f.fix),
        "verified": f.verified,
        "source_lines": [f"{source_text(s.model_dump())}: {format_measure(s.share_percent, '%')} of op time"
                         if s.host_ms is None else
                         f"{source_text(s.model_dump())}: {format_measure(s.host_ms, 'ms')} of host time"
                         for s in f.source_lines],
    }


def _viewer(analysis: Analysis) -> dict[str, Any]:
    """Where the session opens: XProf's viewer for xplanes; for a session read from a Chrome/Kineto trace, which
    XProf's viewer cannot open, the trace viewers that can."""
    read_from = (analysis.profile or {}).get("format") or ""
    if read_from and not read_from.startswith("XProf XSpace"):
        files = ", ".join((analysis.profile or {}).get("files") or []) or "the trace file"
        return {"viewer_links": [], "trace_viewer_note": (
            f"This session was read from a {read_from}, which XProf's viewer cannot open: open {files} in the "
            "Perfetto UI (https://ui.perfetto.dev) or chrome://tracing.")}
    return {"viewer_links": viewer_links_for(analysis), "trace_viewer_note": ""}


# ----------------------------------------------------------------------------------- detail sections


def _detail_sections(results: Mapping[str, ToolResult], peaks: Peaks) -> list[Section]:
    limits = peaks.limits
    return [
        source_lines_section(results, limits),  # first after the findings: where in the user's code the time goes
        lines_section(results, limits),  # and line by line, with the code
        hosts_section(results, limits),
        step_time_section(results, limits),
        roofline_section(results, peaks),
        op_profile_section(results, limits),
        kernel_section(results, limits),
        custom_kernel_section(results, limits),
        compiler_section(results, limits),
        memory_section(results, limits),
        xprof_section(results, limits),
        modules_section(results, limits),
        device_section(results, limits),
    ]


__all__ = ["render_summary_html"]
