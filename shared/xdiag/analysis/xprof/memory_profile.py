"""The `memory_profile` view. Device memory over the capture (memory_profile), per allocator.

Built once per session by XprofViews (views.py), which memoises it. XProf's `get_memory_profile` takes the largest
capacity of *any* allocator (a GPU's device peak divided by a 64 GiB host allocator); here the capacity is that of
the allocator that holds the peak. The converter accepts one trace only, so it is asked per host for multi-file
sessions.
"""

from __future__ import annotations

import logging

from xdiag.analysis.xprof.common import (
    DEFAULT_TOP_N,
    MIB,
    XPLANE_SUFFIX,
    ViewSource,
    as_int,
    as_non_negative,
    natural_order,
    percent_of,
    scaled,
    to_gib,
    with_reasons,
)
from xdiag.errors import NotAvailable

log = logging.getLogger(__name__)


def _allocations_at_peak(allocator: dict) -> list[dict]:
    """XProf's active allocations at the allocator's peak, largest first."""
    snapshots = allocator.get("memoryProfileSnapshots", [])
    specials = allocator.get("specialAllocations", [])
    rows = []
    for active in allocator.get("activeAllocations", []):
        snapshot, special = as_int(active.get("snapshotIndex")), as_int(active.get("specialIndex"))
        if snapshot is not None and 0 <= snapshot < len(snapshots):
            meta = snapshots[snapshot].get("activityMetadata", {})
        elif special is not None and 0 <= special < len(specials):
            meta = specials[special]
        else:
            continue
        size = as_non_negative(meta.get("allocationBytes")) or 0
        rows.append({
            "op_name": meta.get("tfOpName") or None,
            "size_mib": round(size / MIB, 3),
            "requested_mib": round((as_non_negative(meta.get("requestedBytes")) or 0) / MIB, 3),
            "occurrences": as_int(active.get("numOccurrences")) or 1,
            "region_type": meta.get("regionType") or None,
            "data_type": meta.get("dataType") if meta.get("dataType") not in (None, "", "INVALID") else None,
            "shape": meta.get("tensorShape") if meta.get("tensorShape") not in (None, "", "unknown") else None,
        })
    rows.sort(key=lambda r: (-r["size_mib"] * r["occurrences"], r["op_name"] or ""))
    return rows


def _memory_documents(views: ViewSource) -> list[tuple[str | None, dict]]:
    if len(views.files) == 1:
        hosts: list[str | None] = [None]
    else:
        hosts = [path.name.removesuffix(XPLANE_SUFFIX) for path in views.files]
    documents = []
    for host in hosts:
        try:
            page = views.page("memory_profile", **({"host": host} if host else {}))
        except (ValueError, OSError, RuntimeError) as error:
            log.debug("memory_profile for host %s failed: %s", host, error)
            continue
        if isinstance(page, dict):
            documents.append((host, page))
    return documents


def build(views: ViewSource) -> dict:
    allocators: list[dict] = []
    raw_by_name: dict[str, dict] = {}
    for host, document in _memory_documents(views):
        for name, allocator in document.get("memoryProfilePerAllocator", {}).items():
            summary = allocator.get("profileSummary", {})
            peak = summary.get("peakStats", {})
            label = f"{host}:{name}" if host else str(name)
            lowered = str(name).lower()
            allocators.append({
                "allocator": label,
                "kind": "host" if "host" in lowered or lowered.startswith("cpu") else "device",
                "capacity_gib": to_gib(summary.get("memoryCapacity")),
                "peak_in_use_gib": to_gib(peak.get("peakBytesInUse")),
                "peak_in_use_bytes": as_int(peak.get("peakBytesInUse")),
                "peak_lifetime_gib": to_gib(summary.get("peakBytesUsageLifetime")),
                "heap_at_peak_gib": to_gib(peak.get("heapAllocatedBytes")),
                "stack_at_peak_gib": to_gib(peak.get("stackReservedBytes")),
                "free_at_peak_gib": to_gib(peak.get("freeMemoryBytes")),
                "fragmentation_at_peak_percent": scaled(peak.get("fragmentation"), 100.0, 2),
                "peak_time_ms": scaled(summary.get("peakStatsTimePs"), 1e-9, 3),
                "_capacity_bytes": as_int(summary.get("memoryCapacity")),
            })
            raw_by_name[label] = allocator
    if not allocators:
        raise NotAvailable(
            "XProf's memory_profile found no allocator activity in this profile "
            "(no memory allocation events were traced)"
        )
    devices = [a for a in allocators if a["kind"] == "device" and (a["peak_in_use_bytes"] or 0) > 0]
    if not devices:
        raise NotAvailable("XProf's memory_profile has host allocators only, no device memory activity")
    # XProf's allocator order varies from run to run; ties (TPU cores at the same peak) go to the lowest name.
    peak = min(devices, key=lambda a: (-a["peak_in_use_bytes"], natural_order(a["allocator"])))
    capacity = peak["_capacity_bytes"] if (peak["_capacity_bytes"] or 0) > 0 else None
    result = {
        "peak_hbm_gib": peak["peak_in_use_gib"],
        "peak_hbm_bytes": peak["peak_in_use_bytes"],
        "memory_capacity_gib": to_gib(capacity) if capacity else None,
        "hbm_utilization_percent": percent_of(peak["peak_in_use_bytes"], capacity),
        "peak_allocator": peak["allocator"],
        "heap_at_peak_gib": peak["heap_at_peak_gib"],
        "stack_at_peak_gib": peak["stack_at_peak_gib"],
        "free_at_peak_gib": peak["free_at_peak_gib"],
        "fragmentation_at_peak_percent": peak["fragmentation_at_peak_percent"],
        "device_allocator_count": len([a for a in allocators if a["kind"] == "device"]),
    }
    no_capacity = "the allocator reports no capacity"
    with_reasons(result, {"memory_capacity_gib": no_capacity, "hbm_utilization_percent": no_capacity})
    for allocator in allocators:
        allocator.pop("_capacity_bytes")
    allocators.sort(key=lambda a: (a["kind"] != "device", -(a["peak_in_use_bytes"] or 0), natural_order(a["allocator"])))
    result["detail"] = {
        "allocators": allocators[:DEFAULT_TOP_N],
        "largest_allocations_at_peak": _allocations_at_peak(raw_by_name[peak["allocator"]])[:DEFAULT_TOP_N],
        "note": (
            "capacity is that of the allocator holding the peak (XProf's get_memory_profile takes the largest "
            "capacity of any allocator, host included)"
        ),
    }
    return result
