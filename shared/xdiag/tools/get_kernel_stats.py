"""get_kernel_stats: which GPU kernels take the time, and which XLA ops launched them?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.session_cache import cached
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.text_numbers import plain_number
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_kernel_stats",
    "GPU kernels by total time: launches, total and mean duration, the XLA op and module that launched each, "
    "and launch parameters where recorded. Not available on TPU or CPU profiles.",
    parameters={"top_n": {"type": "integer", "description": "how many kernels to list (1-200, default 20)",
                         "minimum": 1, "maximum": 200}},
)
def get_kernel_stats(session: Session, top_n: int = 20) -> ToolOutput:
    """summary: kernels, launches, total_kernel_ms, top_kernel, top_kernel_share_percent, mean_kernel_us,
    tensor_core_time_percent (XProf). detail: kernels [kernel, op, launches, total_ms, mean_us, share_percent,
    registers_per_thread, shared_memory_bytes, occupancy_percent, grid, block, tensor_core where known], xprof."""
    if session.platform != "GPU":
        raise NotAvailable(f"kernel statistics exist only for GPU profiles; this is a {session.platform} profile")
    table = cached(session, "kernel_table", lambda: combined_kernel_table([kernel_table(session)]))
    per_name = {row["kernel"]: dict(row) for row in table}
    if not per_name:
        raise NotAvailable("the GPU device planes hold no kernel events (only memory copies or nothing)")
    rows = sorted(per_name.values(), key=lambda r: -r["total_ps"])
    total = sum(r["total_ps"] for r in rows)
    for r in rows:
        r["total_ms"] = round(r.pop("total_ps") / 1e9, 4)
        r["mean_us"] = round(r["total_ms"] * 1e3 / r["launches"], 3)
        r["share_percent"] = round(100 * r["total_ms"] * 1e9 / total, 2) if total else 0.0
    view, reason = try_view(session, "kernel_stats", top_n=top_n)
    xprof_rows = {k.get("kernel_name"): k for k in ((view or {}).get("detail") or {}).get("kernels") or []}
    for r in rows:
        _add_launch_facts(r, xprof_rows.get(r["kernel"]))
    summary = {
        "kernels": len(rows), "launches": sum(r["launches"] for r in rows), "total_kernel_ms": round(total / 1e9, 4),
        "top_kernel": rows[0]["kernel"][:160], "top_kernel_share_percent": rows[0]["share_percent"],
        "mean_kernel_us": round(total / 1e6 / sum(r["launches"] for r in rows), 3),
    }
    if view is not None:
        for key in ("tensor_core_time_percent", "tensor_core_eligible_time_percent"):
            if view.get(key) is not None:
                summary[key] = view[key]
    detail: dict = {"kernels": rows[: max(top_n, 1)]}
    detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, "GPU device planes")


def kernel_table(session: Session) -> list[dict]:
    """The kernels of the session's GPU device planes in the order first launched: launches, total_ps, and the
    launching XLA op and launch details of the first launch on the last line that records them (per host, then combined:
    combined_kernel_table)."""
    per_name: dict[str, dict] = {}
    for plane in session.host_by_host(session.device_planes(with_events=True)):
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            hlo_op = line.strings.get("hlo_op")
            details = line.strings.get("kernel_details")
            uniq, inverse = np.unique(line.metadata_id, return_inverse=True)
            totals = np.bincount(inverse, weights=line.duration_ps.astype(float))
            counts = np.bincount(inverse)
            first = np.full(len(uniq), -1)
            first[inverse[::-1]] = np.arange(len(inverse))[::-1]
            for k, mid in enumerate(uniq):
                name = plane.event_names.get(int(mid), "")
                if name.startswith(("Memcpy", "Memset")):
                    continue
                row = per_name.setdefault(name, {"kernel": name, "launches": 0, "total_ps": 0.0})
                row["launches"] += int(counts[k])
                row["total_ps"] += float(totals[k])
                if hlo_op is not None and hlo_op[first[k]] >= 0:
                    row["hlo_op"] = plane.string(int(hlo_op[first[k]]))
                if details is not None and details[first[k]] >= 0:
                    row["kernel_details"] = plane.string(int(details[first[k]]))[:200]
    return list(per_name.values())


def combined_kernel_table(tables: list[list[dict]]) -> list[dict]:
    """kernel_table of several hosts (in the session's order), as kernel_table reads them together."""
    per_name: dict[str, dict] = {}
    for rows in tables:
        for row in rows:
            into = per_name.setdefault(row["kernel"], {"kernel": row["kernel"], "launches": 0, "total_ps": 0.0})
            into["launches"] += row["launches"]
            into["total_ps"] += row["total_ps"]
            into.update({key: row[key] for key in ("hlo_op", "kernel_details") if key in row})
    return list(per_name.values())


_DETAIL_FIELDS = {"regs": "registers_per_thread", "shm": "shared_memory_bytes", "group_mem": "shared_memory_bytes",
                  "occ_pct": "occupancy_percent", "grid": "grid", "block": "block"}


def _add_launch_facts(row: dict, xprof: dict | None) -> None:
    """Registers, shared memory, occupancy, grid/block, Tensor Core use and the launching op, from XProf's kernel
    stats where it has the kernel, else from the event's own `kernel_details` ("regs:38 shm:0 grid:160,1,1 …")."""
    for item in str(row.get("kernel_details") or "").split():
        key, _, value = item.partition(":")
        field = _DETAIL_FIELDS.get(key)
        if field in ("grid", "block"):
            row[field] = value
        elif field and plain_number(value) is not None:
            row[field] = plain_number(value)
    if row.get("occupancy_percent") == 0:
        row.pop("occupancy_percent")  # 0% occupancy is "not computed": a running kernel occupies something
    if xprof:
        for source, target in (("registers_per_thread", "registers_per_thread"), ("shmem_bytes", "shared_memory_bytes"),
                               ("occupancy_percent", "occupancy_percent"), ("uses_tensor_core", "tensor_core")):
            if xprof.get(source) is not None:
                row[target] = xprof[source]
        if xprof.get("op_name") and not row.get("hlo_op"):
            row["op"] = xprof["op_name"]
    if row.get("hlo_op"):
        row["op"] = row.pop("hlo_op")
