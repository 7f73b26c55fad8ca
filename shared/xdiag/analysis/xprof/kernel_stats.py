"""The `kernel_stats` view. GPU kernels (XProf's kernel_stats converter).

Built once per session by XprofViews (views.py), which memoises it. From XProf's kernel_stats converter, not
`get_kernel_stats` (the CLI tool sums device-plane events by TF op name): the converter has the real per-kernel
table (registers, shared memory, grid, tensor-core use).
"""

from __future__ import annotations

from xdiag.analysis.xprof.common import (
    ViewSource,
    as_bool,
    as_int,
    as_non_negative,
    as_number,
    as_positive,
    datatable_rows,
    percent_of,
)
from xdiag.errors import NotAvailable


def build(views: ViewSource, top_n: int) -> dict:
    page = views.page("kernel_stats")
    rows = datatable_rows(page) if page is not None else []
    if not rows:
        device_type = views.device_type() or "unknown"
        if device_type.upper().startswith("TPU"):
            raise NotAvailable(
                f"XProf's kernel_stats lists GPU kernel launches; a TPU ({device_type}) runs XLA ops "
                "without kernel launches, see hlo_op_profile"
            )
        raise NotAvailable(
            f"XProf's kernel_stats found no GPU kernel events in this profile (device: {device_type})"
        )
    rows.sort(key=lambda r: -(as_number(r.get("total_duration_us")) or 0.0))
    total_us = sum(as_number(r.get("total_duration_us")) or 0.0 for r in rows)

    def time_where(flag: str) -> float:
        return sum(as_number(r.get("total_duration_us")) or 0.0 for r in rows if as_bool(r.get(flag)))

    kernels = [
        {
            "kernel_name": r.get("kernel_name"),
            "op_name": r.get("op_name") or None,
            "occurrences": as_int(r.get("occurrences")),
            "total_duration_us": as_number(r.get("total_duration_us")),
            "avg_duration_us": as_number(r.get("avg_duration_us")),
            "min_duration_us": as_number(r.get("min_duration_us")),
            "max_duration_us": as_number(r.get("max_duration_us")),
            "time_percent": percent_of(as_number(r.get("total_duration_us")), total_us),
            "registers_per_thread": as_positive(r.get("registers_per_thread")),
            "shmem_bytes": as_non_negative(r.get("shmem_bytes")),
            "block_dim": r.get("block_dim"),
            "grid_dim": r.get("grid_dim"),
            "occupancy_percent": as_positive(r.get("occupancy_pct")),
            "uses_tensor_core": as_bool(r.get("is_kernel_using_tensor_core")),
            "op_tensor_core_eligible": as_bool(r.get("is_op_tensor_core_eligible")),
        }
        for r in rows[:top_n]
    ]
    return {
        "kernel_count": len(rows),
        "kernel_launches": sum(as_int(r.get("occurrences")) or 0 for r in rows),
        "total_kernel_time_ms": round(total_us / 1000.0, 4),
        "top_kernel": kernels[0]["kernel_name"],
        "top_kernel_time_percent": kernels[0]["time_percent"],
        "tensor_core_time_percent": percent_of(time_where("is_kernel_using_tensor_core"), total_us),
        "tensor_core_eligible_time_percent": percent_of(time_where("is_op_tensor_core_eligible"), total_us),
        "detail": {
            "kernels": kernels,
            "note": (
                "one row per kernel, op and launch configuration; registers and occupancy are None where the "
                "trace does not record them (0 in XProf)"
            ),
        },
    }
