"""Findings about the program's components (get_program_anatomy), and the levers every finding's fix leads with.

- materialised_attention: attention that writes its S×S scores to memory holds a material share of op time; a fused
  kernel (flash attention) never writes them.
- bounded_efficiency: a library kernel (Pallas: paged / ragged paged attention, grouped matmul, flash attention, a
  custom kernel) holding a fifth of op time reaches N% of its roof, or at most N% where it is rated from an upper
  bound of its work (a paged kernel costed on full pages): far from it, so a finding, with the kernel's block-size
  lever.
- measured_not_explained: the health check says NEEDS_ATTENTION and no other rule explains why: the finding says what
  is measured and which capture would tell more, so no such verdict stands without a finding.

`with_levers` then rewrites each finding's fix to lead with the one change to make first, at the user's line, in the
program's own API (xdiag.investigators.levers), alternatives after it, and without the advice the anatomy contradicts.
"""

from __future__ import annotations

from typing import Any

from xdiag.analysis.anatomy import COMPONENTS
from xdiag.investigators import levers
from xdiag.investigators.health import MATERIALISED_ATTENTION_MIN_PERCENT
from xdiag.investigators.rules.hypothesis import Hypothesis, evidence, sentence
from xdiag.investigators.rules.registry import Facts, rule

BOUNDED_EFFICIENCY_MAX_PERCENT = 60.0
"""A library kernel under this share of its roof (or at most this, where the share is an upper bound) is far from it:
a finding."""
NO_CHANGE_OF_THEIR_OWN = frozenset({"materialised_attention"})
"""Findings whose fix, without the lever that fits them, names no change at the user's line (only "compute it in a
fused kernel"): where the profile withholds that lever, they rank after every finding with a change to make."""
KERNEL_COMPONENTS = ("paged_attention", "ragged_paged_attention", "grouped_matmul", "fused_attention", "custom_kernel")
"""The anatomy's components that are a library's kernel, tuned by its block sizes (the levers' Pallas kernels)."""


def anatomy(facts: Facts) -> dict[str, Any]:
    return facts.summary("get_program_anatomy")


