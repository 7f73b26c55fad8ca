"""The `roofline` view. Program roofline (get_roofline_model): roofline_efficiency_percent, compute_efficiency_percent, max_mem_bw_utilization_percent, hbm_bw_utilization_percent, bound_by, operational intensities and ridge point, measured_flop_rate_gflops, hbm_bw_gibs, peaks, total_time_ms, flops_provenance, derived_flops_fraction, ops_analyzed.

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations


from xdiag.analysis.xprof.common import (
    own_tools_named,
    CUSTOM_CALL_REASON,
    DEFAULT_TOP_N,
    ViewSource,
    as_int,
    as_number,
    as_positive,
    clean_values,
    with_reasons,
)


def build(views: ViewSource) -> dict:
    data = views.roofline_tool()
    program = data["program"]
    device = data.get("device_info", {})
    result = {
        "roofline_efficiency_percent": as_number(program.get("roofline_efficiency_percent")),
        "compute_efficiency_percent": as_number(program.get("compute_efficiency_percent")),
        "max_mem_bw_utilization_percent": as_number(program.get("max_mem_bw_utilization_percent")),
        "hbm_bw_utilization_percent": as_number(program.get("hbm_bw_utilization_percent")),
        "bound_by": program.get("bound_by") if program.get("bound_by") not in (None, "", "Unknown") else None,
        "operational_intensity_flop_per_byte": as_number(program.get("operational_intensity_flop_per_byte")),
        "bottleneck_operational_intensity_flop_per_byte": as_number(
            program.get("bottleneck_operational_intensity_flop_per_byte")
        ),
        "bound_by_ridge_point_flop_per_byte": as_positive(program.get("bound_by_ridge_point_flop_per_byte")),
        "measured_flop_rate_gflops": as_number(program.get("measured_flop_rate_gflops")),
        "measured_memory_bw_gibs": as_number(program.get("measured_memory_bw_gibs")),
        "hbm_bw_gibs": as_number(program.get("hbm_bw_gibs")),
        "peak_flop_rate_gflops": as_positive(device.get("peak_flop_rate")),
        "peak_hbm_bw_gibs": as_positive(device.get("peak_hbm_bw_gibs")),
        "total_time_ms": as_number(program.get("total_time_ms")),
        "flops_provenance": program.get("flops_provenance"),
        "derived_flops_fraction": as_number(program.get("derived_flops_fraction")),
        "has_opaque_custom_calls": bool(program.get("has_opaque_custom_calls")),
        "custom_call_share_percent": as_number(data.get("custom_call_share_pct")),
        "ops_analyzed": as_int(data.get("total_operations_analyzed")),
    }
    with_reasons(result, {
        "custom_call_share_percent": CUSTOM_CALL_REASON,
        "bound_by_ridge_point_flop_per_byte": "no ridge point for this bound",
        "peak_flop_rate_gflops": "XProf reports the peak FLOP rate as 0 (unknown) for this device",
    })
    top = []
    for op in data.get("top_operations", [])[:DEFAULT_TOP_N]:
        top.append(clean_values(op))
    result["detail"] = {
        "top_operations": top,
        "device_info": clean_values({k: v for k, v in device.items() if k != "units"}),
        "custom_call_warning": own_tools_named(data.get("custom_call_warning")),
        "note": (
            "total_time_ms sums op time over all cores; measured_memory_bw_gibs counts every memory space, "
            "compare hbm_bw_gibs with peak_hbm_bw_gibs"
        ),
    }
    return result
