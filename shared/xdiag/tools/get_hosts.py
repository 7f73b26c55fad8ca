"""get_hosts: which hosts are in the session, how each one's step goes, and is any participant a straggler?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.breakdown import CATEGORIES, StepRow, device_rows, device_table, step_rows
from xdiag.analysis.stragglers import CAUSES, collective_arrivals, own_cause, straggler
from xdiag.profile.space import Session
from xdiag.tools.registry import ToolOutput, tool


def _per_step_ms(rows: list[StepRow]) -> dict[str, float]:
    """A participant's mean ms per step in each category."""
    return {c: float(np.mean([r.ms[c] for r in rows])) for c in CATEGORIES} if rows else {}


@tool(
    "get_hosts",
    "The hosts of the session (files, planes, devices, events) with one row per host: step time, breakdown, "
    "collective wait and host/input time; and the straggler evidence across hosts (or devices): who arrives last "
    "at each collective, the arrival skew, the wait it causes, and its own cause.",
)
def get_hosts(session: Session) -> ToolOutput:
    """summary: hosts, slowest_host, step_time_spread_percent; where collectives are shared: participant_level,
    collective_instances, arrival_skew_ms_{mean,max}, straggler (+ straggler_last_arrival_share_percent,
    straggler_caused_wait_ms_per_step, straggler_cause, straggler_cause_excess_ms_per_step).
    detail: per host: file, size, planes, devices, events, steps, step_time_ms_mean, <category>_percent,
    collective_wait_ms_per_step, host_other_ms_per_step; participants (arrivals), examples; devices (spread)."""
    rows = step_rows(session)
    arrivals = collective_arrivals(session)
    waits = {p.name: p for p in arrivals.participants.values()} if arrivals else {}
    hosts = []
    for host in session.hosts:
        mine = [r for r in rows if r.host == host.hostname]
        step_ms = [r.step_ms for r in mine]
        total = sum(step_ms)
        per_step = _per_step_ms(mine)
        steps = len({r.number for r in mine})
        row = {
            "host": host.hostname,
            "file": host.path.name,
            "bytes": host.size_bytes,
            "planes": [p.name for p in host.planes],
            "device_planes_with_events": sum(1 for p in host.planes if p.is_device and p.event_count),
            "events": sum(p.event_count for p in host.planes),
            "steps": steps,
            "step_time_ms_mean": round(float(np.mean(step_ms)), 4) if step_ms else None,
            **{f"{c}_percent": round(100 * sum(r.ms[c] for r in mine) / total, 2) if total else None for c in CATEGORIES},
            "host_other_ms_per_step": round(per_step["host_other"], 4) if per_step else None,
            "errors": host.errors[:5],
        }
        if arrivals is not None and arrivals.level == "hosts" and host.hostname in waits:
            p = waits[host.hostname]
            row.update(
                collective_wait_ms_per_step=p.row(steps)["collective_wait_ms_per_step"],
                last_arrivals=p.last_arrivals,
                collective_instances=p.instances,
            )
        hosts.append(row)
    timed = [h for h in hosts if h["step_time_ms_mean"]]
    summary: dict = {"hosts": len(hosts)}
    if len(timed) >= 2:
        slowest = max(timed, key=lambda h: h["step_time_ms_mean"])
        fastest = min(timed, key=lambda h: h["step_time_ms_mean"])
        summary.update(
            slowest_host=slowest["host"],
            step_time_spread_percent=round(
                100 * (slowest["step_time_ms_mean"] - fastest["step_time_ms_mean"]) / fastest["step_time_ms_mean"], 2
            ),
        )
    detail: dict = {"hosts": hosts, "devices": device_table(device_rows(session))}
    if arrivals is not None:
        steps = max((h["steps"] for h in timed), default=1) or 1
        step_ms = float(np.mean([h["step_time_ms_mean"] for h in timed])) if timed else 0.0
        summary.update(
            participant_level=arrivals.level,
            collective_instances=arrivals.instances,
            arrival_skew_ms_mean=arrivals.skew_ms_mean,
            arrival_skew_ms_max=arrivals.skew_ms_max,
        )
        detail["participants"] = [p.row(steps) for p in arrivals.participants.values()]
        detail["aligned_instances"] = arrivals.examples
        detail["alignment"] = (
            "per collective instance (same op, same step, same occurrence) each participant's arrival is its "
            "start before its own end of the collective, which all participants leave together"
        )
        slow = straggler(arrivals, steps, step_ms)
        if slow is not None:
            summary.update(
                straggler=slow.name,
                straggler_last_arrival_share_percent=slow.row(steps)["last_arrival_share_percent"],
                straggler_caused_wait_ms_per_step=round(slow.caused_wait_ps / steps / (len(arrivals.participants) - 1) / 1e9, 4),
            )
            cause = _cause(session, rows, arrivals.level, slow.name)
            if cause is not None:
                summary.update(straggler_cause=cause[0], straggler_cause_excess_ms_per_step=cause[1])
                detail["straggler_cause"] = CAUSES[cause[0]]
    return ToolOutput(summary, detail, "profile hosts; collective alignment across participants")


def _cause(session: Session, rows: list[StepRow], level: str, name: str) -> tuple[str, float] | None:
    if level == "hosts":
        by_host: dict[str, list[StepRow]] = {}
        for r in rows:
            by_host.setdefault(r.host, []).append(r)
        own = _per_step_ms(by_host.get(name, []))
        peers = [_per_step_ms(v) for k, v in by_host.items() if k != name and v]
    else:
        table = {r.device: {k: v / max(r.steps, 1) for k, v in r.ms.items()} for r in device_rows(session)}
        own = table.get(name, {})
        peers = [v for k, v in table.items() if k != name]
    return own_cause(own, peers) if own else None
