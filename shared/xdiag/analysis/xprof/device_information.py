"""The `device_information` view. Device peaks from the roofline model plus the run environment: device_type, device_core_count, host_count, peak_flop_rate_gflops, peak_hbm_bw_gibs, peak_vmem_read_bw_gibs, peak_vmem_write_bw_gibs, hbm_ridge_point_flop_per_byte, megacore, has_cmem.

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations

from typing import Any

from xdiag.analysis.xprof.common import ViewSource, as_bool, as_int, as_positive, clean_values, with_reasons, xprof_api
from xdiag.errors import NotAvailable


def build(views: ViewSource) -> dict:
    try:
        info = views.tool("get_device_information", xprof_api().device_information)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise NotAvailable(f"XProf's roofline_model gives no device information ({error})") from error
    try:
        env = views.overview_tool().get("run_environment", {})
    except NotAvailable:
        env = {}
    units = info.get("units", {})
    detail: dict[str, Any] = {}
    for key, value in info.items():
        if key == "units":
            continue
        unit = units.get(key)
        if unit == "GFLOP/s" and not key.endswith("_gflops"):
            key += "_gflops"
        elif unit == "FLOP/byte":
            key += "_flop_per_byte"
        detail[key] = clean_values(value)
    result = {
        "device_type": info.get("device_type") or env.get("device_type"),
        "device_core_count": as_int(env.get("device_core_count")),
        "host_count": as_int(env.get("host_count")),
        "peak_flop_rate_gflops": as_positive(info.get("peak_flop_rate")),
        "peak_hbm_bw_gibs": as_positive(info.get("peak_hbm_bw_gibs")),
        "peak_vmem_read_bw_gibs": as_positive(info.get("peak_vmem_read_bw_gibs")),
        "peak_vmem_write_bw_gibs": as_positive(info.get("peak_vmem_write_bw_gibs")),
        "hbm_ridge_point_flop_per_byte": as_positive(info.get("hbm_ridge_point")),
        "megacore": as_bool(info.get("megacore")),
        "has_cmem": as_bool(info.get("has_cmem")),
    }
    if result["peak_flop_rate_gflops"] is None and result["peak_hbm_bw_gibs"] is None and not result["device_type"]:
        raise NotAvailable("XProf's roofline_model knows nothing about this device (no type, no peaks)")
    with_reasons(result, {
        "peak_flop_rate_gflops": "XProf reports the peak FLOP rate as 0 (unknown) for this device",
        "hbm_ridge_point_flop_per_byte": "no ridge point without a peak FLOP rate",
        "peak_vmem_read_bw_gibs": "no VMEM read figure for this device",
        "peak_vmem_write_bw_gibs": "no VMEM write figure for this device",
        "megacore": "a TPU property",
        "has_cmem": "a TPU property",
    })
    result["detail"] = detail
    return result
