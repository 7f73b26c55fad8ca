"""The pieces every detail section is made of: a Section of Parts, one Part per tool, and the blocks a Part shows.

A part whose tool did not run, failed or has no data for this platform says so, with the tool's reason
(`part_for`); the helpers here turn a tool's summary and rows into label/value pairs and tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xdiag.model import ToolResult, ToolStatus
from xdiag.report.format import Block, Cell, Limits, format_value, humanize_numbers, key_values, plain_text, table

TABLE_ROWS_SHOWN = 10


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


def xprof_gap(detail: Mapping[str, Any]) -> list[Block]:
    """One line where XProf's own view of this question is missing, with its reason."""
    xprof = detail.get("xprof")
    if isinstance(xprof, Mapping) and xprof.get("available") is False:
        return [Block(kind="text", text=f"XProf's view: not available: {xprof.get('reason') or 'no reason given'}",
                      muted=True)]
    return []


def names_and_more(names: Sequence[str], limit: int = 6) -> str:
    """The first `limit` names, and how many more there are."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