def _component(anatomy_record: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((c for c in anatomy_record.get("components") or [] if c.get("component") == key), None)


def _lines_note(c: dict[str, Any]) -> str:
    lines = c.get("lines") or []
    return f" at {', '.join(lines[:2])}" if lines else ""


@rule("materialised_attention")
def materialised_attention(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Attention written as einsum + softmax + einsum: its S×S scores go to HBM and back, several times."""
    a = anatomy(facts)
    c = _component(a, "materialised_attention")
    share = (c or {}).get("share_of_op_time_percent") or 0.0
    if c is None or share < MATERIALISED_ATTENTION_MIN_PERCENT or facts.compute < 30 or a.get("platform") not in (
            "TPU", "GPU"):  # on a CPU no fused attention kernel is the lever (and the health check does not flag it)
        return None
    shape = c.get("scores_shape")
    efficiency = c.get("roofline_efficiency_percent")
    backward = c.get("backward_share_percent")
    return Hypothesis(
        "materialised_attention", share * facts.compute / 100,
        "Attention materialises its S×S scores in memory",
        f"Attention written as {c.get('written_as') or 'matmul + softmax + matmul'}{_lines_note(c)} holds {share:g}% "
        "of op time"
        + (f" ({backward:g}% in its backward pass)" if backward else "")
        + (f"; its scores are a {'×'.join(str(d) for d in shape)} array" if shape else "")
        + (f" (head_dim {c['head_dim']})" if c.get("head_dim") else "")
        + " that each of its ops writes to HBM and reads back"
        + (f", at {efficiency:g}% of the roof" if efficiency is not None else "")
        + ". The ops run near their roof, but the roof is the wrong measure: a fused attention kernel computes the "
        "scores block by block on chip and never moves them, so most of this time need not exist.",
        facts.base + [evidence("get_program_anatomy", "materialised_attention share_of_op_time_percent", share,
                               "ops with an S×S array (last two dimensions equal) outside convolutions"),
                      evidence("get_program_anatomy", "materialised_attention ops", ", ".join(c.get("ops") or []))],
        f"Up to {share * facts.compute / 100:.3g}% of the step: the component's {share:g}% of op time × "
        f"{facts.compute:g}% of the step computing, less what a fused kernel still spends (its FLOPs).",
        "Compute attention in a fused kernel so the S×S scores never reach memory.",
        ops=frozenset((o, o) for o in c.get("ops") or []),
    )


@rule("bounded_efficiency")
def bounded_efficiency(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """A library kernel far under its roof is a finding of its own where no broader one covers its ops: a measured
    efficiency, or an upper-bounded one (the kernel is at most that, so certainly far)."""
    if any(h.key in ("memory_bound", "low_kernel_efficiency", "latency_bound") for h in found):
        return None
    a = anatomy(facts)
    far = [c for c in a.get("components") or [] if c.get("component") in KERNEL_COMPONENTS
           and c.get("roofline_efficiency_percent") is not None
           and c["roofline_efficiency_percent"] < BOUNDED_EFFICIENCY_MAX_PERCENT
           and (c.get("share_of_op_time_percent") or 0) >= 20]
    if not far or facts.compute < 30:
        return None
    c = max(far, key=lambda c: c["share_of_op_time_percent"])
    share, efficiency = c["share_of_op_time_percent"], c["roofline_efficiency_percent"]
    bound = bool(c.get("efficiency_is_upper_bound"))
    lost = share * (1 - efficiency / 100)
    return Hypothesis(
        "bounded_efficiency", lost * facts.compute / 100,
        f"The {c.get('kernel') or c['what']} kernel reaches {'at most ' if bound else ''}{efficiency:g}% of its "
        "roofline",
        f"{c['what'][:1].upper() + c['what'][1:]}{_lines_note(c)} holds {share:g}% of op time"
        + (f". Its cost is counted on full pages, an upper bound of the work it does, so its {efficiency:g}% of the "
           "roof is an upper bound too: it is certainly that far from the roof, and likely further." if bound else
           f" at {efficiency:g}% of its roof ({c.get('bound', 'memory')}-bound): its grid steps move or compute too "
           "little each to keep the chip busy."),
        facts.base + [evidence("get_program_anatomy", f"{c['component']} share_of_op_time_percent", share),
                      evidence("get_program_anatomy", f"{c['component']} roofline_efficiency_percent", efficiency,
                               "an upper bound: the kernel's cost assumes full pages" if bound else
                               "its FLOPs and bytes over its time, against the device's peaks")],
        f"{'At least' if bound else 'Up to'} {lost:.3g}% of op time ({share:g}% × (1 − {efficiency / 100:.2g})) if it "
        "reached its roof.",
        "Make each grid step of the kernel move more bytes per copy.",
        ops=frozenset((o, o) for o in c.get("ops") or []),
    )


@rule("measured_not_explained")
def measured_not_explained(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Never NEEDS_ATTENTION without a finding: where no rule explains the health check's reasons, say what is
    measured and what capture would tell more."""
    if facts.health.healthy or found:
        return None
    return unexplained(facts)


def unexplained(facts: Facts) -> Hypothesis:
    reasons = facts.health.unhealthy_because
    a = anatomy(facts)
    top = (a.get("components") or [{}])[0]
    what = (f" The largest component is {top.get('what')} ({top.get('share_of_op_time_percent')}% of op time"
            + (f", {top.get('roofline_efficiency_percent')}% of its roof" if top.get("roofline_efficiency_percent")
               is not None else "") + ")." if top.get("what") else "")
    return Hypothesis(
        "measured_not_explained", max(1.0, 100 - facts.compute) if facts.compute else 1.0,
        "What is measured does not name a cause",
        "The health check flags " + "; ".join(reasons or ["this profile"]) + ", and no rule matched a known pattern "
        "strongly enough to name its cause." + what,
        facts.base + [evidence("get_step_trace", "unhealthy_because", "; ".join(reasons) or None)],
        "Not estimated: no cause is named.",
        _capture_more(facts),
    )


def _capture_more(facts: Facts) -> str:
    """Which capture would tell more, in the profiler of the program's framework."""
    if facts.context().framework == "PyTorch":
        how = ("torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, "
               "record_shapes=True) over several steps after warm-up, with a torch.profiler.schedule")
    else:
        how = ("the .xplane.pb jax.profiler writes (not its trace.json, which carries no HLO), over several steps "
               "after warm-up, with the Python tracer on (jax.profiler.ProfileOptions: python_tracer_level=1)")
    return (f"Capture more to tell the cause: {how}; then run xdiag on that capture. What each health reason above "
            "measures is in the key metrics.")


def _subject(h: Hypothesis, a: dict[str, Any]) -> str | None:
    """The component a finding is about: fixed for some findings, else the one that holds its ops."""
    return levers.subject_of(a, h.key, {op for _, op in h.ops} | levers.evidence_ops(h.evidence))


def with_levers(found: list[Hypothesis], facts: Facts) -> None:
    """Each finding's fix, led by the lever that fits its component and whose premises hold, at the user's line;
    alternatives after it; advice the anatomy contradicts left out."""
    a = anatomy(facts)
    if not a:
        return
    a = {**a, "sync_event": facts.step.get("largest_sync_event")}
    for h in found:
        subject = _subject(h, a)
        if subject in COMPONENTS and subject != "other":
            record = levers.component_record(a, subject)
            share = record.get("share_of_op_time_percent")
            h.whats_happening += (f" Component: {COMPONENTS[subject]}"
                                  + (f", {share:g}% of op time" if share is not None else "")
                                  + f", in a {a.get('framework') or 'program'} "
                                  + ("" if a.get("phase") in (None, "unknown") else f"{a['phase']} ")
                                  + ("step" if not a.get("step") else f"{a['step']} step") + ".")
        h.fix = levers.without_contradictions(h.fix, a, subject) or h.fix
        line = h.host_lines[0].line if h.host_lines else None
        offers, rejected = levers.candidates(a, h.key, subject, facts.compute, h.score, line)
        # A lever that frees memory but no time does not lead: the memory finding's own fix orders its levers by
        # what holds the peak (values first or arguments first), and offers donation only where it applies.
        offers = [o for o in offers if o.lever.gain[1] > 0]
        if not offers:
            # an idiom's own change withheld (its variant's measurement) stays withheld
            h.withheld = h.withheld or (bool(rejected) and h.key in NO_CHANGE_OF_THEIR_OWN)
            if rejected:
                # Named by the lever's key, not its change: the note must not read as the advice it withholds.
                h.fix += " Not advised here: " + "; ".join(
                    f"the {k.replace('_', ' ')} lever ({why})" for k, why in rejected[:2]) + "."
            continue
        lead = offers[0]
        h.predicted = lead.gain_percent or h.predicted
        h.names_no_change = False  # the lever is the change
        h.fix = sentence(levers.lead_sentence(lead) + levers.alternatives_sentence(offers[1:3])
                         + (" Beyond these: " + h.fix if h.fix else ""))
        h.evidence.append(evidence("get_program_anatomy", "lever", lead.lever.key,
                                   f"{COMPONENTS.get(subject or '', subject)}; "
                                   f"{a.get('framework') or 'framework not recorded'}, {a.get('phase') or ''}"
                                   + (f" {a['step']}" if a.get("step") else "")))
        if lead.gain_percent:
            h.expected_impact += (f" Leading with {lead.lever.key.replace('_', ' ')}: {lead.gain_percent[0]:g}–"
                                  f"{lead.gain_percent[1]:g}% shorter steps ({lead.gap_basis}).")
