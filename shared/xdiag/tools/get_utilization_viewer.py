"""get_utilization_viewer: how busy is each device (and each XLA thread) over the profile?"""

from __future__ import annotations


from xdiag.analysis.breakdown import device_rows, device_spread, device_table
from xdiag.analysis.op_table import device_op_counts
from xdiag.analysis.steps import step_set
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_utilization_viewer",
    "Per active device: the share of its own steps in which it runs XLA ops, and the least and most busy device; "
    "devices that only copied data are listed apart.",
)
def get_utilization_viewer(session: Session) -> ToolOutput:
    """summary: devices, busy_percent_{mean,min,max}, least/most_busy_device, transfer_only_devices. detail: per-device rows."""
    executions = device_op_counts(session)
    if not executions:
        raise NotAvailable("the profile holds no XLA op executions to measure device busy time from")
    found = step_set(session)
    rows = [
        {"device": r["device"], "busy_percent": round(r["compute_percent"] + r["collective_percent"] + r["transfer_percent"], 2),
         "steps": r["steps"], "op_executions": executions.get(r["device"], 0)}
        for r in device_table(device_rows(session))
    ]
    if not rows:
        raise NotAvailable("no device ran anything but data copies: there is no compute timeline to measure")
    busy = [r["busy_percent"] for r in rows]
    summary = {
        "devices": len(rows),
        # The same busy share as get_step_trace's (weighted by each device's step time): one value per fact.
        "busy_percent_mean": device_spread(device_rows(session))["device_busy_percent_mean"],
        "busy_percent_min": min(busy),
        "busy_percent_max": max(busy),
        "least_busy_device": min(rows, key=lambda r: r["busy_percent"])["device"],
        "most_busy_device": max(rows, key=lambda r: r["busy_percent"])["device"],
    }
    if found.transfer_only:
        summary["transfer_only_devices"] = found.transfer_only
    detail: dict = {
        "devices": rows,
        "window": "each device's own steps (a host's annotated steps, or the device's own step windows)",
        "transfer_only_devices": found.transfer_only,
    }
    if session.platform != "CPU":
        view, reason = try_view(session, "utilization")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, host_plane_source(session) if session.platform == "CPU" else DEVICE_PLANE_SOURCE)
