"""The detail sections of the page, one per question, each built from the tool results that answer it.

Each fact has one table: the op table lives in the op-profile section only; other sections name ops and link to
it. A section whose tool did not run, failed or has no data for this platform says so, with the tool's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xdiag.analysis.categories import TRANSFER_OP_CATEGORIES
from xdiag.model import ToolResult, ToolStatus
from xdiag.report import charts
from xdiag.report.summary import counted
from xdiag.report.format import (
    Block,
    Cell,
    Column,
    Limits,
    Table,
    cell,
    format_measure,
    format_value,
    humanize_numbers,
    key_values,
    measured_cell,
    out_of_range,
    plain_text,
    short_kernel_name,
    short_shape,
    table,
    unit_of,
)

TABLE_ROWS_SHOWN = 10
MAX_STEP_CHARTS = 2
MIN_STEPS_CHARTED = 4  # a chart of one to three columns says no more than the rows do
MAX_STEP_ROWS = 400
MAX_OPS_ON_CHART = 40


@dataclass
class Part:
    """What one tool contributes to a section, or why it cannot."""

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


def part_for(results: Mapping[str, ToolResult], tool: str, heading: str = "") -> tuple[Part, ToolResult | None]:
    """A part for `tool`, with `unavailable` set (and None returned) unless the tool is ok."""
    r = results.get(tool)
    part = Part(heading=heading, tool=tool)
    if r is None:
        part.unavailable = f"not run: {tool} was not called for this profile"
        return part, None
    part.source = r.source
    if r.status == ToolStatus.NOT_AVAILABLE:
        part.unavailable = humanize_numbers(f"not available: {r.reason or 'no reason given'}")
        return part, None
    if r.status == ToolStatus.FAILED:
        part.unavailable = humanize_numbers(f"failed: {r.reason or 'no reason recorded'}")
        return part, None
    return part, r


def kv_blocks(data: Mapping[str, Any] | None, limits: Limits, title: str = "", skip: Sequence[str] = ()) -> list[Block]:
    """A summary as label/value pairs in their units; a value the tool marked missing shows the tool's reason."""
    data = dict(data or {})
    reasons: dict[str, Any] = {}
    for marker in ("unavailable", "not_available"):
        if isinstance(data.get(marker), Mapping):
            reasons.update(data.pop(marker))
    # A field the tool left empty with no word on why says nothing: left out (a reason, where given, is shown).
    data = {k: v for k, v in data.items() if v not in (None, [], {}, "") or k in reasons}
    rows = key_values(data, skip=skip, limits=limits)
    for row in rows:
        if row.value.missing and row.key in reasons:
            row.value = Cell(text=f"not available: {plain_text(format_value(reasons.pop(row.key)))}", missing=True)
    blocks = [Block(kind="kv", title=title, kv=rows)] if rows else []
    blocks += [Block(kind="text", text=f"{k.replace('_', ' ')}: not available: {format_value(v)}", muted=True)
               for k, v in reasons.items() if k not in data]
    return blocks


def table_block(rows: Any, title: str = "", limits: Limits = Limits(), empty: str = "", **options: Any) -> list[Block]:
    t = table(rows, limits=limits, shown=TABLE_ROWS_SHOWN, **options) if isinstance(rows, list) else None
    if t is None:
        return [Block(kind="text", text=empty, muted=True)] if empty else []
    return [Block(kind="table", title=title, table=t)]


def _xprof_gap(detail: Mapping[str, Any]) -> list[Block]:
    """One line where XProf's own view of this question is missing, with its reason."""
    xprof = detail.get("xprof")
    if isinstance(xprof, Mapping) and xprof.get("available") is False:
        return [Block(kind="text", text=f"XProf's view: not available: {xprof.get('reason') or 'no reason given'}",
                      muted=True)]
    return []


# ----------------------------------------------------------------------------------------------- peaks


@dataclass(frozen=True)
class Peaks:
    flops_per_s: float | None
    bytes_per_s: float | None
    source: str  # where they come from, in words
    note: str = ""  # the tools' word on how far to trust them (checked against a datasheet, recorded …)

    @property
    def limits(self) -> Limits:
        return Limits(self.flops_per_s, self.bytes_per_s)

    @property
    def known(self) -> bool:
        return bool(self.flops_per_s and self.bytes_per_s)


