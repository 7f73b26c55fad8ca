"""From hypotheses to ranked findings: one cause, one finding (reconcile), none under the noise floor, the largest
stake first, and a cause before the symptoms its ops make slow."""

from __future__ import annotations

from typing import Any

from xdiag.investigators.rules.host import HOST_BOUND_MIN_PERCENT
from xdiag.investigators.rules.hypothesis import Hypothesis, device_idle, evidence, saving, sentence

MIN_FINDING_PERCENT = 1.0
"""A finding must stake at least this share of the step: below it, it is noise in the report."""
NOT_TIME_FINDINGS = {"memory_pressure"}
"""Findings whose score is a risk level, not a share of step time."""


def ranked(found: list[Hypothesis], b: dict[str, float], step_ms: float | None,
           step: dict[str, Any]) -> list[Hypothesis]:
    """The hypotheses reconciled, those staking too little dropped, the rest by score, causes first."""
    kept = [h for h in reconcile(found, b, step_ms, step)
            if h.key in NOT_TIME_FINDINGS or h.score >= MIN_FINDING_PERCENT]
    return causes_first(sorted(kept, key=lambda h: -h.score))


def realisable(h: Hypothesis) -> float:
    """The share of the step a finding's first change is expected to give back: the middle of its prediction (a
    lever's or an idiom's, from what the change recovered on the chip), else its stake (what removing the time it
    measures gives), and nothing where its fix offers no change (a withheld lever)."""
    if h.withheld:
        return 0.0
    if h.predicted is not None:
        return (h.predicted[0] + h.predicted[1]) / 2
    return h.score


def by_realisable_gain(found: list[Hypothesis]) -> list[Hypothesis]:
    """The findings by what their first change is expected to save, largest first; a finding with no change to make
    (its change withheld, or only a kind of remedy named) comes after every finding that has one (it says what to
    measure next). Findings whose score is a risk level keep their places."""
    order = iter(sorted((h for h in found if h.key not in NOT_TIME_FINDINGS),
                        key=lambda h: (h.withheld, h.names_no_change, -realisable(h))))
    return [h if h.key in NOT_TIME_FINDINGS else next(order) for h in found]


def _host_work_on_reads(out: list[Hypothesis], found: dict[str, Hypothesis], b: dict[str, float],
                        step_ms: float | None, step: dict[str, Any]) -> list[Hypothesis]:
    """Host time that begins where a read copying device arrays back ends is the host working on what it read
    (numpy on fetched weights or activations): its fix is the reads' fix (compute it on the device, fetch less), not
    an input pipeline's (prefetching cannot run ahead of data the device has not produced yet)."""
    sync, host_bound = found.get("host_sync"), found.get("input_bound")
    after_read = step.get("host_after_read_percent") or 0.0
    if sync is None or host_bound is None or after_read < host_bound.score / 2:
        return out
    sync.score = min(sync.score + after_read, 100.0)
    copies = b.get("transfer", 0.0)
    sync.whats_happening += (
        f" Right after the reads that copy arrays back (host–device copies take {copies}% of the step), the host works on "
        f"what they returned for another {after_read}% of it before it dispatches more work, with the device idle: "
        "that host time exists because of the reads, so it is counted here rather than as input work.")
    sync.evidence.append(evidence("get_step_trace", "host_after_read_percent", after_read,
                                  f"of the {b.get('host_other')}% host time outside any traced call"))
    sync.expected_impact = saving(step_ms, sync.score, device_idle(b))
    sync.fix = sentence(sync.fix.rstrip(".") + "; compute on the device (jnp) what the host computes on the arrays "
                        "it fetches, and fetch only that result, not whole arrays")
    host_bound.score = round(host_bound.score - after_read, 2)
    if host_bound.score < HOST_BOUND_MIN_PERCENT:
        found.pop("input_bound")
    return [h for h in out if h.key != "input_bound" or "input_bound" in found]


def causes_first(ranked: list[Hypothesis]) -> list[Hypothesis]:
    """A finding whose ops add the bytes that make another finding's ops slow (a widening convert writes the f32 copy
    that memory-bound reductions read back) is that symptom's cause: it stakes at least the symptom's time, comes
    before it, and each says how they are linked."""
    order = list(ranked)
    for cause in ranked:
        for symptom in ranked:
            shared = sorted(op for _, op in cause.inflates & symptom.ops)
            if symptom is cause or not shared:
                continue
            named = ", ".join(shared[:4])
            cause.score = max(cause.score, symptom.score)
            cause.whats_happening += (f" What these ops write is read by {named}, ops of the '{symptom.title}' "
                                      "finding: this is that finding's cause, so it comes first.")
            symptom.whats_happening += (f" {len(shared)} of these ops ({named}) read what the ops of the "
                                        f"'{cause.title}' finding write: that finding is their cause and comes first.")
            if order.index(cause) > order.index(symptom):
                order.remove(cause)
                order.insert(order.index(symptom), cause)
    return order


def reconcile(out: list[Hypothesis], b: dict[str, float], step_ms: float | None,
              step: dict[str, Any]) -> list[Hypothesis]:
    """One cause, one finding: time a stronger explanation already accounts for is not reported twice."""
    found = {h.key: h for h in out}
    out = _host_work_on_reads(out, found, b, step_ms, step)
    straggler = found.get("straggler_host")
    if straggler is not None and "straggler_cause" in {e.metric for e in straggler.evidence}:
        waited = straggler.score
        collectives = found.get("collectives")
        if collectives is not None:
            # The others' wait for the straggler shows as collective time; it is the straggler's finding.
            collectives.score = max(collectives.score - waited, 0.0)
            if collectives.score < 5:
                out = [h for h in out if h.key != "collectives"]
        cause = next(e.value for e in straggler.evidence if e.metric == "straggler_cause")
        if cause == "host_other" and "input_bound" in found:
            out = [h for h in out if h.key != "input_bound"]  # the host time is the straggler's own, not everyone's
    if "unfused_kernels" in found and "dispatch_overhead" in found:
        # The framework's op-by-op launches are the launch gaps the unfused-kernels finding already stakes.
        out = [h for h in out if h.key != "dispatch_overhead"]
        found.pop("dispatch_overhead")
    dispatch = found.get("dispatch_overhead")
    if dispatch is not None and "input_bound" in found and "dispatches_per_step_mean" in {e.metric for e in dispatch.evidence}:
        dispatches = next(e.value for e in dispatch.evidence if e.metric == "dispatches_per_step_mean")
        if dispatches >= 20:
            # Op-by-op code: the host time between many small launches is the Python that drives them.
            host_other = found["input_bound"].score
            dispatch.score = min(dispatch.score + host_other, 100.0)
            dispatch.whats_happening += (
                f" Between the launches the host runs Python for another {host_other}% of the step with no device "
                "work: in op-by-op code that is the driving loop's own overhead, counted here rather than as input."
            )
            dispatch.evidence.append(evidence("get_step_trace", "host_other_percent", b.get("host_other")))
            dispatch.expected_impact = saving(step_ms, dispatch.score, device_idle(b))
            out = [h for h in out if h.key != "input_bound"]
    return out
