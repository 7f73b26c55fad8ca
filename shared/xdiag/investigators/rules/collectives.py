"""Findings about communication: collectives that dominate the step, and the straggler the others wait for at
them (named with its own cause, and the fix for that cause)."""

from __future__ import annotations

import math
import re
from typing import Any

from xdiag.investigators import advice
from xdiag.investigators.health import HealthSnapshot
from xdiag.investigators.rules.hypothesis import (Hypothesis, evidence, neighborhood_evidence, saving, sentence,
                                                  shape_note)
from xdiag.investigators.rules.registry import Facts, rule

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8}
_ARRAY_SHAPE = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")


def _array_bytes(shape: str) -> int | None:
    """Bytes of one HLO array shape text ("f32[1048576]{0}"); None where the type is not a plain array."""
    match = _ARRAY_SHAPE.match(shape)
    if not match or match.group(1) not in _DTYPE_BYTES:
        return None
    return _DTYPE_BYTES[match.group(1)] * math.prod(int(d) for d in match.group(2).split(",") if d)


def _collective_fix(top: dict | None, step: dict[str, Any], health: HealthSnapshot, ctx: advice.Context) -> str:
    """What the top collective's own row shows: how often it runs per device and step, inside a loop or not,
    and which operand carries its bytes; the general levers only where the row shows nothing more."""
    generic = advice.communicate_less(ctx)
    if not top:
        return generic
    parts = []
    device_steps = (step.get("steps") or 0) * (health.devices.active_devices or 1)
    runs = top["count"] / device_steps if device_steps else 0
    scope = str(top.get("framework_op") or "")
    if runs >= 1.5 and ("while/body" in scope or "scan" in scope):
        parts.append(f"{top['op']} runs {runs:.3g} times per device and step inside a loop ({scope}), on the same "
                     "shapes each time: accumulate over the loop's iterations (micro-batches) and reduce once per step")
    sizes = [(s, b) for s in top.get("operand_shapes") or [] if (b := _array_bytes(s)) is not None]
    total = sum(b for _, b in sizes)
    if len(sizes) > 1 and total:
        shape, largest = max(sizes, key=lambda sb: sb[1])
        if largest >= 0.8 * total:
            parts.append(f"its operand {shape.split('{')[0]} carries {100 * largest / total:.0f}% of the "
                         f"{total / 1e6:.3g} MB each run sends: check that this buffer must be reduced every step, "
                         "and reduce it in bf16 or shard it instead of replicating it")
    return "; ".join(parts + ["otherwise " + generic]) if parts else generic


