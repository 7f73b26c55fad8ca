"""get_hosts: which hosts are in the session, how each one's step goes, and is any participant a straggler?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.breakdown import CATEGORIES, StepRow, device_rows, step_rows
from xdiag.analysis.device_time import device_table
from xdiag.analysis.stragglers import CAUSES, collective_arrivals, own_cause, straggler
from xdiag.profile.space import Session
from xdiag.tools.registry import ToolOutput, tool


def _rank_of(host) -> dict:
    """The host's place in its distributed job, as its trace says it (Kineto's `distributedInfo`): rank, world size
    and backend; {} where the trace does not say."""
    for plane in host.planes:
        if plane.name == "/host:CPU" and plane.stats.get("distributed_rank") is not None:
            found = {"rank": plane.stats["distributed_rank"], "world_size": plane.stats.get("distributed_world_size"),
                     "backend": plane.stats.get("distributed_backend")}
            return {k: v for k, v in found.items() if v is not None}
    return {}


def _ranks_missing(ranks: list[dict]) -> tuple[list[int], int] | None:
    """(the ranks of the job whose traces are not in the session, the job's world size), where the traces name
    their ranks and world size and some are missing; None otherwise."""
    sizes = {r["world_size"] for r in ranks if r.get("world_size")}
    if not sizes:
        return None
    world = max(sizes)
    missing = sorted(set(range(world)) - {int(r["rank"]) for r in ranks if "rank" in r})
    return (missing, world) if missing else None


def _no_verdict_reason(ranks: list[dict], missing: tuple[list[int], int] | None, arrivals) -> str | None:
    """Why no straggler verdict can be given, where none can: a lone rank of a multi-rank job (the others' traces
    are not in the session), or ranks that share no collective instance."""
    present = [r for r in ranks if "rank" in r]
    if missing is not None and len(present) <= 1:
        world = missing[1]
        rank = present[0]["rank"] if present else "?"
        return (f"this is rank {rank} of {world}: the session holds only this rank's trace, and the other "
                f"{world - 1} ranks' traces are not in it; which rank arrives last at a collective shows only beside "
                "the others' arrivals (analyse a folder holding every rank's trace)")
    if len(ranks) >= 2 and arrivals is None:
        return ("no collective instance is found on two or more hosts: nothing to align their arrivals on")
    return None


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
    """summary: hosts, slowest_host, step_time_spread_percent; where the traces name their ranks (Kineto's
    distributedInfo): ranks_in_session, world_size, ranks_not_in_session; not_available.straggler where no verdict
    can be given (a lone rank of a multi-rank job, hosts that share no collective); where collectives are shared:
    participant_level, collective_instances, arrival_skew_ms_{mean,max}, straggler (+ straggler_rank,
    straggler_last_arrival_share_percent, straggler_caused_wait_ms_per_step, straggler_cause,
    straggler_cause_excess_ms_per_step).
    detail: per host: rank, world_size, backend (where the trace says), file, size, planes, devices, events, steps,
    step_time_ms_mean, <category>_percent, collective_wait_ms_per_step, host_other_ms_per_step; participants
    (arrivals), examples; devices (spread); ranks_not_in_session."""
    rows = step_rows(session)
    arrivals = collective_arrivals(session)
    ranks = [_rank_of(host) for host in session.hosts]
    waits = {p.name: p for p in arrivals.participants.values()} if arrivals else {}
    hosts = []
    for host, rank in zip(session.hosts, ranks):
        mine = [r for r in rows if r.host == host.hostname]
        step_ms = [r.step_ms for r in mine]
        total = sum(step_ms)
        per_step = _per_step_ms(mine)
        steps = len({r.number for r in mine})
        row = {
            "host": host.hostname,
            **rank,
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
    missing = _ranks_missing(ranks)
    if any(ranks):
        summary["ranks_in_session"] = sorted(int(r["rank"]) for r in ranks if "rank" in r)
        summary["world_size"] = max((r["world_size"] for r in ranks if r.get("world_size")), default=None)
    if missing is not None:
        summary["ranks_not_in_session"] = len(missing[0])
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
            rank = next((h["rank"] for h in hosts if h["host"] == slow.name and "rank" in h), None)
            if arrivals.level == "hosts" and rank is not None:
                summary["straggler_rank"] = rank
            summary.update(
                straggler=slow.name,
                straggler_last_arrival_share_percent=slow.row(steps)["last_arrival_share_percent"],
                straggler_caused_wait_ms_per_step=round(slow.caused_wait_ps / steps / (len(arrivals.participants) - 1) / 1e9, 4),
            )
            cause = _cause(session, rows, arrivals.level, slow.name)
            if cause is not None:
                summary.update(straggler_cause=cause[0], straggler_cause_excess_ms_per_step=cause[1])
                detail["straggler_cause"] = CAUSES[cause[0]]
    reason = None if "straggler" in summary else _no_verdict_reason(ranks, missing, arrivals)
    if reason is not None:
        summary["not_available"] = {"straggler": reason}
    if missing is not None:
        detail["ranks_not_in_session"] = missing[0]
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
