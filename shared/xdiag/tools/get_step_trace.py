"""get_step_trace: how long is a step, and where does each step's time go?"""

from __future__ import annotations

from xdiag.analysis.breakdown import CATEGORIES, step_rows, summarize_steps
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
    """summary: steps, step_source, step_time_ms_{mean,median,min,max}, step_time_cv_percent,
    <category>_percent for compute/collective/transfer/compile/host_sync/dispatch/host_other, device_idle_percent,
    ops/dispatches/compiles/syncs/callbacks per step. detail: per-step rows (first 200), xprof (device only)."""
    found = step_set(session)
    rows = step_rows(session)
    if not rows:
        raise NotAvailable("no steps: the profile has no step annotations, no device Steps line and no XLA ops")
    summary = {"step_source": found.source, "step_marker": found.annotation, **summarize_steps(rows)}
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
        "steps": [
            {"host": r.host, "step": r.number, "step_ms": round(r.step_ms, 4), **{k: round(v, 4) for k, v in r.ms.items()},
             "ops": r.ops, "dispatches": r.dispatches, "compiles": r.compiles, "syncs": r.syncs}
            for r in rows[:200]
        ],
    }
    source = HOST_PLANE_SOURCE if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "step_trace")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, source)
