"""What the profile holds and how it was read: the HLO modules and devices sections, and the table of every tool
that ran with its status, time and reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdiag.model import ToolResult
from xdiag.report.format import Limits, Table, table
from xdiag.report.sections.parts import Section, kv_blocks, part_for, table_block


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


def tool_table(results: Mapping[str, ToolResult], order: Sequence[str]) -> Table | None:
    rank = {t: i for i, t in enumerate(order)}
    names = sorted(results, key=lambda t: (rank.get(t, len(rank)), t))
    return table([{"tool": t, "status": results[t].status.value, "duration_ms": results[t].duration_ms,
                   "source": results[t].source or None, "reason": results[t].reason} for t in names],
                 limit=len(names), shown=len(names))
