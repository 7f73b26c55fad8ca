"""Op time by kind, and the lines of the user's program that hold each (get_hlo_op_profile's op_time_by_kind, from
the HLO's Python stacks): the section that says which code to look at first."""

from __future__ import annotations

from collections.abc import Mapping

from xdiag.model import ToolResult
from xdiag.report.format import Block, Limits, format_measure, source_text
from xdiag.report.sections.parts import Section, part_for, table_block


def source_lines_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("source-lines", "Op time by kind, and the lines that hold it")
    part, r = part_for(results, "get_hlo_op_profile")
    section.parts.append(part)
    if r is None:
        return section
    kinds = [k for k in r.summary.get("op_time_by_kind") or [] if isinstance(k, Mapping)]
    rows = [{"kind": k.get("kind"), "share_of_op_time_percent": k.get("share_percent"), "total_ms": k.get("ms"),
             "source_lines": "; ".join(f"{source_text(line)}: {_line_share(line)}"
                                       for line in k.get("lines") or [] if isinstance(line, Mapping))
             or "no line recorded"} for k in kinds]
    part.blocks += table_block(rows, "", limits, empty="no op time recorded",
                               preferred=("kind", "share_of_op_time_percent", "total_ms", "source_lines"))
    missing = r.summary.get("source_lines_not_available")
    if missing:
        part.blocks.append(Block(kind="text", text=f"Source lines: not available: {missing}", muted=True))
    return section


def _line_share(line: Mapping) -> str:
    """A line's part of this kind, of all op time; and where its ops of other kinds add to it, the line's whole
    share, the one its findings give."""
    own, whole = line.get("share_percent"), line.get("line_share_percent")
    text = format_measure(own, "%")
    if isinstance(own, (int, float)) and isinstance(whole, (int, float)) and whole - own >= 0.01:
        text += f" ({format_measure(whole, '%')} in all)"
    return text

