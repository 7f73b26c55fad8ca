"""Findings from the idiom catalogue (xdiag.idioms): what the program does that an expert writes differently.

Each match get_program_anatomy reports becomes one finding: what the ops compute (opcode, shapes, the user's line),
the change in the program's own API, and a gain predicted from the match's measured stake and the share of it the
change recovered on the chip. A match explains the time a bottleneck-class finding would report for the same ops or
the same host time (the matmul's "memory-bound" rate, a loop's "dispatch" and "sync" slices): that finding is then
left out, and the idiom's text says which measure it covers.
"""

from __future__ import annotations

from dataclasses import asdict

from xdiag.idioms import IDIOMS, Match, PATTERNS
from xdiag.investigators import levers
from xdiag.investigators.rules.hypothesis import Hypothesis, evidence, saving, sentence
from xdiag.investigators.rules.ranking import MIN_FINDING_PERCENT
from xdiag.investigators.rules.registry import Facts, rule

SUPERSEDES = {
    "python_loop_of_calls": ("dispatch_overhead", "host_sync", "low_utilization", "input_bound", "device_idle",
                             "warm_up"),
    "eager_ops": ("dispatch_overhead", "host_sync", "low_utilization", "input_bound", "device_idle", "warm_up",
                  "unfused_kernels"),
    "recompile_per_shape": ("recompilation", "dispatch_overhead", "warm_up", "low_utilization", "device_idle"),
    "static_argument_per_value": ("recompilation", "dispatch_overhead", "warm_up", "low_utilization", "device_idle"),
    "callback_in_step": ("host_sync", "device_idle", "low_utilization"),
    "host_preprocessing": ("memory_transfers", "transfer", "input_bound", "device_idle", "low_utilization",
                           "host_sync", "dispatch_overhead"),
    "per_element_transfers": ("memory_transfers", "transfer", "dispatch_overhead", "host_sync", "input_bound",
                              "device_idle", "low_utilization"),
    "weights_uploaded_each_step": ("memory_transfers", "transfer", "input_bound", "device_idle", "low_utilization"),
    "mask_uploaded_each_step": ("memory_transfers", "transfer", "input_bound", "device_idle", "low_utilization"),
    # a jitted call's own argument copies are booked as its dispatch: with a few calls per step, the dispatch
    # finding's share is these copies, not op-by-op launches
    "data_uploaded_each_step": ("memory_transfers", "transfer", "input_bound", "device_idle", "low_utilization",
                                "dispatch_overhead"),
    # a value read each step serialises host, copies and device; it does not explain a step with too little work for
    # the device. Its stake times the copies by their own work, where the traced span is mostly the profiler's
    "read_each_step": ("host_sync", "input_bound", "device_idle", "memory_transfers"),
    # a large result copied to the host each step for a NumPy reduction: the copy and the host's pass are the step;
    # the small result read after the change is read_each_step's to find then
    "reduced_on_host": ("memory_transfers", "transfer", "input_bound", "host_sync", "device_idle", "low_utilization",
                        "read_each_step"),
    "linear_algebra": ("opaque_kernel",),
    # a loop of boolean-mask indexes runs its ops eagerly and reads each mask back: those findings' time is its own,
    # and their change (jax.jit) fails on the boolean index
    "boolean_mask_in_loop": ("eager_ops", "python_loop_of_calls", "per_element_transfers", "read_each_step",
                             "dispatch_overhead", "host_sync", "low_utilization", "input_bound", "device_idle",
                             "warm_up", "memory_transfers", "transfer", "unfused_kernels"),
    # a loop of eager ops reading a value back each trip: its dispatches, syncs and copies are the loop's, and
    # jax.jit alone fails on its int() reads
    "eager_loop_reads_each_trip": ("eager_ops", "python_loop_of_calls", "per_element_transfers", "read_each_step",
                                   "dispatch_overhead", "host_sync", "low_utilization", "input_bound", "device_idle",
                                   "warm_up", "memory_transfers", "transfer", "unfused_kernels"),
}
"""Host-structure idioms, and the findings whose measured slice is part of the time the idiom's change removes."""
COVERED_BY_OPS = ("memory_bound", "low_kernel_efficiency", "layout_copies", "unfused_data_movement",
                  "materialised_attention", "latency_bound", "bounded_efficiency")
"""Findings that rate ops against their roofline: where an idiom stakes the same ops, the idiom is their cause."""
PART_OF_OTHERS = frozenset({"argument_copies", "layout_copies"})
"""Idioms whose ops are a part of a roofline finding's, not its cause (copies of arguments among a decode step's
memory-bound ops, layout copies among a step's memory-bound ops): they leave those findings standing, and the HLO
checks yield to them where their top op is one."""