_BASE = {"GFLOP/s": 1e9, "TFLOP/s": 1e12, "GiB/s": 2.0**30, "GB/s": 1e9, "B/s": 1.0}
# Checked peaks (datasheet, cross-checked with what the profile records) first; XProf's recorded ones after.
CHECKED_PEAKS = (("peak_tflops", "peak_hbm_gb_per_s"),)
PEAK_NOTES = ("flops_source", "bandwidth_source", "peak_warnings")


def device_peaks(results: Mapping[str, ToolResult]) -> Peaks:
    """The device's peak FLOP rate and memory bandwidth as FLOP/s and bytes/s: the checked peaks where a tool
    states them, else the first recorded ones (device information, then XProf's roofline); with the tools' word
    on where they come from."""
    flops = bandwidth = None
    sources: list[str] = []
    notes: list[str] = []
    for tool in ("get_device_information", "get_roofline_model"):
        r = results.get(tool)
        if r is None or not r.ok:
            continue
        for key in PEAK_NOTES:
            value = r.summary.get(key)
            notes += [str(v) for v in (value if isinstance(value, list) else [value]) if v]
        keys = [k for pair in CHECKED_PEAKS for k in pair if k in r.summary] + list(r.summary)
        for key in keys:
            value, k = r.summary[key], key.lower()
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 or "recorded" in k:
                continue
            unit = unit_of(key)
            if flops is None and "peak" in k and unit in ("GFLOP/s", "TFLOP/s"):
                flops = value * _BASE[unit]
                sources.append(tool)
            elif bandwidth is None and ("peak" in k or k == "memory_bandwidth") and unit in ("GiB/s", "GB/s", "B/s"):
                bandwidth = value * _BASE[unit]
                sources.append(tool)
    notes = [n.replace("datasheet (", "datasheet: ").rstrip(")") if n.startswith("datasheet (") else n for n in notes]
    return Peaks(flops, bandwidth, ", ".join(dict.fromkeys(sources)), "; ".join(dict.fromkeys(notes)))


# ------------------------------------------------------------------------------------------- sections


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
    part.blocks += _xprof_gap(r.detail)
    return section


def _op_points(ops: Sequence[Mapping[str, Any]], limits: Limits
               ) -> tuple[list[dict], list[str], tuple[float, float], list[str]]:
    """Chart points of the ops that have both an intensity and a FLOP rate; the names of ops left off because
    they do no arithmetic (and their share of op time, and the transfers' part of it); the names left off as out of
    range."""
    points, no_flops, flagged = [], [], []
    no_flops_share = no_flops_transfer_share = 0.0
    names = [str(o.get("op")) for o in ops[:MAX_OPS_ON_CHART]]
    for o in ops[:MAX_OPS_ON_CHART]:
        intensity = o.get("arithmetic_intensity_flops_per_byte")
        rate = o.get("achieved_gflops_per_s")
        share = o.get("share_of_op_time_percent") or 0.0
        name = short_kernel_name(str(o.get("op") or "?"), 60)
        if names.count(str(o.get("op"))) > 1 and o.get("module"):
            name += f" ({o['module']})"  # one op name in several programs: the program tells them apart
        if not isinstance(intensity, (int, float)) or not isinstance(rate, (int, float)) or intensity <= 0 or rate <= 0:
            no_flops.append(name)
            no_flops_share += share if isinstance(share, (int, float)) else 0.0
            if o.get("category") in TRANSFER_OP_CATEGORIES and isinstance(share, (int, float)):
                no_flops_transfer_share += share
            continue
        reason = out_of_range("achieved_gflops_per_s", rate, limits) or out_of_range(
            "achieved_gb_per_s", o.get("achieved_gb_per_s"), limits) or out_of_range(
            "achieved_gib_per_s", o.get("achieved_gib_per_s"), limits)
        if reason:
            flagged.append(f"{name} ({reason})")
            continue
        tip = (f"{name} [{o.get('category')}]\n{format_measure(intensity, 'intensity')}, "
               f"{format_measure(rate, 'GFLOP/s')}\n{format_measure(o.get('total_ms'), 'ms')} "
               f"({format_measure(share, '%')} of op time)")
        if o.get("roofline_efficiency_percent") is not None:
            tip += f"\n{format_measure(o['roofline_efficiency_percent'], '%')} of its roof"
        elif limits.peak_flops_per_s and limits.peak_bytes_per_s:
            roof = min(limits.peak_flops_per_s, limits.peak_bytes_per_s * intensity)
            tip += f"\n{format_measure(100 * rate * 1e9 / roof, '%')} of its roof"
        points.append({"label": name, "intensity": float(intensity), "flops_per_s": float(rate) * 1e9,
                       "time_share": float(share) / 100, "category": str(o.get("category") or "other"), "tip": tip})
    return points, no_flops, (no_flops_share, no_flops_transfer_share), flagged


