"""The roofline section: where each of the slowest ops sits against the device's roofs (memory bandwidth, compute),
and the whole program's roofline figures as xdiag and XProf measure them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xdiag.analysis.categories import TRANSFER_OP_CATEGORIES
from xdiag.model import ToolResult
from xdiag.report import charts
from xdiag.report.format import Block, Limits, format_measure, out_of_range, short_kernel_name
from xdiag.report.sections.parts import Section, kv_blocks, names_and_more, part_for, xprof_gap
from xdiag.report.sections.peaks import Peaks

MAX_OPS_ON_CHART = 40


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
        at_most = "≤ " if o.get("rates_are_upper_bounds") else ""
        tip = (f"{name} [{o.get('category')}]\n{format_measure(intensity, 'intensity')}, "
               f"{at_most}{format_measure(rate, 'GFLOP/s')}\n{format_measure(o.get('total_ms'), 'ms')} "
               f"({format_measure(share, '%')} of op time)")
        if o.get("roofline_efficiency_percent") is not None:
            tip += f"\n{at_most}{format_measure(o['roofline_efficiency_percent'], '%')} of its roof" + (
                " (an upper bound: full pages assumed)" if at_most else "")
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
                + f"): {names_and_more(no_flops)}.")))
        if flagged:
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"Not on the chart, their rates out of physical range: {names_and_more(flagged, 3)}.")))
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
                f"XProf's per-op rows put {names_and_more([str(row.get('op')) for row in impossible], 4)} above 100% of "
                "the roofline: not measurements, so not shown" + (f" ({why})" if why else "") + ".")))
        part.blocks += xprof_gap(r.detail)
    return section


# Shown in the "Roofs" line above the chart.
ROOFLINE_SHOWN_ABOVE = ("device_model", "peak_tflops", "peak_hbm_gb_per_s", "ridge_flop_per_byte", "flops_source",
                        "bandwidth_source", "peak_warnings", "peak_flop_rate_gflops", "peak_hbm_bw_gibs")


def _peaks_missing_reason(results: Mapping[str, ToolResult]) -> str:
    r = results.get("get_roofline_model")
    if r is not None and r.reason:
        return r.reason
    d = results.get("get_device_information")
    platform = (d.summary.get("platform") if d is not None and d.ok else None) or "this"
    return f"the {platform} profile records no peak FLOP rate or memory bandwidth"
