"""How much device memory the program uses against how much it may use: the peak, the device's memory or the
allocator's limit where that is lower, the headroom and the out-of-memory risk. From XProf's memory profile on a TPU
or GPU; from the allocator events on host threads otherwise. get_memory_profile answers it; the idiom catalogue reads
it where an idiom's premise is the memory left free (recomputation the memory does not need)."""

from __future__ import annotations

from typing import Any

from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session

GIB = 2**30


def allocator_totals(session: Session) -> dict | None:
    """What the host threads' allocator events (MemoryAllocation/MemoryDeallocation with bytes stats) say over the
    session: peak_bytes (the largest peak in use), in_use_bytes_sum and events (for the mean in use); None where
    there are none. Cached: a session assembled from host summaries carries it (xdiag.analysis.host_summary)."""
    if "allocator_totals" in session.cache:
        return session.cache["allocator_totals"]
    peak, in_use, events = None, 0, 0
    for plane in session.host_by_host(session.host_planes()):
        for line in plane.lines:
            column = line.numeric.get("peak_bytes_in_use")
            allocated = line.numeric.get("bytes_allocated")
            if column is None or allocated is None:
                continue
            mask = (column >= 0) & (allocated >= 0)
            if mask.any():
                peak = max(int(column[mask].max()), peak if peak is not None else 0)
                in_use += int(allocated[mask].sum())
                events += int(mask.sum())
    session.cache["allocator_totals"] = totals = (
        {"peak_bytes": peak, "in_use_bytes_sum": in_use, "events": events} if events else None)
    return totals


def memory_use(session: Session) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(summary, detail, from_xprof): the summary get_memory_profile documents, what it was read from, and whether
    XProf's memory profile gave it; NotAvailable where neither XProf nor the allocator's events say."""
    if "memory_use" in session.cache:
        return session.cache["memory_use"]
    session.cache["memory_use"] = found = _memory_use(session)
    return found


def _memory_use(session: Session) -> tuple[dict[str, Any], dict[str, Any], bool]:
    device_memory = _device_memory_gib(session)
    if session.platform != "CPU":
        view, reason = try_view(session, "memory_profile")
        if view is not None:
            summary = capacity(view.get("peak_hbm_gib"), device_memory, view.get("memory_capacity_gib"))
            # The view's own names for the peak, the capacity and their ratio are shown once, under the names above.
            summary.update({k: v for k, v in view.items() if k not in _SAID_ABOVE})
            return summary, {"xprof": view}, True
    else:
        reason = "CPU profiles have no device memory"
    events = allocator_totals(session)
    if events is None:
        raise NotAvailable(
            f"{reason}; and the host threads recorded no allocator events (MemoryAllocation with bytes stats)"
        )
    summary = capacity(round(events["peak_bytes"] / GIB, 4), device_memory, None)
    summary["average_in_use_gib"] = round(events["in_use_bytes_sum"] / events["events"] / GIB, 4)
    summary["allocator_events"] = events["events"]
    return summary, {"from": "allocator events on host threads", "xprof_reason": reason}, False


# XProf's memory_profile fields that say again what capacity states (the peak twice, the capacity, used/capacity).
_SAID_ABOVE = ("detail", "unavailable", "peak_hbm_gib", "peak_hbm_bytes", "memory_capacity_gib",
               "hbm_utilization_percent")
# An allocator limit within this fraction of the device's memory is the device's memory (rounding, reserved pages).
_SAME_CAPACITY = 0.02


def _device_memory_gib(session: Session) -> float | None:
    """The device's memory as its plane records it (`memory_size`, bytes; GPU planes carry it), else None."""
    sizes = [float(p.stats["memory_size"]) for p in session.device_planes() if p.stats.get("memory_size")]
    return round(max(sizes) / GIB, 3) if sizes else None


def capacity(peak: float | None, device_memory: float | None, allocator_limit: float | None) -> dict:
    """The peak against the device's memory, and the allocator's limit named as such where it is lower: the
    headroom and the OOM risk are measured against whichever runs out first."""
    limited = bool(allocator_limit and device_memory and allocator_limit < device_memory * (1 - _SAME_CAPACITY))
    capacity = device_memory or allocator_limit
    limit = allocator_limit if limited else capacity
    summary = {
        "peak_memory_gib": peak,
        "capacity_gib": capacity,
        "capacity_source": (
            "the device's memory (its plane's memory_size)" if device_memory
            else "the allocator's capacity (the profile records no device memory size)" if capacity else None
        ),
        "allocator_limit_gib": allocator_limit if limited else None,
        "headroom_percent": round(100 * (1 - peak / limit), 2) if peak and limit else None,
        "headroom_of": (f"the allocator's limit ({allocator_limit:g} GiB of {device_memory:g} GiB device memory)"
                        if limited else None),
        "oom_risk": _risk(peak, limit),
    }
    return {k: v for k, v in summary.items() if v is not None or k in ("peak_memory_gib", "capacity_gib")}


def _risk(peak_gib: float | None, capacity_gib: float | None) -> str | None:
    """HIGH above 90% of capacity, MEDIUM above 75%, else LOW; None when either is unknown."""
    if not peak_gib or not capacity_gib:
        return None
    used = peak_gib / capacity_gib
    return "HIGH" if used > 0.9 else "MEDIUM" if used > 0.75 else "LOW"