def roofline_section(results: Mapping[str, ToolResult], peaks: Peaks) -> Section:
    section = Section("roofline", "Roofline",
                      intro="Each op at its arithmetic intensity (FLOP per byte moved) and achieved FLOP rate; the "
                            "area of a point follows its share of op time. Left of the ridge point an op is limited "
                            "by memory bandwidth, right of it by compute.")
    part, ops_result = part_for(results, "get_hlo_op_profile", "Ops on the roofline")
    section.parts.append(part)
    if ops_result is not None:
        ops = [o for o in ops_result.detail.get("ops") or [] if isinstance(o, Mapping)]
        points, no_flops, (no_flops_share, transfer_share), flagged = _op_points(ops, peaks.limits)
        if peaks.known:
            part.blocks.append(Block(kind="text", text=(
                f"Roofs: compute {format_measure(peaks.flops_per_s / 1e9, 'GFLOP/s')}, memory bandwidth "
                f"{format_measure(peaks.bytes_per_s, 'B/s')}, ridge point "
                f"{format_measure(peaks.flops_per_s / peaks.bytes_per_s, 'intensity')} (from {peaks.source})"
                + (f"; {peaks.note}" if peaks.note else "") + ".")))
        else:
            why = _peaks_missing_reason(results)
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"No roofs: the device's peaks are unknown ({why}). The chart shows each op's measured intensity "
                "and FLOP rate without them.")))
        if points:
            svg, legend = charts.roofline_chart(
                points, peaks.flops_per_s if peaks.known else None, peaks.bytes_per_s if peaks.known else None,
                rate_text=lambda v: format_measure(v / 1e9, "GFLOP/s"),
                intensity_text=lambda v: format_measure(v, "intensity").removesuffix(" FLOP/B"),
            )
            part.blocks.append(Block(kind="chart", title=f"Roofline: {len(points)} of the slowest ops", svg=svg,
                                     legend=legend))
        else:
            part.blocks.append(Block(kind="text", muted=True,
                                     text="No op has both a FLOP count and a measured time, so none can be placed."))
        if no_flops:
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"Not on the chart: {len(no_flops)} ops with no FLOPs known or none done "
                f"({format_measure(no_flops_share, '%')} of op time"
                # Copies are outside the roofline's compute op time: say so, or 'costed 100%' reads as a contradiction.
                + (f", {format_measure(transfer_share, '%')} in copies and transfers, which the roofline leaves out"
                   if transfer_share >= 1 else "")
                + f"): {_names(no_flops)}.")))
        if flagged:
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"Not on the chart, their rates out of physical range: {_names(flagged, 3)}.")))
    part, r = part_for(results, "get_roofline_model", "The whole program")
    section.parts.append(part)
    if r is not None:
        summary = {k: v for k, v in r.summary.items() if k not in ROOFLINE_SHOWN_ABOVE}
        own = {k: v for k, v in summary.items()
               if k.startswith(("op_time_", "costed_op_time", "time_basis", "roofline_unavailable"))}
        xprof = {k.removeprefix("xprof_"): v for k, v in summary.items() if k not in own}
        if own:
            part.blocks += kv_blocks(own, peaks.limits, title="xdiag, over device op time (idle excluded)")
        part.blocks += kv_blocks(xprof, peaks.limits, title="XProf, over the whole program (idle included)"
                                 if own else "", skip=("impossible_op_rows", "note"))
        impossible = [row for row in r.summary.get("xprof_impossible_op_rows") or [] if isinstance(row, Mapping)]
        if impossible:
            why = next((row.get("why") for row in impossible if row.get("why")), "")
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"XProf's per-op rows put {_names([str(row.get('op')) for row in impossible], 4)} above 100% of "
                "the roofline: not measurements, so not shown" + (f" ({why})" if why else "") + ".")))
        part.blocks += _xprof_gap(r.detail)
    return section


