"""Stragglers: who arrives last at each collective, and how long the others wait for it.

In synchronous data-parallel work every participant leaves a collective together, so step times match even
when one participant is slow; the slow one shows as the participant that arrives last while the others wait
inside the collective (TraceLens's per-rank straggler summary; DeepSpeed's "straggler effect"). The hosts of
one session share a clock only approximately, so each instance is aligned on its end, which all participants
share: a participant's arrival is its start relative to its own end of the collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xdiag.analysis.intervals import PS_PER_MS, merge_intervals
from xdiag.analysis.op_table import op_table
from xdiag.analysis.steps import step_set
from xdiag.profile.space import Session

MIN_LAST_ARRIVAL_SHARE = 0.6
"""A straggler arrives last at most instances of the collectives it takes part in (chance is 1/participants)."""
MIN_WAIT_SHARE_OF_STEP = 0.10
"""...and waiting for it costs, averaged over all participants, at least this share of the step: the share of
collectives a healthy step may have (one device of two waiting 11% is 5.5% of the pair's time)."""


@dataclass
class Participant:
    name: str  # a host (across hosts) or a device (within one host)
    instances: int = 0
    last_arrivals: int = 0
    wait_ps: int = 0  # time it waited inside collectives for the last participant
    caused_wait_ps: int = 0  # the others' waiting in the instances where it arrived last

    def row(self, steps: int) -> dict:
        per_step = max(steps, 1)
        return {
            "participant": self.name,
            "collective_instances": self.instances,
            "last_arrivals": self.last_arrivals,
            "last_arrival_share_percent": round(100 * self.last_arrivals / self.instances, 1) if self.instances else 0.0,
            "collective_wait_ms_per_step": round(self.wait_ps / per_step / PS_PER_MS, 4),
            "caused_wait_ms_per_step": round(self.caused_wait_ps / per_step / PS_PER_MS, 4),
        }


@dataclass
class Arrivals:
    level: str  # "hosts" or "devices": who the participants are
    instances: int
    skew_ms_mean: float
    skew_ms_max: float
    participants: dict[str, Participant] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)  # a few aligned instances, for the report


def _instance_keys(session: Session, devices: np.ndarray, names: np.ndarray, modules: np.ndarray, starts: np.ndarray) -> list[tuple]:
    """(module, op, step, occurrence): the same collective in the same step on every participant.

    Step numbers come from the hosts' step annotations, which synchronous training numbers alike on every host;
    without them, the k-th execution on each participant is the same instance."""
    found = step_set(session)
    annotated = {}
    for step in found.steps:
        if step.device is None:
            annotated.setdefault(step.host, []).append(step)
    windows = {
        host: (np.array([s.start_ps for s in steps]), np.array([s.end_ps for s in steps]), np.array([s.number for s in steps]))
        for host, steps in annotated.items()
    }
    counter: dict[tuple, int] = {}
    keys = []
    for device, name, module, start in zip(devices.tolist(), names.tolist(), modules.tolist(), starts.tolist()):
        host = device.split(" ", 1)[0]
        step = -1
        if host in windows:
            win_s, win_e, numbers = windows[host]
            k = int(np.searchsorted(win_s, start, side="right")) - 1
            if k >= 0 and start < win_e[k]:
                step = int(numbers[k])
        base = (module, name, step)
        occurrence = counter.get((device, *base), 0)
        counter[(device, *base)] = occurrence + 1
        keys.append((*base, occurrence))
    return keys


def _union_ps(intervals: list[tuple[int, int]]) -> int:
    pairs = np.array(intervals, np.int64).reshape(-1, 2)
    starts, ends = merge_intervals(pairs[:, 0], pairs[:, 1])
    return int((ends - starts).sum())


Record = tuple[tuple, str, int, int]
"""One collective execution: (instance key, device, start ps, end ps)."""


def collective_records(session: Session) -> list[Record]:
    """Every collective execution of the session in start order (ties in the op table's order), with the key of its
    instance (`_instance_keys`): what `arrivals_of` aligns. A host's records need only that host's ops and steps, so
    the map stage records them host by host and the reduce concatenates them (xdiag.analysis.host_summary)."""
    ops = op_table(session)
    mask = ops.in_categories(["collective"])
    if not mask.any():
        return []
    devices, starts, ends = ops.device[mask], ops.start_ps[mask], ops.end_ps[mask]
    order = np.argsort(starts, kind="stable")
    devices, starts, ends = devices[order], starts[order], ends[order]
    names, modules = ops.name[mask][order], ops.module[mask][order]
    keys = _instance_keys(session, devices, names, modules, starts)
    return list(zip(keys, devices.tolist(), starts.tolist(), ends.tolist()))


