"""get_hosts: which hosts are in the session, and is any of them a straggler?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.breakdown import step_rows
from xdiag.profile.space import Session
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_hosts",
    "The hosts of the session with their files, planes, devices and events, and per host the mean step time "
    "and compute share, so a straggling host stands out.",
)
def get_hosts(session: Session) -> ToolOutput:
    """summary: hosts, slowest_host, step_time_spread_percent (slowest vs fastest host mean step time).
    detail: per host: file, size, planes, devices, events, steps, step_time_ms_mean, compute_percent."""
    rows = step_rows(session)
    hosts = []
    for host in session.hosts:
        mine = [r for r in rows if r.host == host.hostname]
        step_ms = [r.step_ms for r in mine]
        compute = sum(r.ms["compute"] for r in mine)
        hosts.append(
            {
                "host": host.hostname,
                "file": host.path.name,
                "bytes": host.size_bytes,
                "planes": [p.name for p in host.planes],
                "device_planes_with_events": sum(1 for p in host.planes if p.is_device and p.event_count),
                "events": sum(p.event_count for p in host.planes),
                "steps": len(mine),
                "step_time_ms_mean": round(float(np.mean(step_ms)), 4) if step_ms else None,
                "compute_percent": round(100 * compute / sum(step_ms), 2) if step_ms and sum(step_ms) else None,
                "errors": host.errors[:5],
            }
        )
    timed = [h for h in hosts if h["step_time_ms_mean"]]
    summary = {"hosts": len(hosts)}
    if len(timed) >= 2:
        slowest = max(timed, key=lambda h: h["step_time_ms_mean"])
        fastest = min(timed, key=lambda h: h["step_time_ms_mean"])
        summary.update(
            slowest_host=slowest["host"],
            step_time_spread_percent=round(
                100 * (slowest["step_time_ms_mean"] - fastest["step_time_ms_mean"]) / fastest["step_time_ms_mean"], 2
            ),
        )
    return ToolOutput(summary, {"hosts": hosts}, "profile hosts")