# Shown in the "Roofs" line above the chart.
ROOFLINE_SHOWN_ABOVE = ("device_model", "peak_tflops", "peak_hbm_gb_per_s", "ridge_flop_per_byte", "flops_source",
                        "bandwidth_source", "peak_warnings", "peak_flop_rate_gflops", "peak_hbm_bw_gibs")


def _names(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _peaks_missing_reason(results: Mapping[str, ToolResult]) -> str:
    r = results.get("get_roofline_model")
    if r is not None and r.reason:
        return r.reason
    d = results.get("get_device_information")
    platform = (d.summary.get("platform") if d is not None and d.ok else None) or "this"
    return f"the {platform} profile records no peak FLOP rate or memory bandwidth"


OP_TABLE_COLUMNS = (
    ("op", "op"), ("count", "runs"), ("total_ms", "total"), ("avg_us", "mean"), ("share_of_op_time_percent", "share"),
    ("arithmetic_intensity_flops_per_byte", "intensity"), ("achieved_gflops_per_s", "FLOP rate"),
    ("achieved_gb_per_s", "bandwidth"), ("roofline_efficiency_percent", "of roof"), ("shape", "shape"),
)


def slowest_ops_table(ops: Sequence[Mapping[str, Any]], categories_ms: Mapping[str, Any], limits: Limits) -> Table:
    """The slowest ops, grouped by category (largest first), each op with its module, framework op and source
    line under its name."""
    order = {c: i for i, c in enumerate(categories_ms)}
    grouped = sorted(ops, key=lambda o: (order.get(o.get("category"), len(order)), -(o.get("total_ms") or 0)))
    total_ms = sum(v for v in categories_ms.values() if isinstance(v, (int, float))) or None
    columns = [Column(key, label) for key, label in OP_TABLE_COLUMNS]
    rows, groups, seen = [], {}, set()
    for o in grouped:
        category = str(o.get("category") or "other")
        if category not in seen:
            seen.add(category)
            ms = categories_ms.get(category)
            share = f", {format_measure(100 * ms / total_ms, '%')} of op time" if ms is not None and total_ms else ""
            groups[len(rows)] = f"{category}: {format_measure(ms, 'ms')}{share}" if ms is not None else category
        row = []
        for key, _ in OP_TABLE_COLUMNS:
            value = o.get(key)
            if key == "op":
                name = plain_text(str(value))
                short = short_kernel_name(name)
                c = Cell(text=short, full=name if short != name else None, sub=_op_origin(o))
            elif key == "shape":
                c = cell(short_shape(value)) if value is not None else Cell(text="", missing=True)
            elif value is None and key.startswith("achieved") and o.get("rate_not_measured_because"):
                c = Cell(text="not measured", full=str(o["rate_not_measured_because"]), missing=True)
            elif key == "achieved_gb_per_s" and value is None and o.get("operands_on_chip_inferred"):
                c = Cell(text="on chip", full=str(o["operands_on_chip_inferred"]), missing=True)
            elif key == "achieved_gb_per_s" and value is None and o.get("achieved_gb_per_s_floor") is not None:
                c = Cell(text="≥ " + format_measure(o["achieved_gb_per_s_floor"], "GB/s"), full=str(o.get("floor_basis", "")))
            elif key == "achieved_gb_per_s" and value is None and o.get("achieved_gib_per_s") is not None:
                c = measured_cell("achieved_gib_per_s", o["achieved_gib_per_s"], limits)  # before checked peaks
            else:
                c = measured_cell(key, value, limits) if value is not None else Cell(text="", missing=True)
            row.append(c)
        rows.append(row)
    # A column no op has a value in (no FLOPs on a profile without HLO) says nothing: left out.
    keep = [i for i, (key, _) in enumerate(OP_TABLE_COLUMNS) if key == "op" or any(not r[i].missing for r in rows)]
    return Table(columns=[columns[i] for i in keep], rows=[[r[i] for i in keep] for r in rows], total=len(rows),
                 shown=TABLE_ROWS_SHOWN, group_rows=groups)


def _op_origin(o: Mapping[str, Any]) -> str:
    bits = [str(o.get("module") or ""), str(o.get("framework_op") or ""), str(o.get("source") or "")]
    return " · ".join(plain_text(b) for b in bits if b)


def op_profile_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("hlo-op-profile", "HLO op profile")
    part, r = part_for(results, "get_hlo_op_profile")
    section.parts.append(part)
    if r is None:
        return section
    part.blocks += kv_blocks(r.summary, limits, skip=("category_percent", "top_op", "top_op_module", "top_op_category",
                                                      "top_op_share_percent", "top_category", *ROOFLINE_SHOWN_ABOVE))
    categories = r.detail.get("categories_ms") or {}
    if categories:
        svg = charts.horizontal_bars(categories, value_text=lambda ms: format_measure(ms, "ms"))
        part.blocks.append(Block(kind="chart", title="Op time by category", svg=svg))
    ops = [o for o in r.detail.get("ops") or [] if isinstance(o, Mapping)]
    if ops:
        part.blocks.append(Block(kind="table", title=f"Slowest {len(ops)} ops, by category",
                                 table=slowest_ops_table(ops, categories, limits)))
        partial = [o for o in ops if o.get("rates_over")]
        if partial:  # a PyTorch kernel row rated over the runs a costed CPU op launched, not all of them
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"FLOPs and rates of {len(partial)} of these ops are over some of their runs only ("
                f"{str(partial[0].get('op'))[:60]}: over {partial[0]['rates_over']}).")))
    else:
        part.blocks.append(Block(kind="text", text="no ops listed", muted=True))
    if r.detail.get("note"):
        part.blocks.append(Block(kind="text", text=str(r.detail["note"]), muted=True))
    part.blocks += _xprof_gap(r.detail)
    return section


