"""The op-profile section (the page's one op table: the slowest ops by category, with their rates) and the compiler
checks section (ops the compiler could have avoided, named and linked to that table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xdiag.model import ToolResult
from xdiag.report import charts
from xdiag.report.format import (
    Block,
    Cell,
    Column,
    Limits,
    Table,
    cell,
    format_measure,
    measured_cell,
    plain_text,
    short_kernel_name,
    short_shape,
    source_text,
)
from xdiag.report.sections.parts import TABLE_ROWS_SHOWN, Section, kv_blocks, names_and_more, part_for, xprof_gap
from xdiag.report.sections.roofline import ROOFLINE_SHOWN_ABOVE
from xdiag.report.summary import counted


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
                if value is not None and o.get("rates_are_upper_bounds") and key in UPPER_BOUND_COLUMNS:
                    c = Cell(text="≤ " + c.text, full=f"an upper bound: {o.get('cost_source', '')}", numeric=c.numeric)
            row.append(c)
        rows.append(row)
    # A column no op has a value in (no FLOPs on a profile without HLO) says nothing: left out.
    keep = [i for i, (key, _) in enumerate(OP_TABLE_COLUMNS) if key == "op" or any(not r[i].missing for r in rows)]
    return Table(columns=[columns[i] for i in keep], rows=[[r[i] for i in keep] for r in rows], total=len(rows),
                 shown=TABLE_ROWS_SHOWN, group_rows=groups)


UPPER_BOUND_COLUMNS = ("achieved_gflops_per_s", "achieved_gb_per_s", "roofline_efficiency_percent",
                      "flops_per_run", "bytes_per_run")
"""The columns a cost that is an upper bound (full pages assumed) makes upper bounds: shown with '≤'."""


def _op_origin(o: Mapping[str, Any]) -> str:
    source = o.get("source")
    bits = [str(o.get("module") or ""), str(o.get("framework_op") or ""),
            source_text(source) if isinstance(source, Mapping) else str(source or "")]
    return " · ".join(plain_text(b) for b in bits if b)


def op_profile_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("hlo-op-profile", "HLO op profile")
    part, r = part_for(results, "get_hlo_op_profile")
    section.parts.append(part)
    if r is None:
        return section
    figures = kv_blocks(r.summary, limits, skip=("category_percent", "top_op", "top_op_module", "top_op_category",
                                                 "top_op_share_percent", "top_category", *ROOFLINE_SHOWN_ABOVE))
    for block in figures:
        if block.kind == "kv":  # the tool's every field: the findings quote the ones that matter
            block.folded = f"all {len(block.kv)} figures of the op profile"
    part.blocks += figures
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
    part.blocks += xprof_gap(r.detail)
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
                f"time ({format_measure(s.get('total_ms'), 'ms')})" + (f": {names_and_more(names)}" if names else "") + ".")))
        coverage = s.get("op_time_with_hlo_percent")
        if coverage is not None and coverage < 100:
            part.blocks.append(Block(kind="text", muted=True, text=(
                f"Checked {format_measure(coverage, '%')} of op time (the ops whose HLO the profile carries).")))
    return section
