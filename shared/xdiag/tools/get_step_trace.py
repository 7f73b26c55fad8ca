"""get_step_trace: how long is a step, and where does each step's time go?"""

from __future__ import annotations

from xdiag.analysis.breakdown import (
    CATEGORIES,
    device_rows,
    device_spread,
    device_table,
    duty_cycles,
    duty_summary,
    step_rows,
    summarize_steps,
)
from xdiag.analysis.timeline import step_set
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, HOST_PLANE_SOURCE, try_view
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_step_trace",
    "Step time (mean, median, spread) and its breakdown into device compute, collectives, compilation, "
    "blocking host syncs and callbacks, dispatch, and host work outside the compiled step; per-step rows.",
)
def get_step_trace(session: Session) -> ToolOutput:
    """summary: steps (per timeline), timelines, step_source, step_time_ms_{mean,median,min,max},
    step_time_cv_percent, <category>_percent for compute/collective/transfer/compile/host_sync/dispatch/host_other,
    device_idle_percent, ops/dispatches/compiles/syncs/callbacks per step; per-device spread (active_devices,
    device_busy_percent_{mean,min,max} with least/most_busy_device, device_<part>_percent_mean);
    transfer_only_devices; window_busy_percent (busy over each device's whole window, as XProf's duty cycle),
    idle_outside_steps_ms, largest_idle_gap_{ms,where,device}, window_vs_step_note where they differ.
    detail: per-device rows, step sources, duty cycle per device, per-step rows (first 200), xprof (device only)."""
    found = step_set(session)
    rows = step_rows(session)
    if not rows:
        raise NotAvailable("no steps: the profile has no step annotations, no device Steps line and no XLA ops")
    summary = {"step_source": found.source, "step_marker": found.annotation, **summarize_steps(rows)}
    devices = device_rows(session)
    summary.update(device_spread(devices))
    if found.transfer_only:
        summary["transfer_only_devices"] = found.transfer_only
    cycles = duty_cycles(session)
    summary.update(duty_summary(cycles, 100 - summary["device_idle_percent"] if "device_idle_percent" in summary else None))
    detail = {
        "categories": list(CATEGORIES),
        "category_meaning": {
            "compute": "device busy running XLA ops (averaged over the host's devices)",
            "collective": "device busy only in collective ops (all-reduce, all-gather, …)",
            "transfer": "device busy only moving data between memory spaces (async copies, host offload, memcpy)",
            "compile": "JIT compilation / lowering events on host threads",
            "host_sync": "host blocked on device results (np.asarray, device_get, …) or host callbacks",
            "dispatch": "dispatching jitted computations (PjitFunction…) not overlapped by device work",
            "host_other": "no device op, compile, sync or dispatch: Python/input work outside the compiled step",
        },
        "devices": device_table(devices),
        "transfer_only_devices": {
            "devices": found.transfer_only,
            "meaning": "devices that only copied data (memcpy, async copies): not compute devices of the step, "
            "so they are kept out of the per-device means instead of counting as idle",
        },
        "step_sources": found.sources,
        "duty_cycle": [
            {"device": c.device, "window_ms": round(c.window_ms, 4), "busy_percent": c.busy_percent,
             "idle_outside_steps_ms": round(c.idle_outside_steps_ms, 4), "largest_idle_gap_ms": round(c.largest_gap_ms, 4),
             "largest_idle_gap_where": c.largest_gap_where}
            for c in cycles
        ],
        "steps": [
            {"host": r.host, "device": r.device, "step": r.number, "step_ms": round(r.step_ms, 4), **{k: round(v, 4) for k, v in r.ms.items()},
             "ops": r.ops, "dispatches": r.dispatches, "compiles": r.compiles, "syncs": r.syncs}
            for r in rows[:200]
        ],
    }
    source = HOST_PLANE_SOURCE if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "step_trace")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, source)
