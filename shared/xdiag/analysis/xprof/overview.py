"""The `overview` view. XProf's overview page: step time, duty cycle, idle, MXU, roofline utilisation, device.

Built once per session by XprofViews (views.py), which memoises it. XProf's `get_overview` fills the roofline
figures from roofline_model because overview_page says 0.0%; they are None where roofline_model analysed no op.
"""

from __future__ import annotations

from typing import Any

from xdiag.analysis.xprof.common import (
    CUSTOM_CALL_REASON,
    DEFAULT_TOP_N,
    ViewSource,
    as_bool,
    as_int,
    as_number,
    as_positive,
    clean_values,
    own_tools_named,
    datatable_rows,
    scaled,
    table_properties,
    table_with,
    with_reasons,
)


def build(views: ViewSource) -> dict:
    summary = views.overview_tool()
    perf = dict(summary.get("performance_summary", {}))
    if "custom_call_warning" in perf:
        perf["custom_call_warning"] = own_tools_named(perf["custom_call_warning"])
    env = summary.get("run_environment", {})
    device_type = env.get("device_type")
    is_tpu = str(device_type or "").upper().startswith("TPU")
    roofline_gap = views.roofline_gap()
    step_time = as_positive(perf.get("steptime_ms_average"))
    reasons = {
        "step_time_ms": views.no_steps_reason(),
        "step_time_stddev_ms": "no step time",
        "duty_cycle_percent": "XProf's overview reports the device duty cycle for TPUs only",
        "device_idle_percent": "XProf's overview reports device idle time for TPUs only",
        "mxu_utilization_percent": f"MXU utilisation is a TPU figure; this device is {device_type}",
    }
    roofline_keys = ("flop_rate_utilization_percent", "memory_bw_utilization_percent", "hbm_bw_utilization_percent")
    for key in (*roofline_keys, "bound_by"):
        reasons[key] = roofline_gap or "not in XProf's overview"
    reasons["custom_call_share_percent"] = CUSTOM_CALL_REASON

    def roofline_figure(key: str) -> Any:
        return None if roofline_gap else as_number(perf.get(key))

    page = views.page("overview_page")
    properties = table_properties(page)
    top_ops = [
        {
            "operation": row.get("operation"),
            "category": row.get("category"),
            "self_time_percent": scaled(row.get("selfTimePercent"), 100.0, 2),
        }
        for row in datatable_rows(table_with(page, "selfTimePercent"))[:DEFAULT_TOP_N]
    ]
    bound_by = perf.get("bound_by")
    result = {
        "device_type": device_type,
        "device_core_count": as_int(env.get("device_core_count")),
        "host_count": as_int(env.get("host_count")),
        "is_training": as_bool(env.get("is_training")),
        "step_time_ms": step_time,
        "step_time_stddev_ms": as_number(perf.get("steptime_ms_standard_deviation")) if step_time else None,
        "duty_cycle_percent": as_number(perf.get("device_duty_cycle_percent")),
        "device_idle_percent": as_number(perf.get("device_idle_time_percent")) if is_tpu else None,
        "mxu_utilization_percent": as_number(perf.get("mxu_utilization_percent")) if is_tpu else None,
        "flop_rate_utilization_percent": roofline_figure("flop_rate_utilization_relative_to_roofline"),
        "memory_bw_utilization_percent": roofline_figure("memory_bw_utilization_relative_to_hw_limit"),
        "hbm_bw_utilization_percent": roofline_figure("hbm_bw_utilization_percent"),
        "bound_by": None if roofline_gap or bound_by in (None, "", "Unknown") else bound_by,
        "custom_call_share_percent": as_number(perf.get("custom_call_share_pct")),
    }
    with_reasons(result, reasons)
    result["detail"] = {
        "performance_summary": clean_values(perf),
        "run_environment": clean_values(env),
        "xprof_statement": properties.get("statement") or properties.get("input_conclusion") or None,
        "diagnostics": [
            {"severity": row.get("severity"), "message": row.get("message")}
            for row in datatable_rows(table_with(page, "severity"))[:DEFAULT_TOP_N]
        ],
        "top_ops": top_ops,
    }
    return result
