"""The health snapshot: the broad tools' numbers gathered into one record, and the OPTIMAL test.

Every value here is copied from a tool summary (the `sources` map says which), so a
finding that quotes the snapshot quotes a tool.
"""

from __future__ import annotations

from typing import Any

from xdiag.analysis.breakdown import CATEGORIES
from xdiag.analysis.roofline import MEMORY_BOUND_FINDING_MIN_PERCENT, memory_bound_rows
from xdiag.model import ToolResult
from xdiag.profile.trace_json import XPROF_CHROME

HEALTHY = {
    "compute_percent_min": 80.0,
    "device_busy_percent_min": 50.0,
    "collective_percent_max": 10.0,
    "compile_percent_max": 2.0,
    "host_sync_percent_max": 5.0,
    "compiler_issue_percent_max": 10.0,
    "low_intensity_percent_max": MEMORY_BOUND_FINDING_MIN_PERCENT,
    "data_movement_percent_max": 50.0,
}
"""The OPTIMAL short-cut: all of these hold, the out-of-memory risk is LOW (or unknown), and the ops that dominate
op time have a measured efficiency (efficiency_not_measured)."""
OOM_RISKS_ABOVE_LOW = ("MEDIUM", "HIGH")
"""get_memory_profile's risks that rule OPTIMAL out: a step near the memory limit fails when its inputs grow."""


