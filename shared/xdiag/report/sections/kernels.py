"""The kernel sections: GPU kernels by total time (kernel statistics), and every custom call and hand-written kernel
with its time share and, on TPU, the low-level data the capture carries (custom kernels).
"""

from __future__ import annotations

from collections.abc import Mapping

from xdiag.model import ToolResult
from xdiag.report.format import Block, Limits, short_kernel_name
from xdiag.report.sections.parts import Section, kv_blocks, names_and_more, part_for, table_block, xprof_gap


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
    part.blocks += xprof_gap(r.detail)
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
                f"FLOPs unknown for {names_and_more(unknown, 4)}" + (f": {reason}" if reason else "") + ".")))
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
