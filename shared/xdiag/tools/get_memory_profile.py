"""get_memory_profile: how much memory does the workload use over time, and how close to the limit?"""

from __future__ import annotations

import numpy as np

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import try_view, xprof_source
from xdiag.tools.registry import ToolOutput, tool

GIB = 2**30


def _allocator_events(session: Session) -> dict[str, np.ndarray] | None:
    """Allocator stats from MemoryAllocation/MemoryDeallocation events on host threads, if any."""
    peak, in_use, times = [], [], []
    for plane in session.host_planes():
        for line in plane.lines:
            column = line.numeric.get("peak_bytes_in_use")
            allocated = line.numeric.get("bytes_allocated")
            if column is None or allocated is None:
                continue
            mask = (column >= 0) & (allocated >= 0)
            peak.append(column[mask])
            in_use.append(allocated[mask])
            times.append(line.starts.at(mask))
    if not peak or not sum(len(p) for p in peak):
        return None
    return {"peak": np.concatenate(peak), "in_use": np.concatenate(in_use), "t": np.concatenate(times)}


@tool(
    "get_memory_profile",
    "Memory use over the profile: peak and average bytes in use, the memory capacity where the profile records "
    "it, headroom and out-of-memory risk (LOW/MEDIUM/HIGH).",
)
def get_memory_profile(session: Session) -> ToolOutput:
    """summary: peak_memory_gib, average_in_use_gib, capacity_gib, headroom_percent, oom_risk.
    From XProf's memory_profile on TPU/GPU; from allocator events on host threads otherwise."""
    if session.platform != "CPU":
        view, reason = try_view(session, "memory_profile")
        if view is not None:
            peak, capacity = view.get("peak_hbm_gib"), view.get("memory_capacity_gib")
            summary = {
                "peak_memory_gib": peak,
                "capacity_gib": capacity,
                "headroom_percent": round(100 * (1 - peak / capacity), 2) if peak and capacity else None,
                "oom_risk": _risk(peak, capacity),
                **{k: v for k, v in view.items() if k not in ("detail", "unavailable")},
            }
            return ToolOutput(summary, {"xprof": view}, xprof_source())
    else:
        reason = "CPU profiles have no device memory"
    events = _allocator_events(session)
    if events is None:
        raise NotAvailable(
            f"{reason}; and the host threads recorded no allocator events (MemoryAllocation with bytes stats)"
        )
    capacity = None
    for plane in session.device_planes():
        if plane.stats.get("memory_size"):
            capacity = float(plane.stats["memory_size"]) / GIB
            break
    peak = float(events["peak"].max()) / GIB
    summary = {
        "peak_memory_gib": round(peak, 4),
        "average_in_use_gib": round(float(events["in_use"].mean()) / GIB, 4),
        "capacity_gib": round(capacity, 3) if capacity else None,
        "headroom_percent": round(100 * (1 - peak / capacity), 2) if capacity else None,
        "oom_risk": _risk(peak, capacity),
        "allocator_events": int(len(events["peak"])),
    }
    return ToolOutput(summary, {"from": "allocator events on host threads", "xprof_reason": reason}, "allocator events")


def _risk(peak_gib: float | None, capacity_gib: float | None) -> str | None:
    """HIGH above 90% of capacity, MEDIUM above 75%, else LOW; None when either is unknown."""
    if not peak_gib or not capacity_gib:
        return None
    used = peak_gib / capacity_gib
    return "HIGH" if used > 0.9 else "MEDIUM" if used > 0.75 else "LOW"
