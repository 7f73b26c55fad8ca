"""get_utilization_viewer: how busy is each device (and each XLA thread) over the profile?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.timeline import covered, op_table, step_set
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, HOST_PLANE_SOURCE, percent, try_view
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_utilization_viewer",
    "Per device: the share of the stepped window in which it runs XLA ops, and the least and most busy device.",
)
def get_utilization_viewer(session: Session) -> ToolOutput:
    """summary: devices, busy_percent_mean, busy_percent_min, least_busy_device. detail: per-device rows."""
    ops = op_table(session)
    if not len(ops):
        raise NotAvailable("the profile holds no XLA op executions to measure device busy time from")
    steps = step_set(session).steps
    rows = []
    for device in sorted(set(ops.device)):
        host = device.split(" ", 1)[0]
        windows = [s for s in steps if s.host == host] or steps
        win_s = np.array([s.start_ps for s in windows]) if windows else np.array([ops.start_ps.min()])
        win_e = np.array([s.end_ps for s in windows]) if windows else np.array([ops.end_ps.max()])
        mask = ops.device == device
        busy = covered(ops.start_ps[mask], ops.end_ps[mask], win_s, win_e).sum()
        rows.append({"device": device, "busy_percent": percent(busy, (win_e - win_s).sum()), "op_executions": int(mask.sum())})
    busy = [r["busy_percent"] for r in rows]
    summary = {
        "devices": len(rows),
        "busy_percent_mean": round(float(np.mean(busy)), 2),
        "busy_percent_min": min(busy),
        "busy_percent_max": max(busy),
        "least_busy_device": min(rows, key=lambda r: r["busy_percent"])["device"],
    }
    detail: dict = {"devices": rows, "window": "the steps (or the whole profile where there are none)"}
    if session.platform != "CPU":
        view, reason = try_view(session, "utilization")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, HOST_PLANE_SOURCE if session.platform == "CPU" else DEVICE_PLANE_SOURCE)
