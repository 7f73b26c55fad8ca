"""The `step_trace` view. Per-step breakdown (pod_viewer / input_pipeline_analyzer, via get_step_trace).

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations

from xdiag.analysis.xprof.common import (
    DEFAULT_TOP_N,
    ViewSource,
    as_int,
    as_number,
    as_positive,
    clean_values,
    with_reasons,
    xprof_api,
)
from xdiag.errors import NotAvailable


def build(views: ViewSource) -> dict:
    try:
        data = views.tool("get_step_trace", xprof_api().step_trace, limit=DEFAULT_TOP_N)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise NotAvailable(f"XProf's step trace failed on this profile ({error})") from error
    summary = data.get("summary")
    if data.get("status") == "NO_DATA" or not summary or not as_positive(summary.get("step_time_ms_average")):
        raise NotAvailable(f"XProf found no steps in this profile: {views.no_steps_reason()}")
    result = {
        "step_count": as_int(summary.get("total_steps")),
        "step_time_ms": as_number(summary.get("step_time_ms_average")),
        "step_time_min_ms": as_number(summary.get("step_time_ms_min")),
        "step_time_max_ms": as_number(summary.get("step_time_ms_max")),
        "step_time_stddev_ms": as_number(summary.get("step_time_ms_stddev")),
        "compute_time_ms": as_number(summary.get("compute_time_ms_average")),
        "compute_percent": as_number(summary.get("compute_percent")),
        "communication_percent": as_number(summary.get("communication_percent")),
        "infeed_percent": as_number(summary.get("infeed_percent")),
        "outfeed_percent": as_number(summary.get("outfeed_percent")),
        "idle_percent": as_number(summary.get("idle_percent")),
        "primary_bottleneck": summary.get("primary_bottleneck"),
        "is_aggregate": bool(summary.get("is_aggregate")),
    }
    with_reasons(result, {"step_count": "XProf gives aggregate figures only, without a step count"})
    result["detail"] = {
        "steps": clean_values(data.get("step_breakdown", []))[:DEFAULT_TOP_N],
        "total_step_records": as_int(data.get("total_records")),
        "note": summary.get("note") or summary.get("conclusion"),
    }
    return result