CHECKS = (
    ("detect_layout_mismatch_copies", "Layout-changing copies and transposes"),
    ("detect_unfused_reshapes", "Unfused reshapes, transposes and copies"),
    ("detect_unnecessary_convert_reduce", "Widening converts around reductions"),
)


def compiler_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("compiler-checks", "Compiler checks",
                      intro="Ops the compiler could have avoided; each op's time and shape are in the op table.")
    for tool, heading in CHECKS:
        part, r = part_for(results, tool, heading)
        section.parts.append(part)
        if r is None:
            continue
        ops = [o for o in r.detail.get("ops") or [] if isinstance(o, Mapping)]
        s = r.summary
        if not ops and not s.get("count"):
            part.blocks.append(Block(kind="text", text="none found", muted=True))
        else:
            names = [f"{o.get('op')} ({format_measure(o.get('total_ms'), 'ms')})" for o in ops]
            part.blocks.append(Block(kind="text", text=(
                f"{counted(s.get('count') or len(ops), 'op')}, {format_measure(s.get('share_of_op_time_percent'), '%')} of op "
                f"time ({format_measure(s.get('total_ms'), 'ms')})" + (f": {_names(names)}" if names else "") + ".")))
        coverage = s.get("op_time_with_hlo_percent")
        if coverage is not None and coverage < 100:
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"Checked {format_measure(coverage, '%')} of op time (the ops whose HLO the profile carries).")))
    return section


KERNEL_COLUMNS = (
    "kernel", "op", "launches", "total_ms", "mean_us", "share_percent", "registers_per_thread", "shared_memory_bytes",
    "occupancy_percent", "tensor_core",
)


def kernel_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("kernel-stats", "Kernel statistics", intro="GPU kernels by total time.")
    part, r = part_for(results, "get_kernel_stats")
    section.parts.append(part)
    if r is None:
        return section
    part.blocks += kv_blocks(r.summary, limits, skip=("top_kernel",))
    rows = []
    for k in r.detail.get("kernels") or []:
        if not isinstance(k, Mapping):
            continue
        name = str(k.get("kernel") or "")
        row = {key: k.get(key) for key in KERNEL_COLUMNS if k.get(key) is not None}
        row["kernel"] = short_kernel_name(name)
        if k.get("op") or k.get("hlo_op"):
            row["op"] = k.get("op") or k.get("hlo_op")
        if isinstance(k.get("tensor_core"), bool):
            row["tensor_core"] = "yes" if k["tensor_core"] else "no"
        rows.append(row)
    part.blocks += table_block(rows, "Kernels", limits, empty="no kernels listed", preferred=KERNEL_COLUMNS,
                               only=KERNEL_COLUMNS, labels={"shared_memory_bytes": "shared memory",
                                                            "registers_per_thread": "registers",
                                                            "occupancy_percent": "occupancy",
                                                            "tensor_core": "Tensor Core", "share_percent": "share"})
    part.blocks += _xprof_gap(r.detail)
    return section


