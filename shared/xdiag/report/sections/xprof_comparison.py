"""The xdiag-and-XProf section: xdiag's and XProf's figure for the same quantity side by side, and where they
differ, why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xdiag.model import ToolResult
from xdiag.report.format import Block, Cell, Limits, format_measure, measured_cell, table
from xdiag.report.sections.parts import Part, Section


# Pairs of the same quantity as xdiag and XProf measure it: (label, xdiag tool, key, XProf tool, key).
XPROF_PAIRS = (
    ("Step time", "get_step_trace", "step_time_ms_mean", "get_kpi_metrics", "xprof_step_time_ms"),
    ("Device busy", "get_step_trace", "busy_percent_in_steps", "get_kpi_metrics", "xprof_duty_cycle_percent"),
    ("Roofline efficiency", "get_roofline_model", "op_time_roofline_efficiency_percent", "get_roofline_model",
     "roofline_efficiency_percent"),
    ("Peak memory", "get_memory_profile", "peak_memory_gib", "get_kpi_metrics", "xprof_peak_hbm_gib"),
    ("Memory capacity", "get_memory_profile", "capacity_gib", "get_kpi_metrics", "xprof_memory_capacity_gib"),
)
DIFFERENCE_RELATIVE = 0.1


def xprof_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    """xdiag's and XProf's figure for the same quantity side by side, with a word where they differ."""
    hosts = _summary_value(results, "get_hosts", "hosts")
    covered = _hosts_covered(results)
    if covered:
        of_hosts = f"{hosts:g} hosts" if hosts else "hosts"
        covers = (f" XProf's figures cover {len(covered)} of the session's {of_hosts}, those that matter "
                  f"whose files fit the limit together ({', '.join(covered)}): its converters read the xplane files, "
                  "and every host's together is over the session limit or the memory its conversions may take; "
                  "xdiag's are averaged over the active devices of every host.")
    elif hosts and hosts > 1:
        covers = (f" XProf's figures cover all {hosts:g} hosts of the session together (its converters combine every "
                  "host's file, ALL_HOSTS; memory is the peak of the hosts' allocators); xdiag's are averaged over the "
                  "active devices of every host.")
    else:
        covers = ""
    missing = _views_missing(results)
    if missing:
        covers += f" XProf's figures are not in this report: {missing}."
    section = Section("xprof", "xdiag and XProf",
                      intro="The same quantity as xdiag measures it and as XProf's own converters report it." + covers)
    part = Part(tool="get_kpi_metrics")
    section.parts.append(part)
    rows = []
    for label, tool, key, xtool, xkey in XPROF_PAIRS:
        mine, theirs = _summary_value(results, tool, key), _summary_value(results, xtool, xkey)
        if mine is None and theirs is None:
            continue
        rows.append({"quantity": label, "xdiag": measured_cell(key, mine, limits).text if mine is not None else "n/a",
                     "XProf": measured_cell(xkey, theirs, limits).text if theirs is not None else "n/a",
                     "note": _difference_note(key, mine, theirs, results)})
    if rows:
        t = table(rows, shown=len(rows))
        for row in t.rows:
            row[-1] = Cell(text=row[-1].full or row[-1].text)  # the note is prose: never cut
        part.blocks.append(Block(kind="table", table=t))
    else:
        kpi = results.get("get_kpi_metrics")
        part.unavailable = ("not available: XProf reported none of these quantities for this profile"
                            if kpi is not None and kpi.ok else f"not available: {(kpi.reason if kpi else None) or 'get_kpi_metrics did not run'}")
    return section


def _views_missing(results: Mapping[str, ToolResult]) -> str:
    """Why XProf's views are not in the analysis (converted beside it and not waited for, refused for memory …), as
    get_kpi_metrics, which reads three of them, met it; "" where it has them."""
    kpi = results.get("get_kpi_metrics")
    view = kpi.detail.get("xprof") if kpi is not None and kpi.ok and isinstance(kpi.detail, dict) else None
    if isinstance(view, Mapping) and view.get("available") is False:
        return str(view.get("reason") or "no reason given").rstrip(".")
    return ""


def _hosts_covered(results: Mapping[str, ToolResult]) -> list[str]:
    """The hosts XProf's views were built for where they cover only some of the session's
    (xdiag.analysis.xprof.host_subset); empty where they cover every host."""
    kpi = results.get("get_kpi_metrics")
    view = kpi.detail.get("xprof") if kpi is not None and kpi.ok and isinstance(kpi.detail, dict) else None
    covered = view.get("hosts_covered") if isinstance(view, dict) else None
    return [str(host) for host in covered] if isinstance(covered, list) else []


# Figures the page states that a tool gives as their complement: the busy share of the steps is what the
# breakdown leaves idle, so it reads the same here as in the bar and in the step tool's window note.
_DERIVED = {"busy_percent_in_steps": ("device_idle_percent", lambda idle: round(100 - idle, 2))}


def _summary_value(results: Mapping[str, ToolResult], tool: str, key: str) -> Any:
    r = results.get(tool)
    source, derive = _DERIVED.get(key, (key, None))
    value = r.summary.get(source) if r is not None and r.ok else None
    if derive is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = derive(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _difference_note(key: str, mine: Any, theirs: Any, results: Mapping[str, ToolResult]) -> str:
    if mine is None or theirs is None:
        return "only one side reports it"
    if max(abs(mine), abs(theirs)) == 0 or abs(mine - theirs) <= DIFFERENCE_RELATIVE * max(abs(mine), abs(theirs)):
        return "agree"
    if key == "busy_percent_in_steps":
        step = results.get("get_step_trace")
        note = step.summary.get("window_vs_step_note") if step is not None and step.ok else None
        if note:
            return str(note)  # the step tool's own account of where the window's idle time is
        window = step.summary.get("window_busy_percent") if step is not None and step.ok else None
        gap = step.summary.get("largest_idle_gap_ms") if step is not None and step.ok else None
        why = "XProf's duty cycle counts the whole capture window, idle gaps outside the steps included"
        if isinstance(window, (int, float)):
            why += f" (busy {format_measure(window, '%')} over the window"
            why += f", largest gap {format_measure(gap, 'ms')})" if isinstance(gap, (int, float)) else ")"
        return why
    if key == "step_time_ms_mean":
        return "the two cut steps differently (xdiag: see the step source above; XProf: its own step markers)"
    if key == "capacity_gib":
        memory = results.get("get_memory_profile")
        limit = memory.summary.get("allocator_limit_gib") if memory is not None and memory.ok else None
        if isinstance(limit, (int, float)) and abs(limit - theirs) <= DIFFERENCE_RELATIVE * theirs:
            return ("xdiag's is the device's memory; XProf's is the allocator's limit, which xdiag shows as "
                    "allocator limit")
    if key == "op_time_roofline_efficiency_percent":
        return ("xdiag measures over device op time with checked peaks and custom-call FLOPs; XProf over the "
                "whole program, idle included, with XLA's cost model")
    return "differ"