def hypothesis(match: Match, facts: Facts) -> Hypothesis:
    idiom = IDIOMS[match.idiom]
    setting = asdict(facts.context())
    predicted = idiom.predicted_percent(match)
    withheld = idiom.withheld(match, setting)
    recoverable = idiom.recoverable(match)
    needs = (f" By the device's peaks the result needs about {match.needed_percent:.3g}% of the step for this work"
             + (f" ({match.work_ratio:g}× less than is done)" if match.work_ratio else "") + "."
             if match.needed_percent is not None else
             f" The work done is about {match.work_ratio:g}× what the result needs." if match.work_ratio else "")
    # a loop whose calls wait for their arguments takes longer per call than the device's steps (one execution to
    # the next) say: the idiom that measured the loop's own period states the step in it
    step_ms = match.facts.get("loop_step_ms") or facts.step_ms
    if withheld:
        predicted = None
        fix = f"Not advised here: {withheld}."
        impact = saving(step_ms, match.stake_percent) + "."
    elif predicted is None:
        fix = (f"First, {idiom.change_text(match, setting)}. Expected gain: not measured: no trial has timed this "
               "change; capture a step before and after it.")
        impact = saving(step_ms, match.stake_percent) + "."
    else:
        low, high = predicted
        # The measurements were taken on a TPU v5e; on another platform the range rests on them as a premise
        chip = "On a TPU v5e" if setting.get("platform") == "TPU" else "Measured on another platform,"
        gain, where = idiom.measured_gain(match)
        measured = (f" {chip} this change recovered {gain[0]:.0%}–{gain[1]:.0%} of such a stake ({where})."
                    if where else "")
        fix = (f"First, {idiom.change_text(match, setting)}. Expected: {low:g}–{high:g}% shorter steps "
               f"({gain[0]:g}–{gain[1]:g} of the {recoverable:.3g}% of the step it stakes"
               + (", less what the result needs" if match.needed_percent else "") + ")." + measured)
        impact = saving(step_ms, high) + f" (predicted {low:g}–{high:g}%)."
    if idiom.alternatives and not withheld:
        fix += " Alternatives: " + "; ".join(idiom.alternatives) + "."
    # The idiom is its own lever (the lever catalogue's row for its finding is its entry), unless its change is a
    # lever's of the catalogue: then the finding names that lever, as a lever-led finding does
    lever = (evidence("get_program_anatomy", "lever", idiom.lever, f"the change of idiom {match.idiom}")
             if idiom.lever else evidence("get_program_anatomy", "lever", match.idiom, idiom.title))
    ev = facts.base + [evidence("get_program_anatomy", f"idiom {match.idiom}", match.what,
                                f"about the ops {', '.join(match.cites)}" if match.cites else ""), lever]
    ev += [evidence("get_program_anatomy", f"{match.idiom} {k}", v) for k, v in list(match.facts.items())[:4]]
    if match.needed_percent is not None:
        ev.append(evidence("get_program_anatomy", f"{match.idiom} needed_percent", round(match.needed_percent, 2),
                           "the result's own work at the device's peaks, as a share of the step"))
    h = Hypothesis(
        match.idiom, round(match.stake_percent, 2), idiom.title,
        sentence(match.what) + f" This is {PATTERNS[idiom.pattern]}: {idiom.why}." + needs,
        ev, impact, fix, ops=frozenset((match.module, op) for op in match.ops))
    h.predicted = predicted
    h.withheld = bool(withheld)
    if match.idiom in SUPERSEDES:
        h.follow_up = ("aggregate_xplane_events", {"pattern": r"^(PjitFunction|PmapFunction)\(|callback|__float__|"
                                                   r"__array__|item|block_until_ready|compile", "line": "python"})
    return h


@rule("program_idioms")
def program_idioms(facts: Facts, found: list[Hypothesis]) -> list[Hypothesis]:
    """One finding per idiom match the anatomy reports."""
    records = facts.summary("get_program_anatomy").get("idioms") or []
    return [hypothesis(m, facts) for m in filter(None, map(Match.from_record, records))]


def _cited_ops(h: Hypothesis) -> set[str]:
    """The ops a finding stakes or its evidence names (a latency-bound loop's busiest ops among them)."""
    busiest = {n for e in h.evidence if e.metric == "busiest_ops" for n in str(e.value).split(", ")}
    return {op for _, op in h.ops} | levers.evidence_ops(h.evidence) | busiest


def superseded(found: list[Hypothesis]) -> list[Hypothesis]:
    """The findings an idiom's match explains, left out; the idiom's text names what it covers."""
    drop: set[int] = set()
    for h in found:
        if h.score < MIN_FINDING_PERCENT:  # a finding too small to report explains nothing in its place
            continue
        mine = {op for _, op in h.ops}
        covered = [o for o in found if o is not h and id(o) not in drop and (
            o.key in SUPERSEDES.get(h.key, ()) or (o.key in COVERED_BY_OPS and h.key in IDIOMS
                                                    and h.key not in PART_OF_OTHERS and mine
                                                    and _cited_ops(o) & mine))]
        if covered:
            h.whats_happening += (" It accounts for what the " + ", ".join(o.key.replace("_", " ") for o in covered)
                                  + f" measure{'s' if len(covered) > 1 else ''} "
                                  + ("count" if len(covered) > 1 else "counts") + ".")
            drop.update(id(o) for o in covered)
    return [h for h in found if id(h) not in drop]
