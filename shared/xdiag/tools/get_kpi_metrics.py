"""get_kpi_metrics: the handful of numbers that say how well the workload runs."""

from __future__ import annotations

from xdiag.analysis.breakdown import step_rows, summarize_steps
from xdiag.analysis.op_stats import costed_work, op_stats
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_kpi_metrics",
    "Key performance indicators: step time, steps per second, device compute share, achieved FLOP rate "
    "(from HLO shapes), and on TPU/GPU XProf's duty cycle, roofline utilisation and peak HBM.",
)
def get_kpi_metrics(session: Session) -> ToolOutput:
    """summary: step_time_ms, steps_per_second, compute_percent, device_idle_percent,
    achieved_gflops_per_s_during_ops (FLOPs counted from HLO shapes, GEMM custom calls included, over the time
    of those ops; transfers left out), achieved_gflops_per_s_over_steps, achieved_rate_covers_op_time_percent
    (the compute op time those ops hold; under 50% both rates are left out, with achieved_rate_unavailable_because),
    achieved_rate_upper_bound_flops_percent (where some FLOPs are counted from upper-bound costs, paged kernels'
    full pages: the share they hold, and both rates are at most),
    hlo_costed_op_share_percent (of all op time, transfers included), plus xprof_* on devices."""
    rows = step_rows(session)
    if not rows:
        raise NotAvailable("no steps and no XLA ops in the profile: nothing to measure")
    steps = summarize_steps(rows)
    stats = op_stats(session)
    # GEMM custom calls count (their FLOPs come from their shapes); transfers do not: their time is a wait.
    work = costed_work(session)
    costed, flops, op_seconds = work.stats, work.flops, work.seconds
    total_step_s = sum(r.step_ms for r in rows) / 1e3
    summary = {
        "step_time_ms": steps["step_time_ms_mean"],
        "steps_per_second": round(len(rows) / total_step_s, 3) if total_step_s else None,
        "compute_percent": steps["compute_percent"],
        "device_idle_percent": steps["device_idle_percent"],
        "achieved_gflops_per_s_during_ops": round(flops / op_seconds / 1e9, 3) if op_seconds and flops else None,
        "achieved_gflops_per_s_over_steps": round(flops / total_step_s / 1e9, 3) if total_step_s and flops else None,
        "achieved_rate_covers_op_time_percent": work.covered_percent,
        "hlo_costed_op_share_percent": round(
            100 * sum(s.costed_ps for s in costed) / max(sum(s.total_ps for s in stats), 1), 2
        ),
    }
    if flops and work.upper_bound_flops_percent > 0:
        summary["achieved_rate_upper_bound_flops_percent"] = work.upper_bound_flops_percent
    if flops and not work.speaks_for_the_program:
        # A rate over a fraction of the work is not the program's: left out, with why.
        summary["achieved_gflops_per_s_during_ops"] = summary["achieved_gflops_per_s_over_steps"] = None
        summary["achieved_rate_unavailable_because"] = work.not_representative_because()
    detail: dict = {}
    source = host_plane_source(session) if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "kpi_metrics")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
        for key, value in (view or {}).items():
            if key != "detail" and isinstance(value, (int, float)) and not isinstance(value, bool):
                summary[f"xprof_{key}"] = value
    else:
        detail["not_available"] = {
            "peak_hbm_gib": "CPU profiles record no device memory",
            "roofline_utilization": "CPU profiles carry no peak FLOP/s or bandwidth to compare with",
        }
    return ToolOutput(summary, detail, source)
