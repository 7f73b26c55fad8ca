"""The step-time section: how long a step takes and what it spends its time on, step by step and per device or host."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xdiag.model import ToolResult
from xdiag.report import charts
from xdiag.report.format import Block, Limits, format_measure
from xdiag.report.sections.parts import Section, kv_blocks, part_for, table_block, xprof_gap

MAX_STEP_CHARTS = 2
MIN_STEPS_CHARTED = 4  # a chart of one to three columns says no more than the rows do
MAX_STEP_ROWS = 400


def step_time_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("step-time", "Step time")
    part, r = part_for(results, "get_step_trace")
    section.parts.append(part)
    if r is None:
        return section
    categories = r.detail.get("categories") or list(charts.STEP_CATEGORY_COLORS)
    # The breakdown is the bar under the key metrics: not repeated here, nor its per-device means (the same shares
    # averaged another way, 72.2% beside 72.1%); the spread across devices (least and most busy) stays.
    per_device_means = ["device_busy_percent_mean", *(f"device_{c}_percent_mean" for c in (*categories, "idle"))]
    part.blocks += kv_blocks(r.summary, limits, skip=[*(f"{c}_percent" for c in categories), *per_device_means])
    steps = [s for s in r.detail.get("steps") or [] if isinstance(s, Mapping)]
    meaning = r.detail.get("category_meaning") or {}
    # One chart per participant (a device where the steps are per device, else a host), the first few of them.
    by_participant: dict[str, list[Mapping[str, Any]]] = {}
    for s in steps:
        by_participant.setdefault(str(s.get("device") or s.get("host") or ""), []).append(s)
    kind = "device" if any(s.get("device") for s in steps) else "host"
    charted = [(name, rows) for name, rows in by_participant.items() if len(rows) >= MIN_STEPS_CHARTED]
    for name, rows in charted[:MAX_STEP_CHARTS]:
        svg, legend = charts.step_columns(rows, categories, duration_text=lambda ms: format_measure(ms, "ms"))
        shown = min(len(rows), charts.MAX_STEP_COLUMNS)
        title = "Time per step, split by category" + (f" — {kind} {name}" if len(by_participant) > 1 else "")
        if len(rows) > shown:
            title += f" (first {shown} of {len(rows)} steps)"
        part.blocks.append(Block(kind="chart", title=title, svg=svg,
                                 legend=[(c, color, meaning.get(c, "")) for c, color, _ in legend]))
    if len(charted) > MAX_STEP_CHARTS:
        part.blocks.append(Block(kind="text", muted=True, text=(
            f"Charts for the first {MAX_STEP_CHARTS} of {len(charted)} {kind}s; the rows below have them all.")))
    # Per-step category times are in ms: named so, each cell says its unit. A device's name includes its host.
    step_rows = [{("step_time_ms" if k == "step_ms" else f"{k}_ms" if k in categories else k): v
                  for k, v in s.items() if not (k == "host" and s.get("device"))} for s in steps]
    part.blocks += table_block(step_rows, "Per-step rows", limits, limit=MAX_STEP_ROWS,
                               preferred=("host", "device", "step", "step_time_ms", *(f"{c}_ms" for c in categories)))
    part.blocks += xprof_gap(r.detail)
    return section
