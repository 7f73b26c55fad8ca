"""The `kpi_metrics` view. XProf's get_kpi_metrics fields, assembled from this instance's overview, memory profile and roofline (nothing is converted again): step_time_ms, duty_cycle_percent, mxu_utilization_percent, flop_rate_utilization_percent, flops_provenance, derived_flops_fraction, peak_hbm_gib, memory_capacity_gib, hbm_utilization_percent, device_type, device_core_count.

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations

import contextlib

from xdiag.analysis.xprof.common import ViewSource, with_reasons
from xdiag.errors import NotAvailable


def build(views: ViewSource) -> dict:
    overview = views.overview()
    reasons = dict(overview.get("unavailable", {}))
    memory: dict | None = None
    try:
        memory = views.memory_profile()
    except NotAvailable as error:
        reasons["peak_hbm_gib"] = reasons["memory_capacity_gib"] = reasons["hbm_utilization_percent"] = str(error)
    roofline: dict | None = None
    with contextlib.suppress(NotAvailable):
        roofline = views.roofline()
    flop_rate_utilization = overview["flop_rate_utilization_percent"]
    provenance = roofline["flops_provenance"] if roofline else None
    if roofline and provenance in ("derived_from_shapes", "mixed"):
        # As get_kpi_metrics: custom-call FLOPs derived from shapes correct the cost model's 0.
        flop_rate_utilization = roofline["roofline_efficiency_percent"]
    result = {
        "step_time_ms": overview["step_time_ms"],
        "duty_cycle_percent": overview["duty_cycle_percent"],
        "mxu_utilization_percent": overview["mxu_utilization_percent"],
        "flop_rate_utilization_percent": flop_rate_utilization,
        "flops_provenance": provenance,
        "derived_flops_fraction": roofline["derived_flops_fraction"] if roofline else None,
        "peak_hbm_gib": memory["peak_hbm_gib"] if memory else None,
        "memory_capacity_gib": memory["memory_capacity_gib"] if memory else None,
        "hbm_utilization_percent": memory["hbm_utilization_percent"] if memory else None,
        "device_type": overview["device_type"],
        "device_core_count": overview["device_core_count"],
    }
    reasons.setdefault("flops_provenance", reasons.get("flop_rate_utilization_percent", "no roofline"))
    reasons.setdefault("derived_flops_fraction", reasons["flops_provenance"])
    with_reasons(result, reasons)
    custom_call_warning = overview["detail"]["performance_summary"].get("custom_call_warning")
    result["detail"] = {"custom_call_warning": custom_call_warning} if custom_call_warning else {}
    return result
