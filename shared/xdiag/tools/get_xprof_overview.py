"""get_xprof_overview: what ran, on what, and is the device kept busy?"""

from __future__ import annotations

from xdiag.analysis.breakdown import duration_text, duty_cycles, duty_summary, step_rows, summarize_steps
from xdiag.analysis.op_stats import category_totals, op_stats
from xdiag.analysis.steps import profile_window_ps, step_set
from xdiag.analysis.xprof.session_views import try_view
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source, ms
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_xprof_overview",
    "Overview of the session: platform, hosts, devices, profile window, step time, the share of step time the "
    "devices compute, the top ops and categories; on TPU/GPU also XProf's overview page (duty cycle, bottleneck).",
)
def get_xprof_overview(session: Session) -> ToolOutput:
    """summary: platform, hosts, devices_with_events, profile_bytes, profile_window_ms, events, xla_op_executions,
    steps, step_source, step_time_ms_mean,
    compute_percent, device_idle_percent, top_op, top_category; on devices xprof_* (duty cycle, step time, FLOP rate
    utilisation, bound by), duty_cycle_note and xprof_verdict_note (why xdiag's reading differs from XProf's
    verdict, where it does). detail: top 5 ops, categories, xprof overview."""
    rows = step_rows(session)
    steps = summarize_steps(rows)
    stats = op_stats(session)
    lo, hi = profile_window_ps(session)
    summary = {
        "platform": session.platform,
        "hosts": len(session.hosts),
        "devices_with_events": len(session.device_planes(with_events=True)) or None,
        "profile_window_ms": ms(hi - lo),
        "events": session.event_count,
        "profile_bytes": session.size_bytes,
        "xla_op_executions": sum(s.count for s in stats),
        "steps": steps.get("steps", 0),
        "step_source": step_set(session).source,
        "step_time_ms_mean": steps.get("step_time_ms_mean"),
        "compute_percent": steps.get("compute_percent"),
        "device_idle_percent": steps.get("device_idle_percent"),
        "top_op": stats[0].name if stats else None,
        "top_category": next(iter(category_totals(stats)), None) if stats else None,
    }
    total = sum(s.total_ps for s in stats)
    detail = {"top_ops": [s.row(total) for s in stats[:5]], "categories_ms": category_totals(stats)}
    if session.platform == "CPU":
        detail["note"] = (
            "XProf's own overview counts XLA:CPU work as 'All Others' and calls almost every CPU workload "
            "'input-bound'; xdiag measures the host plane instead and does not repeat that verdict"
        )
        source = host_plane_source(session)
    else:
        view, reason = try_view(session, "overview")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
        if view:
            for key in ("duty_cycle_percent", "step_time_ms", "flop_rate_utilization_percent", "bound_by"):
                if view.get(key) is not None:
                    summary[f"xprof_{key}"] = view[key]
            note = _duty_cycle_note(session, summary)
            if note:
                summary["duty_cycle_note"] = note
            note = _verdict_note(view, summary, steps)
            if note:
                summary["xprof_verdict_note"] = note
        source = DEVICE_PLANE_SOURCE
    return ToolOutput(summary, detail, source)


def _verdict_note(view: dict, summary: dict, steps: dict) -> str | None:
    """Why xdiag's reading differs from XProf's overview verdict, in one line, where it does."""
    statement = str((view.get("detail") or {}).get("xprof_statement") or "")
    idle = summary.get("device_idle_percent")
    if "NOT input-bound" in statement and idle is not None and idle >= 50:
        return (f"XProf calls the program NOT input-bound, counting only the time the device waits on its infeed "
                f"queue, which JAX programs do not use (they take inputs as arguments); xdiag reads the host's lines: "
                f"the device is idle {idle}% of the step and the host works outside the programs "
                f"{steps.get('host_other_percent')}% of it")
    if "No step time measured" in statement and summary.get("step_source") == "step annotations":
        return ("XProf measures no step time because the device's Steps line, which the TPU runtime writes only for "
                "some programs, is empty here; xdiag's steps are the host's step annotations")
    return None


def _duty_cycle_note(session: Session, summary: dict) -> str | None:
    """XProf's duty cycle beside xdiag's busy share over the same window and inside the steps: the same quantity
    measured two ways, reconciled in words where they differ."""
    xprof = summary.get("xprof_duty_cycle_percent")
    idle = summary.get("device_idle_percent")
    if xprof is None or idle is None:
        return None
    in_steps = round(100 - idle, 2)
    window = duty_summary(duty_cycles(session), in_steps)
    if not window:
        return None
    text = (f"XProf's duty cycle {xprof}% is device busy time over the whole capture window; xdiag measures "
            f"{window['window_busy_percent']}% over the same window and {in_steps}% inside the steps.")
    if abs(float(xprof) - in_steps) >= 5:
        text += (f" The idle XProf counts lies outside the steps: {duration_text(window['idle_outside_steps_ms'])} per "
                 f"device, the largest gap {duration_text(window['largest_idle_gap_ms'])} {window['largest_idle_gap_where']}.")
    return text