CUSTOM_COLUMNS = (
    "op", "kind", "count", "total_ms", "share_of_op_time_percent", "flops_per_run", "bytes_per_run",
    "achieved_gflops_per_s", "efficiency_percent",
)


def custom_kernel_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("custom-kernels", "Custom kernels",
                      intro="Every custom call and hand-written kernel (Pallas, Mosaic, Triton, library GEMMs and "
                            "convolutions) with its time share, and on TPU the low-level data the capture carries.")
    part, r = part_for(results, "get_custom_kernels")
    section.parts.append(part)
    if r is None:
        return section
    kernels = [k for k in r.detail.get("kernels") or [] if isinstance(k, Mapping)]
    if kernels:
        part.blocks += kv_blocks(r.summary, limits, skip=("low_level",))
        part.blocks += table_block(kernels, "", limits, preferred=CUSTOM_COLUMNS, only=CUSTOM_COLUMNS,
                                   labels={"share_of_op_time_percent": "share", "flops_per_run": "FLOPs/run",
                                           "bytes_per_run": "bytes/run", "achieved_gflops_per_s": "FLOP rate",
                                           "efficiency_percent": "of peak"})
        unknown = [str(k.get("op")) for k in kernels if k.get("flops_per_run") is None]
        if unknown:
            reason = next((k.get("flops_unknown_because") for k in kernels if k.get("flops_unknown_because")), "")
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"FLOPs unknown for {_names(unknown, 4)}" + (f": {reason}" if reason else "") + ".")))
    else:
        part.blocks.append(Block(kind="text", muted=True, text=r.detail.get("none_because") or
                                 "none in this profile: no custom call or hand-written kernel ran"))
    low = r.detail.get("low_level")
    if isinstance(low, Mapping):
        if low.get("available"):
            part.blocks += table_block(low.get("lines"), "Low-level lines in the capture (LLO, counters)", limits)
        elif low.get("reason"):
            part.blocks.append(Block(kind="text", muted=True, text=f"LLO and counter data: not available: {low['reason']}"))
    return section


def memory_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("memory", "Memory")
    part, r = part_for(results, "get_memory_profile", "Memory use and OOM risk")
    section.parts.append(part)
    if r is not None:
        part.blocks += kv_blocks(r.summary, limits) + _xprof_gap(r.detail)
    part, r = part_for(results, "get_peak_allocations", "Largest buffers")
    section.parts.append(part)
    if r is not None:
        part.blocks += kv_blocks(r.summary, limits)
        buffers = [{**b, "shape": short_shape(b.get("shape"))} if isinstance(b, Mapping) and "shape" in b else b
                   for b in r.detail.get("buffers") or []]
        part.blocks += table_block(buffers, "Buffers", limits, empty="no buffers listed")
    return section


def modules_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("modules", "HLO modules")
    part, r = part_for(results, "list_hlo_modules")
    section.parts.append(part)
    if r is not None:
        part.blocks += kv_blocks(r.summary, limits)
        part.blocks += table_block(r.detail.get("modules"), "", limits, empty="no modules listed")
    return section


# XProf's own names for the peaks the profile records (TPU planes, GPU planes), which get_device_information
# restates as recorded_peak_*.
RECORDED_PEAK_FIELDS = ("peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second", "memory_bandwidth")


def device_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("devices", "Devices")
    part, r = part_for(results, "get_device_information")
    section.parts.append(part)
    if r is not None:
        # The peaks the profile records are shown once, as "recorded peak" beside the checked ones.
        restated = RECORDED_PEAK_FIELDS if any(k.startswith("recorded_peak") for k in r.summary) else ()
        part.blocks += kv_blocks(r.summary, limits, skip=restated)
        devices = r.detail.get("devices")
        if isinstance(devices, list) and devices:
            busy = [d for d in devices if isinstance(d, Mapping) and d.get("events")]
            part.blocks += table_block(devices, f"Devices ({len(busy)} of {len(devices)} with events)", limits,
                                       preferred=("host", "plane", "events"))
    return section


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
    covers = (f" XProf's figures cover all {hosts:g} hosts of the session together (its converters combine every "
              "host's file, ALL_HOSTS; memory is the peak of the hosts' allocators); xdiag's are averaged over the "
              "active devices of every host." if hosts and hosts > 1 else "")
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


