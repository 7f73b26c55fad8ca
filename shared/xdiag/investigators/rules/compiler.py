"""Findings about what the compiler does: recompilation inside the loop, and the inefficiencies the HLO checks find
(materialised widening converts, unfused data movement). Copies of arguments that are not donated and copies that only
change layout are idioms of the catalogue (xdiag.idioms.memory_numerics: argument_copies, layout_copies): unfused data
movement yields to both."""

from __future__ import annotations

from dataclasses import dataclass

from xdiag.investigators import advice
from xdiag.investigators.rules.hypothesis import (Hypothesis, evidence, events_evidence, neighborhood_evidence,
                                                  program, saving, shape_note)
from xdiag.investigators.rules.registry import Facts, rule


@rule("recompilation")
def recompilation(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Recompilation: compile events inside the measured steps."""
    step = facts.step
    steps_n = step.get("steps") or 0
    compiles = step.get("compiles_per_step_mean") or 0
    compile_pct = facts.breakdown.get("compile", 0.0)
    with_compiles = step.get("steps_with_compiles") or 0
    if not (compile_pct >= 5 or (with_compiles >= 2 and compiles > 0)):
        return None
    recompiled = facts.summary("list_hlo_modules").get("recompiled_names") or {}
    ev = facts.base + [evidence("get_step_trace", "compile_percent", compile_pct),
                       evidence("get_step_trace", "steps_with_compiles", with_compiles, f"of {steps_n} steps"),
                       evidence("get_step_trace", "compiles_per_step_mean", compiles)]
    if recompiled:
        ev.append(evidence("list_hlo_modules", "recompiled_names", recompiled, "module name -> compiled versions"))
    return Hypothesis(
        "recompilation", max(compile_pct, 15.0),
        "Recompilation inside the training loop",
        f"{with_compiles} of {steps_n} steps compile a program ({compile_pct}% of step time); a jitted "
        "function is being retraced, typically because an input shape, dtype or a static argument changes.",
        ev,
        saving(facts.step_ms, compile_pct),
        advice.static_shapes(facts.context()),
        follow_up=("aggregate_xplane_events", {"pattern": r"compile|lower_sharding_computation|lower_jaxpr"}),
        extra_evidence=events_evidence,
    )


def _copies_of_arguments(facts: Facts, found: list[Hypothesis], tool: str) -> bool:
    """The HLO check's largest op is a copy of an argument the argument_copies finding already names."""
    top = facts.summary(tool).get("top_op")
    return any(h.key == "argument_copies" and any(op == top for _, op in h.ops) for h in found)


@dataclass(frozen=True)
class HloCheck:
    """How one HLO check's result reads as a finding: `happening` is formatted with the check's top op."""

    tool: str
    title: str
    happening: str
    fix: str


def _hlo_check_hypothesis(facts: Facts, key: str, check: HloCheck) -> Hypothesis | None:
    """The finding of an HLO check that finds at least 10% of op time in its ops."""
    compute = facts.compute
    s = facts.summary(check.tool)
    share = s.get("share_of_op_time_percent") or 0.0
    if share < 10 or not s.get("top_op"):
        return None
    rows = facts.detail(check.tool).get("ops") or [{}]
    top = rows[0]
    return Hypothesis(
        key, share * compute / 100 if compute else share,
        check.title,
        check.happening.format(share=share, op=s["top_op"], shape=s.get("top_op_shape") or "",
                               why=s.get("top_op_why", ""), widening=s.get("widening", "")),
        facts.base + [evidence(check.tool, "share_of_op_time_percent", share),
                      evidence(check.tool, "count", s.get("count")),
                      evidence(check.tool, f"top op {s['top_op']}", top.get("total_ms"),
                               f"ms over {top.get('count')} runs{shape_note(top)}")],
        f"up to {share:.0f}% less op time; {saving(facts.step_ms, share * compute / 100 if compute else share)}",
        check.fix,
        follow_up=("get_hlo_neighborhood", {"op": s["top_op"], "module": top.get("module", "")})
        if top.get("module") else None,
        extra_evidence=neighborhood_evidence,
        ops=frozenset((program(r.get("module")), r["op"]) for r in rows if r.get("op")),
        inflates=frozenset((program(r.get("module")), reader) for r in rows for reader in r.get("read_by") or []),
    )


@rule("widening_converts")
def widening_converts(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Low-precision data widened and written to memory for a reduction to read back."""
    return _hlo_check_hypothesis(facts, "widening_converts", HloCheck(
        "detect_unnecessary_convert_reduce",
        "Low-precision data is widened and written to memory before reductions",
        "Ops that convert {widening} and write the widened copy for a reduction to read back take {share}% of op "
        "time; the largest is {op} {shape}, which materialises the wider copy and moves twice the bytes.",
        "Reduce with an accumulator type instead of converting the input: jnp.sum(x, dtype=jnp.float32) "
        "or lax.dot_general(..., preferred_element_type=jnp.float32) so XLA fuses the widening into the "
        "reduction (it then widens in registers and writes nothing extra); keep activations in bf16 end to end."
        if facts.context().framework in (None, "JAX") else
        "Reduce with an accumulator type instead of casting the whole input (tf.reduce_sum on bf16 with XLA, or "
        "torch.sum(x, dtype=torch.float32)), so the widening happens inside the reduction kernel."))


@rule("unfused_data_movement")
def unfused_data_movement(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Reshape/transpose/copy/broadcast ops run as separate kernels."""
    if any(h.key == "layout_copies" for h in found) or _copies_of_arguments(facts, found, "detect_unfused_reshapes"):
        return None  # the same ops, already reported as layout copies or as copies of arguments
    return _hlo_check_hypothesis(facts, "unfused_data_movement", HloCheck(
        "detect_unfused_reshapes",
        "Data-movement ops run unfused",
        "Reshape/transpose/copy/broadcast ops run as separate kernels and take {share}% of op time; the "
        "largest is {op} {shape}.",
        "Let XLA fuse them: avoid optimization barriers and host round-trips between them, express the "
        "reshapes inside the compiled function, and prefer layouts that make reshapes bitcasts."))