def collective_arrivals(session: Session) -> Arrivals | None:
    """Per collective instance with two or more participants: arrival skew, who came last, who waited how long.
    None when the session has no collective that several participants run."""
    if "collective_arrivals" not in session.cache:
        session.cache["collective_arrivals"] = arrivals_of(collective_records(session))
    return session.cache["collective_arrivals"]


def arrivals_of(records: list[Record]) -> Arrivals | None:
    """The arrivals of these collective executions (collective_records, in start order); None where fewer than two
    participants share an instance."""
    if len(records) < 2:
        return None
    hosts = [device.split(" ", 1)[0] for _, device, _, _ in records]
    level = "hosts" if len(set(hosts)) >= 2 else "devices"
    instances: dict[tuple, dict[str, int]] = {}
    started: dict[tuple, dict[str, int]] = {}  # each member's start of the instance, on its own clock
    for (key, device, start, end), host in zip(records, hosts):
        participant = host if level == "hosts" else device
        # Arrival relative to the instance's end; a host with several devices arrives with its last device.
        arrival = start - end
        members = instances.setdefault(key, {})
        if arrival >= members.get(participant, arrival):
            members[participant] = arrival
            started.setdefault(key, {})[participant] = start
    participants: dict[str, Participant] = {}
    skews, examples = [], []
    # Waits as intervals on each waiter's own clock: collectives in flight at once (DDP's buckets on gloo's
    # worker threads, NCCL on several streams) wait for the same straggler at the same time, counted once.
    waits: dict[str, list[tuple[int, int]]] = {}
    caused: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (last, waiter) -> the waiter's intervals
    for key, members in instances.items():
        if len(members) < 2:
            continue
        last = max(members, key=members.get)
        latest = members[last]
        skews.append(latest - min(members.values()))
        for name, arrival in members.items():
            p = participants.setdefault(name, Participant(name))
            p.instances += 1
            begin = started[key][name]
            waits.setdefault(name, []).append((begin, begin + latest - arrival))
            caused.setdefault((last, name), []).append((begin, begin + latest - arrival))
        participants[last].last_arrivals += 1
    for name, intervals in waits.items():
        participants[name].wait_ps = _union_ps(intervals)
    for (last, _), intervals in caused.items():
        participants[last].caused_wait_ps += _union_ps(intervals)
        if len(examples) < 5:
            examples.append({
                "op": key[1], "module": key[0], "step": key[2], "last": last,
                "arrival_before_end_ms": {n: round(-a / PS_PER_MS, 4) for n, a in sorted(members.items())},
                "skew_ms": round(skews[-1] / PS_PER_MS, 4),
            })
    if not skews:
        return None
    return Arrivals(
        level=level, instances=len(skews),
        skew_ms_mean=round(float(np.mean(skews)) / PS_PER_MS, 4),
        skew_ms_max=round(float(np.max(skews)) / PS_PER_MS, 4),
        participants=dict(sorted(participants.items())), examples=examples,
    )


def straggler(arrivals: Arrivals | None, steps: int, step_ms: float) -> Participant | None:
    """The participant that arrives last at most collectives and makes the participants wait a visible share of
    the step (MIN_LAST_ARRIVAL_SHARE, MIN_WAIT_SHARE_OF_STEP); None when no one does."""
    if arrivals is None or len(arrivals.participants) < 2 or not step_ms:
        return None
    candidate = max(arrivals.participants.values(), key=lambda p: (p.last_arrivals, p.caused_wait_ps))
    share = candidate.last_arrivals / max(candidate.instances, 1)
    waited_ms_per_step = candidate.caused_wait_ps / max(steps, 1) / len(arrivals.participants) / PS_PER_MS
    if share < MIN_LAST_ARRIVAL_SHARE or waited_ms_per_step < MIN_WAIT_SHARE_OF_STEP * step_ms:
        return None
    return candidate


CAUSES = {
    "host_other": "input or host work outside the compiled step (nothing runs on its device meanwhile)",
    "compute": "more device compute per step than its peers",
    "dispatch": "more time dispatching programs",
    "host_sync": "more time blocked on device results or host callbacks",
    "compile": "compilation inside its steps",
    "transfer": "more data copies between memories",
    "idle": "more idle device time before it reaches the collective",
}


def own_cause(own: dict[str, float], peers: list[dict[str, float]]) -> tuple[str, float] | None:
    """The category of its own step (ms per step) that exceeds its peers' mean the most: why it is late."""
    if not peers:
        return None
    excess = {k: own.get(k, 0.0) - float(np.mean([p.get(k, 0.0) for p in peers])) for k in CAUSES if k in own}
    if not excess:
        return None
    key = max(excess, key=excess.get)
    return (key, round(excess[key], 4)) if excess[key] > 0 else None