HOST_COLUMNS = ("host", "rank", "steps", "step_time_ms_mean", "compute_percent", "collective_percent",
                "host_other_percent",
                "host_other_ms_per_step", "collective_wait_ms_per_step", "last_arrivals", "last_arrival_share_percent",
                "caused_wait_ms_per_step")
DEVICE_COLUMNS = ("device", "steps", "step_ms_mean", "compute_percent", "collective_percent", "transfer_percent",
                  "idle_percent", "busy_percent")


def _breakdown_of(row: Mapping[str, Any]) -> dict[str, float]:
    """A participant's step-time breakdown: its `breakdown_percent`, or its `<category>_percent` fields."""
    given = row.get("breakdown_percent")
    if isinstance(given, Mapping):
        return {str(k): v for k, v in given.items() if isinstance(v, (int, float))}
    return {c: row[f"{c}_percent"] for c in charts.STEP_CATEGORY_COLORS
            if isinstance(row.get(f"{c}_percent"), (int, float))}


def _aligned_picture(instances: Any) -> dict | None:
    """One collective instance as the aligned picture: the typical one (its arrival skew nearest the mean), each
    participant in the collective from its arrival to the common end (time 0), the window from the first arrival."""
    rows = [i for i in instances or [] if isinstance(i, Mapping) and isinstance(i.get("arrival_before_end_ms"), Mapping)]
    if not rows:
        return None
    mean = sum(_number(i.get("skew_ms")) for i in rows) / len(rows)
    instance = min(rows, key=lambda i: abs(_number(i.get("skew_ms")) - mean))
    arrivals = {str(k): _number(v) for k, v in instance["arrival_before_end_ms"].items()}
    first = max(arrivals.values())
    return {"step": instance.get("step"), "collective": instance.get("op"), "participants": [
        {"participant": name, "step_start_ms": -first, "step_end_ms": 0.0, "collective_start_ms": -before,
         "collective_end_ms": 0.0} for name, before in arrivals.items()]}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


HOST_BARS_EACH_END = 5
"""Above twice this many hosts, the breakdown bars show this many from each end of the hosts' order."""
_DISTRIBUTED = (("step_time_ms_mean", "step time"), ("collective_wait_ms_per_step", "waiting in collectives per step"),
                ("host_other_ms_per_step", "host/input work per step"))


def _standing_out(host: Mapping[str, Any]) -> tuple[float, float, float]:
    """How much a host stands out among many: how often it arrives last at the collectives, the wait it causes the
    others, then its step time."""
    return (_number(host.get("last_arrival_share_percent")), _number(host.get("caused_wait_ms_per_step")),
            _number(host.get("step_time_ms_mean")))


def _host_distribution(hosts: list[Mapping[str, Any]]) -> list[Block]:
    """Per measure the hosts report, its spread over the hosts: least, quartiles, most, and which hosts are at the
    ends (a table of 64 equal rows says less than this)."""
    rows = []
    for key, label in _DISTRIBUTED:
        values = sorted(((_number(h[key]), str(h.get("host"))) for h in hosts
                         if isinstance(h.get(key), (int, float)) and not isinstance(h.get(key), bool)))
        if len(values) < 2:
            continue
        numbers = [v for v, _ in values]

        def at(q: float) -> float:
            return numbers[min(len(numbers) - 1, round(q * (len(numbers) - 1)))]

        rows.append({"measure": label, "hosts": len(values), "least_ms": numbers[0], "least_host": values[0][1],
                     "p25_ms": at(0.25), "median_ms": at(0.5), "p75_ms": at(0.75), "most_ms": numbers[-1],
                     "most_host": values[-1][1]})
    return table_block(rows, f"Over the {len(hosts)} hosts")


