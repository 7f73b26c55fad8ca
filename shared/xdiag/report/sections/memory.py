"""The memory section: memory use and OOM risk, and the largest buffers."""

from __future__ import annotations

from collections.abc import Mapping

from xdiag.model import ToolResult
from xdiag.report.format import Limits, short_shape
from xdiag.report.sections.parts import Section, kv_blocks, part_for, table_block, xprof_gap


def memory_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    section = Section("memory", "Memory")
    part, r = part_for(results, "get_memory_profile", "Memory use and OOM risk")
    section.parts.append(part)
    if r is not None:
        part.blocks += kv_blocks(r.summary, limits) + xprof_gap(r.detail)
    part, r = part_for(results, "get_peak_allocations", "Largest buffers")
    section.parts.append(part)
    if r is not None:
        part.blocks += kv_blocks(r.summary, limits)
        buffers = [{**b, "shape": short_shape(b.get("shape"))} if isinstance(b, Mapping) and "shape" in b else b
                   for b in r.detail.get("buffers") or []]
        part.blocks += table_block(buffers, "Buffers", limits, empty="no buffers listed")
    return section
