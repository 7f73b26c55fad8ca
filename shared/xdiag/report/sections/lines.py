"""Your code by device time (get_line_view): the user's lines and functions, each with its self and total time, the
host time the Python tracer recorded in it, its op kinds and rates, and the code; a table the reader sorts by any
column and whose rows open onto the code around the line, its callees and its ops (the template's script: plain
JavaScript inline, nothing fetched)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xdiag.model import ToolResult
from xdiag.report.format import Block, Limits, format_measure
from xdiag.report.sections.parts import Section, part_for
from xdiag.text_numbers import whole_number

MAX_ROWS = 50


@dataclass
class LineRow:
    """One row of the line table: its cells (text, and the number it sorts by) and what it opens onto."""

    cells: list[tuple[str, float | str]]  # (text shown, sort key)
    code: str = ""
    context: list[tuple[int, str, bool]] = field(default_factory=list)  # (number, text, is the line)
    facts: list[str] = field(default_factory=list)  # lines of detail: callees, ops, rates, why no code


@dataclass
class LineTable:
    title: str
    columns: list[tuple[str, bool]]  # (label, numeric)
    rows: list[LineRow]
    default_sort: int = 1  # the column the rows arrive sorted by (descending)


def _ms(value: Any) -> str:
    return format_measure(value, "ms") if isinstance(value, (int, float)) and value else "–"


def _percent(value: Any) -> str:
    return format_measure(value, "%") if isinstance(value, (int, float)) and value else "–"


def rate_text(row: Mapping[str, Any]) -> str:
    """`185 TFLOP/s (93.9% of the 16-bit roof), 222 GB/s (27.1% of HBM), compute-bound`; "" where none is costed."""
    parts = []
    if row.get("achieved_tflops_per_s"):
        text = format_measure(row["achieved_tflops_per_s"] * 1e3, "GFLOP/s")
        if row.get("flops_percent_of_roof") is not None:
            roof = f"the {'/'.join(row['precisions'])} roofs of its ops" if row.get("precisions") else \
                f"the {row.get('precision', '')} roof"
            text += f" ({format_measure(row['flops_percent_of_roof'], '%')} of {roof})"
        parts.append(text)
    if row.get("achieved_gb_per_s") is not None:
        text = format_measure(row["achieved_gb_per_s"], "GB/s")
        if row.get("hbm_percent_of_roof") is not None:
            text += f" ({format_measure(row['hbm_percent_of_roof'], '%')} of HBM)"
        parts.append(text)
    if row.get("fed_by_async_copies_percent"):
        parts.append(f"{format_measure(row['fed_by_async_copies_percent'], '%')} of its time fed by (or waiting for) "
                     f"its program's async copies into on-chip memory, which stream at "
                     f"{format_measure(row['program_hbm_gb_per_s'], 'GB/s')} "
                     f"({format_measure(row['program_hbm_efficiency_percent'], '%')} of HBM)")
    if row.get("data_on_chip"):
        parts.append("its data on chip (no HBM traffic)")
    if parts and row.get("rates_are_upper_bounds"):
        parts[0] = "at most " + parts[0]
    if parts and row.get("bound"):
        parts.append(f"{row['bound']}-bound")
    if parts and isinstance(row.get("measured_percent"), (int, float)) and row["measured_percent"] < 99.5:
        parts.append(f"over {format_measure(row['measured_percent'], '%')} of its time")
    return ", ".join(parts)


def _facts(row: Mapping[str, Any]) -> list[str]:
    facts = []
    rate = rate_text(row)
    if rate:
        facts.append(f"Rate: {rate}")
    if row.get("kinds"):
        facts.append("Op kinds: " + ", ".join(f"{k} {_ms(v)}" for k, v in row["kinds"].items()))
    if row.get("top_ops"):
        facts.append("Ops: " + ", ".join(f"{o['op']} {_ms(o['ms'])}" for o in row["top_ops"]))
    if row.get("modules"):
        facts.append("In nn.Module: " + ", ".join(f"{m['module']} {_ms(m['ms'])}" for m in row["modules"]))
    if row.get("callees"):
        facts.append("Calls: " + ", ".join(f"{c['line']} {_ms(c['ms'])}" for c in row["callees"][:8]))
    if row.get("host_kinds"):
        facts.append("Host time: " + ", ".join(f"{k} {_ms(v)}" for k, v in row["host_kinds"].items()))
    if row.get("file"):
        facts.append(f"Read from {row['file']}")
    elif row.get("code_not_available"):
        facts.append(f"Code: not available: {row['code_not_available']}")
    return facts


def _row(row: Mapping[str, Any], function: bool) -> LineRow:
    name = str(row.get("line", ""))
    cells: list[tuple[str, float | str]] = [(name, name)]
    if not function:
        cells.append((str(row.get("function") or ""), str(row.get("function") or "")))
    for key, show in (("self_ms", _ms), ("self_percent", _percent), ("total_ms", _ms), ("total_percent", _percent),
                      ("host_ms", _ms)):
        value = row.get(key) or 0
        cells.append((show(value), float(value)))
    kinds = ", ".join(row.get("kinds") or {})
    cells.append((kinds, kinds))
    line = whole_number(name.rpartition(":")[2], 0)
    context = [(int(n), str(text), int(n) == line) for n, text in row.get("context") or []]
    return LineRow(cells=cells, code=str(row.get("code") or ""), context=context, facts=_facts(row))


def lines_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("lines", "Your code by device time",
                      intro="Each line of your program with the device time of its ops: self, the ops whose "
                            "innermost frame of your code is the line; total, the ops anywhere below it in the "
                            "stack (its callees included). Click a column to sort by it, a row to see its code, "
                            "callees and ops.")
    part, r = part_for(results, "get_line_view")
    section.parts.append(part)
    if r is None:
        return section
    summary, detail = r.summary, r.detail
    missing = summary.get("source_lines_not_available")
    if missing:
        part.blocks.append(Block(kind="text", text=f"Source lines: not available: {missing}", muted=True))
    rows = [x for x in detail.get("lines") or [] if isinstance(x, Mapping)][:MAX_ROWS]
    functions = [x for x in detail.get("functions") or [] if isinstance(x, Mapping)][:MAX_ROWS]
    numbers = [("self", True), ("self %", True), ("total", True), ("total %", True), ("host", True),
               ("op kinds", False)]
    if rows:
        part.blocks.append(Block(kind="lines", lines=LineTable(
            title=f"Lines ({len(rows)} of {summary.get('lines', len(rows))})",
            columns=[("line", False), ("function", False), *numbers], rows=[_row(x, False) for x in rows],
            default_sort=2)))
    if functions:
        part.blocks.append(Block(kind="lines", lines=LineTable(
            title=f"Functions ({len(functions)} of {summary.get('functions', len(functions))}), by total",
            columns=[("function", False), *numbers], rows=[_row(x, True) for x in functions], default_sort=3)))
    if not rows and not functions:
        part.blocks.append(Block(kind="text", text="no op time and no Python frame recorded", muted=True))
    if summary.get("host_traced"):
        part.blocks.append(Block(kind="text", muted=True, text=(
            f"Host: {format_measure(summary.get('host_ms'), 'ms')} of the Python tracer's time in your frames; a "
            "line's host time is its frame's time with no deeper frame of yours (a frame is named by the line its "
            "function begins on).")))
    return section