def _summary(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    result = results.get(tool)
    return result.summary if result is not None and result.ok else {}


DOMINANT_EFFICIENCY_MIN_PERCENT = 30.0
"""The ops that take most of the time must reach this share of their roof for a busy device to be healthy."""
LATENCY_BOUND = {"loop_trips_per_run_min": 64, "op_us_max": 5.0, "efficiency_percent_max": 30.0}
"""Latency-bound: the busiest ops run thousands of times per loop (dependent steps), each a few microseconds
or less, far below their roof: per-op latency, not bandwidth or arithmetic, sets the time."""
DMA_STALL_MAX_PERCENT = 20.0
"""Share of the dominant ops' time spent waiting on their input copies (XProf's per-op DMA stall, TPU)."""


def low_intensity_share(results: dict[str, ToolResult]) -> tuple[float | None, list[dict]]:
    """Share of op time (percent) in memory-bound ops that do arithmetic, and those (listed) ops."""
    profile = results.get("get_hlo_op_profile")
    if profile is None or not profile.ok or profile.summary.get("memory_bound_op_percent") is None:
        return None, []
    return profile.summary["memory_bound_op_percent"], memory_bound_rows(profile.detail.get("ops", []))


def health_snapshot(results: dict[str, ToolResult]) -> dict[str, Any]:
    step = _summary(results, "get_step_trace")
    overview = _summary(results, "get_xprof_overview")
    kpi = _summary(results, "get_kpi_metrics")
    memory = _summary(results, "get_memory_profile")
    util = _summary(results, "get_utilization_viewer")
    hosts = _summary(results, "get_hosts")
    roofline = _summary(results, "get_roofline_model")
    ops = _summary(results, "get_hlo_op_profile")
    categories = ops.get("category_percent") or {}
    moving = sum(categories.get(c, 0.0) for c in ("async_copy", "memcpy", "data_movement"))
    snapshot: dict[str, Any] = {
        "platform": overview.get("platform"),
        "read_from": _summary(results, "get_device_information").get("read_from"),
        "steps": step.get("steps"),
        "step_source": step.get("step_source"),
        "step_time_ms": step.get("step_time_ms_mean"),
        "step_time_cv_percent": step.get("step_time_cv_percent"),
        "breakdown_percent": {
            category: step.get(f"{category}_percent")
            for category in CATEGORIES
            if step.get(f"{category}_percent") is not None
        },
        "device_idle_percent": step.get("device_idle_percent"),
        "devices": {
            k: step.get(k)
            for k in ("active_devices", "device_busy_percent_min", "least_busy_device", "device_busy_percent_max",
                      "most_busy_device", "transfer_only_devices", "window_busy_percent", "largest_idle_gap_ms",
                      "largest_idle_gap_where")
            if step.get(k) is not None
        },
        "straggler": {
            k: hosts.get(k)
            for k in ("straggler", "participant_level", "straggler_caused_wait_ms_per_step", "straggler_cause",
                      "arrival_skew_ms_mean")
            if hosts.get(k) is not None
        } | ({"not_available": hosts["not_available"]["straggler"]}
             if isinstance(hosts.get("not_available"), dict) and hosts["not_available"].get("straggler") else {}),
        "utilization_percent": util.get("busy_percent_mean"),
        "achieved_gflops_per_s": kpi.get("achieved_gflops_per_s_during_ops"),
        "achieved_rate_covers_op_time_percent": kpi.get("achieved_rate_covers_op_time_percent"),
        "roofline_unavailable_because": roofline.get("roofline_unavailable_because"),
        # xdiag's roofline over device op time (None where too little of it is costed); XProf's divides by a
        # window that includes device idle, so it is kept apart.
        "roofline_efficiency_percent": roofline.get("op_time_roofline_efficiency_percent"),
        "bound_by": roofline.get("op_time_bound_by"),
        "xprof_roofline_efficiency_percent": roofline.get("roofline_efficiency_percent"),
        "peak_memory_gib": memory.get("peak_memory_gib"),
        "memory_capacity_gib": memory.get("capacity_gib"),
        "allocator_limit_gib": memory.get("allocator_limit_gib"),
        "memory_headroom_percent": memory.get("headroom_percent"),
        "oom_risk": memory.get("oom_risk"),
        "top_op": ops.get("top_op"),
        "top_op_share_percent": ops.get("top_op_share_percent"),
        "top_category": ops.get("top_category"),
        "low_intensity_op_percent": ops.get("memory_bound_op_percent"),
        "memory_bound_is_defect": ops.get("memory_bound_defect"),
        "memory_passes": ops.get("memory_passes"),
        "memory_bandwidth_efficiency_percent": ops.get("memory_bandwidth_efficiency_percent"),
        "memory_bound_kind": ops.get("memory_bound_kind"),
        "memory_wait_percent": ops.get("memory_wait_percent"),
        "dominant_ops_roofline_efficiency_percent": ops.get("dominant_ops_roofline_efficiency_percent"),
        "dominant_ops_share_percent": ops.get("dominant_ops_share_percent"),
        "dominant_ops_measured_share_percent": ops.get("dominant_ops_measured_share_percent"),
        "dominant_ops_unmeasured": ops.get("dominant_ops_unmeasured") or [],
        "dma_stall_percent": roofline.get("dma_stall_percent_of_top_ops"),
        "loop_work": {k: ops.get(k) for k in ("busiest_ops_mean_us", "busiest_ops_efficiency_percent",
                                              "busiest_ops_share_percent", "loop_trips_per_run")},
        "peaks": {k: ops.get(k) for k in ("device_model", "peak_tflops", "peak_hbm_gb_per_s", "flops_source",
                                            "bandwidth_source", "peak_warnings") if ops.get(k) is not None} or None,
        "data_movement_op_percent": round(moving, 2) if categories else None,
        "host_callback_op_percent": categories.get("host_callback") if categories else None,
        "compiler": {
            "layout_copies_percent": _summary(results, "detect_layout_mismatch_copies").get("share_of_op_time_percent"),
            "unfused_data_movement_percent": _summary(results, "detect_unfused_reshapes").get("share_of_op_time_percent"),
            "widening_converts_percent": _summary(results, "detect_unnecessary_convert_reduce").get("share_of_op_time_percent"),
        },
        "per_step": {
            k: step.get(k)
            for k in ("ops_per_step_mean", "dispatches_per_step_mean", "compiles_per_step_mean", "steps_with_compiles",
                      "syncs_per_step_mean", "callbacks_per_step_mean")
        },
        "sources": {
            "steps, breakdown, per_step, devices": "get_step_trace",
            "straggler": "get_hosts",
            "utilization_percent": "get_utilization_viewer",
            "memory": "get_memory_profile",
            "roofline_efficiency_percent": "get_roofline_model",
            "top_op, low_intensity_op_percent, memory_*, dominant_ops_*, loop_work, peaks": "get_hlo_op_profile",
            "dma_stall_percent": "get_roofline_model",
            "compiler": "detect_layout_mismatch_copies, detect_unfused_reshapes, detect_unnecessary_convert_reduce",
        },
    }
    snapshot["unhealthy_because"] = _unhealthy_reasons(snapshot)
    snapshot["healthy"] = not snapshot["unhealthy_because"]
    return snapshot


def _unhealthy_reasons(s: dict[str, Any]) -> list[str]:
    reasons = []
    b = s["breakdown_percent"]
    if not s.get("steps") or b.get("compute") is None:
        return ["no step or op timing could be measured"]
    if b["compute"] < HEALTHY["compute_percent_min"]:
        reasons.append(f"devices compute {b['compute']}% of step time (< {HEALTHY['compute_percent_min']}%)")
    devices = s.get("devices") or {}
    # One active device is the whole: its busy share is the compute line above, said again another way.
    if (devices.get("active_devices") or 0) > 1 and (devices.get("device_busy_percent_min") or 100) < HEALTHY[
            "device_busy_percent_min"]:
        reasons.append(
            f"device {devices.get('least_busy_device')} is busy only {devices['device_busy_percent_min']}% of its steps"
        )
    straggler = s.get("straggler") or {}
    if straggler.get("straggler"):
        reasons.append(
            f"the others wait {straggler['straggler_caused_wait_ms_per_step']} ms per step for straggler "
            f"{straggler['straggler']}"
        )
    if (b.get("collective") or 0) > HEALTHY["collective_percent_max"]:
        reasons.append(f"collectives take {b['collective']}% of step time")
    if (b.get("compile") or 0) > HEALTHY["compile_percent_max"]:
        reasons.append(f"compilation takes {b['compile']}% of step time")
    per_step = s.get("per_step") or {}
    # One wait for the step's results at its end is the usual pattern (its latency shows as host_sync time when
    # the devices finish unevenly); several waits per step, or host callbacks, are what the host_sync finding reads.
    waits = (per_step.get("syncs_per_step_mean") or 0) >= 2 or (per_step.get("callbacks_per_step_mean") or 0) >= 1
    if (b.get("host_sync") or 0) > HEALTHY["host_sync_percent_max"] and waits:
        reasons.append(f"host syncs take {b['host_sync']}% of step time")
    callbacks = per_step.get("callbacks_per_step_mean") or 0
    if callbacks >= 1 and max(b.get("host_sync") or 0, s.get("host_callback_op_percent") or 0) >= 1:
        reasons.append(f"the step calls back into Python {callbacks:g} times")
    if s.get("oom_risk") in OOM_RISKS_ABOVE_LOW:
        reasons.append(f"out-of-memory risk is {s['oom_risk']}: the peak of {s.get('peak_memory_gib')} GiB leaves "
                       f"{s.get('memory_headroom_percent')}% of the memory free (OPTIMAL needs LOW risk)")
    op_time_shares = [(key.removesuffix("_percent").replace("_", " "), value) for key, value in s["compiler"].items()
                      if (value or 0) > HEALTHY["compiler_issue_percent_max"]]
    if (s.get("data_movement_op_percent") or 0) > HEALTHY["data_movement_percent_max"]:
        op_time_shares.append(("ops that move data (copies, transfers) instead of computing",
                               s["data_movement_op_percent"]))
    reasons += _one_line_per_share(op_time_shares)
    memory_bound = (s.get("low_intensity_op_percent") or 0) + (s.get("memory_wait_percent") or 0)
    if memory_bound > HEALTHY["low_intensity_percent_max"] and s.get("memory_bound_is_defect"):
        reasons.append(f"{memory_bound:.4g}% of op time is memory-bound ({s.get('memory_bound_kind') or 'no peaks'}) "
                       "in a way its fix can change")
    efficiency = s.get("dominant_ops_roofline_efficiency_percent")
    if efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT:
        reasons.append(f"the ops taking {s['dominant_ops_share_percent']}% of op time run at {efficiency}% of their roofline")
    elif efficiency is None and (unmeasured := efficiency_not_measured(s)):
        reasons.append(unmeasured)
    if is_latency_bound(s.get("loop_work") or {}):
        work = s["loop_work"]
        reasons.append(f"the busiest ops run {work['loop_trips_per_run']:g} times per loop, {work['busiest_ops_mean_us']} "
                       f"us each, at {work['busiest_ops_efficiency_percent']}% of their roofline")
    if (s.get("dma_stall_percent") or 0) > DMA_STALL_MAX_PERCENT:
        reasons.append(f"the busiest ops wait on their input copies {s['dma_stall_percent']}% of their time")
    return reasons


FLOPS_COVER_MIN_PERCENT = 50.0
"""On a CPU (no roof: xdiag knows no CPU's peaks) the work is rated when FLOPs are known for this share of op time."""


def efficiency_not_measured(s: dict[str, Any]) -> str | None:
    """Why no efficiency of the work that dominates op time is measured, pointing to what would measure it; None
    where it is measured, or on a CPU whose ops' FLOPs (and so their achieved rate) are known: no profile records a
    CPU's peaks. Whatever else is healthy, such a session is never OPTIMAL: nothing shows the work runs well."""
    if s.get("dominant_ops_roofline_efficiency_percent") is not None:
        return None
    covered = s.get("achieved_rate_covers_op_time_percent")
    if s.get("platform") == "CPU" and (covered or 0) >= FLOPS_COVER_MIN_PERCENT:
        return None
    why = list(s.get("dominant_ops_unmeasured") or [])
    if not why:
        why.append(f"FLOPs are known for {covered or 0:g}% of op time"
                   + (f" ({s['roofline_unavailable_because']})" if s.get("roofline_unavailable_because") else ""))
    if s.get("read_from") == XPROF_CHROME:
        why.append("this session was read from XProf's Chrome trace (trace.json), which carries no HLO (no FLOPs or "
                   "bytes) and no device model: analyse the .xplane.pb that jax.profiler writes beside it (the same "
                   "folder, <host>.xplane.pb), which holds the HLO and the device's own lines")
    return ("no efficiency is measured for the work that dominates op time, so OPTIMAL cannot be shown: "
            + "; ".join(why))


def _one_line_per_share(shares: list[tuple[str, float]]) -> list[str]:
    """'<what> take <x>% of op time', one line per figure: checks that find the same ops (a transpose is a layout
    copy, unfused data movement and data movement at once) share a line instead of repeating the number."""
    by_figure: dict[str, list[str]] = {}
    for what, value in shares:
        by_figure.setdefault(f"{value:.3g}", []).append(what)
    lines = []
    for figure, names in by_figure.items():
        named = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        same = " (the same ops, found by each check)" if len(names) > 1 else ""
        lines.append(f"{named} take {figure}% of op time{same}")
    return lines


def is_latency_bound(work: dict[str, Any]) -> bool:
    """LATENCY_BOUND holds for get_hlo_op_profile's loop_work numbers."""
    trips, mean_us, efficiency = (work.get(k) for k in ("loop_trips_per_run", "busiest_ops_mean_us",
                                                        "busiest_ops_efficiency_percent"))
    return (trips is not None and trips >= LATENCY_BOUND["loop_trips_per_run_min"] and mean_us is not None
            and mean_us <= LATENCY_BOUND["op_us_max"]
            and (efficiency is None or efficiency < LATENCY_BOUND["efficiency_percent_max"]))
