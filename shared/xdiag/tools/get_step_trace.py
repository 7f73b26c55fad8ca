"""get_step_trace: how long is a step, and where does each step's time go?"""

from __future__ import annotations

from xdiag.analysis.breakdown import CATEGORIES, device_rows, spread_from_dispatch, step_rows, summarize_steps
from xdiag.analysis.device_time import device_spread, device_table
from xdiag.analysis.duty_cycle import duty_cycles, duty_summary
from xdiag.analysis.host_signals import largest_sync_event
from xdiag.analysis.host_threads import host_threads, python_tracer_events
from xdiag.analysis.steps import Step, step_set
from xdiag.analysis.warm_up import WarmUpCall, warm_up_calls
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source
from xdiag.tools.registry import ToolOutput, tool

STEP_ROWS = 200
"""The per-step rows the answer lists (the first ones); steps_total says how many steps there are."""


@tool(
    "get_step_trace",
    "Step time (mean, median, spread) and its breakdown into device compute, collectives, transfers, compilation, "
    "blocking host syncs and callbacks, dispatch, and host work outside the compiled step; per-step rows.",
)
def get_step_trace(session: Session) -> ToolOutput:
    """summary: steps (per timeline), timelines, step_source, step_marker, step_time_ms_{mean,median,min,max},
    step_time_cv_percent, and where that spread is the host running ahead of the device (asynchronous dispatch:
    steps that end once dispatched, and steps that wait for the work the earlier ones queued) step_time_spread_is,
    step_time_spread_because, run_ahead_steps, run_ahead_step_ms_mean, blocking_steps, blocking_step_ms_mean;
    <category>_percent for compute/collective/transfer/compile/warm_up/host_sync/dispatch/host_other,
    host_transfer_percent (the part of transfer seen only on the host's lines), dispatch_copy_percent (the part of
    dispatch that is a jitted call's own argument copies, host arrays passed to it), device_idle_percent,
    {ops,dispatches,compiles,syncs,callbacks}_per_step_mean, steps_with_compiles; per-device spread (active_devices,
    device_busy_percent_{mean,min,max} with least/most_busy_device, device_<part>_percent_mean);
    transfer_only_devices; window_busy_percent (busy over each device's whole window, as XProf's duty cycle),
    idle_outside_steps_ms, largest_idle_gap_{ms,where,device}, window_vs_step_note where they differ;
    warm_up_function, first_call_ms, later_call_ms_median (the longest first call that is a warm-up) and
    largest_sync_event, largest_sync_event_ms where the host records them; python_tracer_events_per_step (the Python
    calls the profiler recorded, per step and host: its own load on the host) where the Python tracer was on.
    detail: per-device rows, step sources, duty cycle per device, per-step rows (the first 200 of steps_total), xprof (device only)."""
    found = step_set(session)
    rows = step_rows(session)
    if not rows:
        raise NotAvailable("no steps: the profile has no step annotations, no device Steps line and no XLA ops")
    summary = {"step_source": found.source, "step_marker": found.annotation, **summarize_steps(rows)}
    timelines: dict[tuple[str, str | None], list] = {}
    for row in rows:
        timelines.setdefault((row.host, row.device), []).append(row)
    summary.update(spread_from_dispatch(max(timelines.values(), key=len)))
    devices = device_rows(session)
    summary.update(device_spread(devices))
    if found.transfer_only:
        summary["transfer_only_devices"] = found.transfer_only
    summary.update(_host_call_facts(session, found.steps))
    traced = python_tracer_events(session)
    if traced and summary.get("steps"):
        # The profiler's own load: each Python call it records costs the traced program host time.
        summary["python_tracer_events_per_step"] = round(traced / summary["steps"] / max(len(session.hosts), 1), 1)
    cycles = duty_cycles(session)
    summary.update(duty_summary(cycles, 100 - summary["device_idle_percent"] if "device_idle_percent" in summary else None))
    detail = {
        "categories": list(CATEGORIES),
        "category_meaning": {
            "compute": "device busy running XLA ops (averaged over the host's devices)",
            "collective": "device busy only in collective ops (all-reduce, all-gather, …)",
            "transfer": "moving data between memory spaces: the device busy only in copies (async copies to or from "
                        "host memory, memcpy), and host<->device copies that show only on the host's lines "
                        "(device_put, np.asarray's read: re-tiling and DMA), host_transfer_percent of the step",
            "compile": "JIT compilation / lowering events on host threads",
            "warm_up": "the first call of a jitted function where it takes far longer than its later calls "
            "(allocation, autotuning, loading), or a GPU runtime call far longer than its median call (loading a "
            "kernel's module on first use, creating the context or a stream), not overlapped by device work",
            "host_sync": "host blocked on device results (np.asarray, device_get, block_until_ready, …) or host callbacks",
            "dispatch": "launching work (jitted calls, program executions, TensorFlow's executor running ops one by one) "
            "not overlapped by device work",
            "host_other": "no device op and no compile, warm-up, sync or launch event: Python or input work between "
            "calls outside the compiled step",
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
            for r in rows[:STEP_ROWS]
        ],
        "steps_total": len(rows),
    }
    source = host_plane_source(session) if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "step_trace")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, source)


def _host_call_facts(session: Session, steps: list[Step]) -> dict:
    """The warm-up call and the blocking wait behind the warm_up and host_sync shares, named from the host's events:
    only warm-up calls that overlap a step of their host, as the share counts only time inside the steps."""
    out: dict = {}
    warm, waits = host_calls(session, steps)
    if warm:
        longest = max(warm, key=lambda w: w.ms)
        out.update({"warm_up_function": longest.function, "first_call_ms": round(longest.ms, 4),
                    "later_call_ms_median": round(longest.later_call_ms_median, 4)})
        if not longest.first_call:  # GPU runtime calls far longer than their median (module loading, context)
            slow = sorted((w for w in warm if not w.first_call), key=lambda w: -w.ms)
            out.update(warm_up_is_a_runtime_call=True, slow_runtime_calls=len(slow),
                       slow_runtime_call_examples=[f"{w.function} {w.ms:,.0f} ms (median {w.later_call_ms_median:.3g} ms)"
                                                   for w in slow[:3]])
    if waits:
        name, ms = max(waits, key=lambda w: w[1])
        out.update({"largest_sync_event": name, "largest_sync_event_ms": round(ms, 4)})
    return out


def host_calls(session: Session, steps: list[Step]) -> tuple[list[WarmUpCall], list[tuple[str, float]]]:
    """(the warm-up calls that overlap a step of their host, each host's largest blocking wait), hosts in the
    session's order; cached (a session assembled from host summaries carries them: xdiag.analysis.host_summary)."""
    if "host_calls" not in session.cache:
        windows: dict[str, list[tuple[int, int]]] = {}
        for step in steps:
            windows.setdefault(step.host, []).append((step.start_ps, step.end_ps))
        warm = [w for events in host_threads(session) for w in warm_up_calls(events)
                if any(w.start_ps < end and w.end_ps > start for start, end in windows.get(w.host, []))]
        waits = [w for events in host_threads(session) if (w := largest_sync_event(events)) is not None]
        session.cache["host_calls"] = (warm, waits)
    return session.cache["host_calls"]
