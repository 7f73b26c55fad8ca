"""Findings about the kernels themselves: many small unfused elementwise kernels, and custom kernels whose work
no profile shows."""

from __future__ import annotations

from xdiag.investigators import advice
from xdiag.investigators.rules.hypothesis import Hypothesis, evidence, sentence
from xdiag.idioms.host_structure import CALLBACK
from xdiag.idioms.op_identity import PRIMITIVES, routines_of
from xdiag.investigators.rules.registry import Facts, rule

UNFUSED_KERNEL_MAX_US = 50.0
"""Kernels shorter than this on average are small enough that launch gaps and one pass per op dominate."""
OPAQUE_KERNEL_MIN_PERCENT = 20.0
"""A custom kernel whose FLOPs no one can count that holds this share of op time always gets a finding."""
OPAQUE_KERNEL_MAX_SCORE = 39.0
"""Its score stays under P0's 40: its loss is unknown, not measured."""


@rule("unfused_kernels")
def unfused_kernels(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Many small elementwise kernels that no compiler fused (a framework running op by op without XLA)."""
    b, compute = facts.breakdown, facts.compute
    rows = facts.detail("get_hlo_op_profile").get("ops", [])
    unfused = [o for o in rows if o.get("category") == "elementwise" and not o.get("module")]
    share = round(sum(o["share_of_op_time_percent"] for o in unfused), 2)
    kernels = sum(o["count"] for o in unfused)
    mean_us = sum(o["total_ms"] for o in unfused) * 1e3 / kernels if kernels else 0.0
    per_step = facts.step.get("ops_per_step_mean") or 0
    if share < 50 or mean_us > UNFUSED_KERNEL_MAX_US or per_step < 100:
        return None
    ctx = facts.context()
    idle = 100 - compute - b.get("collective", 0.0) - b.get("transfer", 0.0)
    top = max(unfused, key=lambda o: o["total_ms"])
    return Hypothesis(
        "unfused_kernels", share * compute / 100 / 2 + idle / 2,
        "Many small unfused elementwise kernels: the step is launch-bound",
        f"{share}% of device op time is {kernels} elementwise kernels with no compiled program behind them "
        f"(mean {mean_us:.3g} µs each, {per_step:g} kernels per step), each reading and writing its operands in "
        f"its own pass; between them the device idles {idle:.3g}% of the step waiting for the next launch"
        + (f" ({ctx.framework} ops run one kernel each)" if ctx.framework else "") + ".",
        facts.base + [evidence("get_hlo_op_profile", "unfused elementwise share of op time", share),
                      evidence("get_hlo_op_profile", f"top kernel {top['op'][:80]}", top["total_ms"],
                               f"ms over {top['count']} launches"),
                      evidence("get_step_trace", "ops_per_step_mean", per_step),
                      evidence("get_device_information", "framework", ctx.framework)],
        "Fusing a chain of k elementwise ops into one kernel removes k-1 launches and k-1 passes over memory; "
        f"at stake: the launch gaps ({idle:.3g}% of the step) and most of the {share}% of op time.",
        sentence(advice.compile_whole_step(ctx)
                 + ("; XLA fuses a dropout's RandomUniform, GreaterEqual, Cast and Mul into one kernel"
                    if ctx.framework == "TensorFlow" else "")),
    )


def _library_routine(framework_op: str) -> bool:
    """A custom call JAX emits for a host callback or a lax.linalg primitive (LU, Cholesky, triangular solve, …)."""
    return bool(CALLBACK.search(framework_op)) or bool(routines_of(framework_op) & PRIMITIVES)


@rule("opaque_kernel")
def opaque_kernel(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Custom kernels (Pallas/Mosaic, Triton, library calls) holding OPAQUE_KERNEL_MIN_PERCENT of op time whose work
    no cost model gives: their share, the bandwidth their operand and result bytes set as a floor, and how to see
    inside. Where another finding already names them, that one speaks for them."""
    rows = facts.detail("get_hlo_op_profile").get("ops", [])
    # A host callback or one of JAX's linear-algebra routines is a custom call too, but no kernel of the user's:
    # the callback and linear_algebra idioms (and host_sync) speak for those.
    opaque = [o for o in rows if o.get("opcode") == "custom-call" and o.get("flops_per_run") is None
              and o.get("category") != "host_callback" and not _library_routine(str(o.get("framework_op") or ""))]
    share = round(sum(o["share_of_op_time_percent"] for o in opaque), 2)
    named = {o["op"] for h in found for e in h.evidence for o in opaque if o["op"] in str(e.metric)}
    if share < OPAQUE_KERNEL_MIN_PERCENT or named:
        return None
    top = max(opaque, key=lambda o: o["share_of_op_time_percent"])
    compute = facts.compute
    peak_gb_s = facts.health.peaks.peak_hbm_gb_per_s if facts.health.peaks else None
    floor = top.get("achieved_gb_per_s_floor")
    floor_text = (f"; its operand and result bytes alone set a floor of {floor:,.0f} GB/s"
                  + (f" ({100 * floor / peak_gb_s:.0f}% of the HBM peak)" if peak_gb_s else "") if floor else "")
    return Hypothesis(
        # Half the time it holds, and never P0: what it would gain is not known until it is costed.
        "opaque_kernel", min(share * compute / 100 / 2, OPAQUE_KERNEL_MAX_SCORE),
        "Custom kernels whose work no profile shows hold most of the op time",
        f"{share}% of op time is in {len(opaque)} custom {'kernel' if len(opaque) == 1 else 'kernels'} that carry no cost estimate and whose FLOPs the HLO "
        f"does not say; the largest, {top['op'][:80]}, takes {top['share_of_op_time_percent']}%{floor_text}. How close "
        "they run to the hardware's roofs cannot be measured from this profile.",
        facts.base + [evidence("get_hlo_op_profile", "custom kernels' share of op time (FLOPs unknown)", share),
                      evidence("get_hlo_op_profile", f"{top['op'][:80]} share_of_op_time_percent",
                               top["share_of_op_time_percent"], f"{top['count']} runs, {top['avg_us']} µs each"),
                      *([evidence("get_hlo_op_profile", f"{top['op'][:80]} achieved_gb_per_s_floor", floor,
                                  top.get("floor_basis", ""))]
                        if floor else [])],
        f"Unknown until the kernel is costed; these kernels hold {share}% of op time.",
        "Give the kernel a cost estimate (Pallas: pallas_call(..., cost_estimate=pl.CostEstimate(flops=..., "
        "transcendentals=..., bytes_accessed=...))) so that profiles rate it against the roofline; time its phases "
        "inside with named scopes (jax.named_scope, pltpu.trace in a Mosaic kernel) and compare its FLOPs over its "
        "time with the chip's peak.",
    )