def hosts_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    """One row per host, side by side; where a straggler is named, one step on every host on one aligned axis;
    then the per-device spread."""
    section = Section("hosts", "Hosts and devices")
    part, r = part_for(results, "get_hosts")
    section.parts.append(part)
    if r is None:
        return section
    hosts = [h for h in r.detail.get("hosts") or [] if isinstance(h, Mapping)]
    devices = [d for d in r.detail.get("devices") or [] if isinstance(d, Mapping)]
    part.blocks += kv_blocks(r.summary, limits)
    if len(hosts) > 1:
        # A host's own row and its row as a collective participant (arrivals, waits caused) side by side.
        joined = {str(p.get("participant")): p for p in r.detail.get("participants") or [] if isinstance(p, Mapping)}
        hosts = [{**joined.get(str(h.get("host")), {}), **h} for h in hosts]
        many = len(hosts) > TABLE_ROWS_SHOWN
        if many:  # the hosts that stand out first, not the first hosts in file order
            hosts = sorted(hosts, key=_standing_out, reverse=True)
            part.blocks += _host_distribution(hosts)
        part.blocks += table_block([{k: h[k] for k in HOST_COLUMNS if k in h} for h in hosts],
                                   "One row per host" + (", the latest to arrive and the slowest first" if many else ""),
                                   limits, labels={"host_other_percent": "host/input"})
        pictured = hosts if len(hosts) <= 2 * HOST_BARS_EACH_END else hosts[:HOST_BARS_EACH_END] + hosts[-HOST_BARS_EACH_END:]
        bars = []
        for h in pictured:
            breakdown = _breakdown_of(h)
            if breakdown:
                svg, _ = charts.breakdown_bar(breakdown, None, height=18.0, labels=False)
                bars.append((str(h.get("host")), svg))
        if bars:
            shown = {c for h in pictured for c, v in _breakdown_of(h).items() if v}
            title = ("Step-time breakdown per host" if pictured is hosts else
                     f"Step-time breakdown of the {HOST_BARS_EACH_END} hosts that stand out most and the "
                     f"{HOST_BARS_EACH_END} that stand out least, of {len(hosts)}")
            part.blocks.append(Block(kind="bars", title=title, bars=bars, legend=[
                (c, charts.color_for(c, i), "") for i, c in enumerate(charts.STEP_CATEGORY_COLORS) if c in shown]))
    else:
        name = hosts[0].get("host") if hosts else None
        rank, world = (hosts[0].get("rank"), hosts[0].get("world_size")) if hosts else (None, None)
        part.blocks.append(Block(kind="text", muted=True, text=(
            f"One rank ({name}: rank {rank} of {world}): the other ranks' traces are not in the session, so there is "
            "nothing to compare it with." if rank is not None and (world or 0) > 1 else
            f"One host{f' ({name})' if name else ''}: nothing to compare across hosts.")))
    timeline = r.detail.get("straggler_timeline") or _aligned_picture(r.detail.get("aligned_instances"))
    straggler = r.summary.get("straggler_host") or r.summary.get("straggler")
    if isinstance(timeline, Mapping) and timeline.get("participants"):
        svg = charts.host_timeline(timeline, duration_text=lambda ms: format_measure(ms, "ms"))
        count = sum(isinstance(p, Mapping) for p in timeline["participants"])
        on = ("every participant" if count <= charts.ALIGNED_ROWS else
              f"{charts.ALIGNED_ROWS} of the {count} participants (the {charts.ALIGNED_ROWS // 2} first and the "
              f"{charts.ALIGNED_ROWS // 2} last to arrive)")
        part.blocks.append(Block(kind="chart", svg=svg, title=(
            f"One step on {on}, aligned on the end of {timeline.get('collective') or 'the collective'}"
            + (f" (step {timeline.get('step')})" if timeline.get("step") is not None else "")
            + (f": {straggler} arrives last" if straggler else "")
            + ". Purple: time in the collective, waiting for the others.")))
    elif straggler:
        part.blocks.append(Block(kind="text", muted=True, text=(
            "The aligned timeline of one step per host is not available: get_hosts reported no collective instance "
            "to align on.")))
    if len(devices) > 1:
        part.blocks += table_block([{k: d[k] for k in DEVICE_COLUMNS if k in d} for d in devices],
                                   f"Per device ({len(devices)})", limits, labels={"step_ms_mean": "step time"})
    return section


def tool_table(results: Mapping[str, ToolResult], order: Sequence[str]) -> Table | None:
    rank = {t: i for i, t in enumerate(order)}
    names = sorted(results, key=lambda t: (rank.get(t, len(rank)), t))
    return table([{"tool": t, "status": results[t].status.value, "duration_ms": results[t].duration_ms,
                   "source": results[t].source or None, "reason": results[t].reason} for t in names],
                 limit=len(names), shown=len(names))


Builder = Callable[[Mapping[str, ToolResult], Limits], Section]

__all__ = ["Section", "Part", "device_peaks", "Peaks", "short_kernel_name", "short_shape"]