@rule("collectives")
def collectives(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Collective communication that the devices' compute does not hide."""
    collective = facts.breakdown.get("collective", 0.0)
    op_collective = (facts.summary("get_hlo_op_profile").get("category_percent") or {}).get("collective", 0.0)
    if not (collective >= 15 or op_collective >= 30):
        return None
    ops = [o for o in facts.detail("get_hlo_op_profile").get("ops", []) if o.get("category") == "collective"]
    ev = facts.base + [evidence("get_step_trace", "collective_percent", collective),
                       evidence("get_hlo_op_profile", "category_percent.collective", op_collective)]
    if ops:
        ev.append(evidence("get_hlo_op_profile", f"top collective {ops[0]['op']}", ops[0]["total_ms"],
                           f"ms over {ops[0]['count']} runs{shape_note(ops[0])}"))
    hosts = facts.summary("get_hosts")
    unseen = (hosts.get("not_available") or {}).get("straggler")
    if unseen and hosts.get("ranks_not_in_session"):
        # A lone rank's time in a collective is its transfer and its wait for the last rank, which only the
        # other ranks' traces tell apart.
        ev.append(evidence("get_hosts", "not_available.straggler", unseen))
    return Hypothesis(
        "collectives", max(collective, op_collective * facts.compute / 100),
        "Collective communication dominates the step",
        f"Collective ops (all-reduce, all-gather, …) take {op_collective}% of op time and the devices spend "
        f"{collective}% of the step only communicating; compute per device is too small to hide it."
        + (" Part of that time may be waiting for a slower rank, which this session cannot show: "
           f"{unseen}." if unseen and hosts.get("ranks_not_in_session") else ""),
        ev,
        saving(facts.step_ms, collective),
        sentence(_collective_fix(ops[0] if ops else None, facts.step, facts.health, facts.context())),
        follow_up=("get_hlo_neighborhood", {"op": ops[0]["op"], "module": ops[0]["module"]})
        if ops and ops[0].get("module") else None,
        extra_evidence=neighborhood_evidence,
    )


_STRAGGLER_FIX = {
    "host_other": "Fix that host's input path: prefetch and preprocess its batches in background workers, check its "
    "data shard (size, storage, decoding cost) against the others', and look for host-side contention (other "
    "processes, CPU throttling) on that machine.",
    "compute": "Balance the work: give that participant a shard the same size as the others' (sequence lengths, "
    "padding, uneven batch split), and check its hardware (clocks, thermal throttling, a degraded device or link).",
}


@rule("straggler_host")
def straggler_host(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """A straggler: the participant the others wait for at the collectives, named with its own cause; where no
    collective aligns the participants, the host whose mean step is far slower than the others'."""
    straggler = _straggler_hypothesis(facts)
    if straggler is not None:
        return straggler
    hosts = facts.summary("get_hosts")
    if (hosts.get("step_time_spread_percent") or 0) < 20:
        return None
    return Hypothesis(
        "straggler_host", min(hosts["step_time_spread_percent"], 60.0),
        f"Host {hosts['slowest_host']} is a straggler",
        f"Its mean step time is {hosts['step_time_spread_percent']}% above the fastest host's; the hosts do "
        "not run in lockstep, so the slowest one sets the pace of whatever waits for all of them.",
        [evidence("get_hosts", "step_time_spread_percent", hosts["step_time_spread_percent"]),
         evidence("get_hosts", "slowest_host", hosts["slowest_host"])],
        f"Up to {hosts['step_time_spread_percent']:.0f}% faster steps on the other hosts.",
        "Compare that host's input pipeline and hardware health; balance data shards.",
        follow_up=("get_hosts", {}),
    )


def _straggler_hypothesis(facts: Facts) -> Hypothesis | None:
    """The participant that arrives last at the collectives, from get_hosts' alignment of collective instances."""
    step_ms = facts.step_ms
    hosts = facts.summary("get_hosts")
    name = hosts.get("straggler")
    if not name or not step_ms:
        return None
    kind = "Host" if hosts.get("participant_level") == "hosts" else "Device"
    who = name
    if hosts.get("straggler_rank") is not None:  # a rank of a distributed job, as its trace numbers it
        kind, who = "Rank", f"{hosts['straggler_rank']} ({name})"
    wait = hosts["straggler_caused_wait_ms_per_step"]
    wait_share = round(100 * wait / step_ms, 2)
    cause = hosts.get("straggler_cause")
    cause_text = (facts.detail("get_hosts").get("straggler_cause") or "") if cause else ""
    excess = hosts.get("straggler_cause_excess_ms_per_step")
    own = (f" Its own step shows why: {cause_text} — {excess:.3g} ms per step more than its peers."
           if cause else " Its own step breakdown does not show a cause that its peers lack.")
    ev = [
        evidence("get_hosts", "straggler", name, f"participants: {hosts.get('participant_level')}"),
        evidence("get_hosts", "straggler_last_arrival_share_percent", hosts["straggler_last_arrival_share_percent"],
                 f"of {hosts.get('collective_instances')} collective instances, aligned on their end"),
        evidence("get_hosts", "arrival_skew_ms_mean", hosts.get("arrival_skew_ms_mean"),
                 f"max {hosts.get('arrival_skew_ms_max')} ms"),
        evidence("get_hosts", "straggler_caused_wait_ms_per_step", wait,
                 "each other participant waits this long per step"),
        evidence("get_step_trace", "step_time_ms_mean", step_ms),
    ]
    if who != name:
        ev.insert(1, evidence("get_hosts", "straggler_rank", hosts["straggler_rank"], "its rank, as its trace says"))
    if cause:
        ev.append(evidence("get_hosts", "straggler_cause", cause, f"+{excess} ms per step over its peers"))
    return Hypothesis(
        "straggler_host", wait_share,
        f"{kind} {who} is a straggler: the others wait for it at every collective",
        f"{kind} {who} arrives last at {hosts['straggler_last_arrival_share_percent']}% of the "
        f"{hosts.get('collective_instances')} collective instances (arrival skew {hosts.get('arrival_skew_ms_mean')} ms "
        f"on average); every other participant waits {wait:.3g} ms per step inside the collective for it "
        f"({wait_share}% of the {step_ms:.4g} ms step), so all step times match the slowest one's.{own}",
        ev,
        f"Up to {wait_share:.0f}% shorter steps for every participant: {step_ms:.4g} ms → about "
        f"{step_ms - wait:.3g} ms if it arrived with the others.",
        _STRAGGLER_FIX.get(cause or "", "Profile that participant alone: compare its input pipeline, its share of "
                           "the work and its hardware health with the others'."),
        follow_up=("get_hosts", {}),
    )
