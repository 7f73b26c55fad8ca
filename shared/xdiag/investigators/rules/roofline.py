"""Findings read against the roofline: memory-bound work that moves more bytes than it needs, latency-bound loops
of tiny dependent steps, and dominant ops far below their roof."""

from __future__ import annotations

from typing import Any

from xdiag.analysis.anatomy import component_of
from xdiag.analysis.roofline import AT_ROOF_MIN_PERCENT, EXTRA_PASSES_DEFECT_PERCENT, MEMORY_BOUND_FINDING_MIN_PERCENT
from xdiag.investigators import advice
from xdiag.investigators.health import (DMA_STALL_MAX_PERCENT, DOMINANT_EFFICIENCY_MIN_PERCENT, is_latency_bound,
                                       low_intensity_share)
from xdiag.investigators.rules.hypothesis import Hypothesis, evidence, neighborhood_evidence, program, sentence
from xdiag.investigators.rules.registry import Facts, rule
from xdiag.model import Evidence


@rule("memory_bound")
def memory_bound(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Memory-bound work whose defect its fix can change. Memory-bound work at its roof with ample arithmetic per
    byte is the nature of the work, not a defect; the defect's reading (roofline.memory_bound_kind) decides the fix."""
    compute = facts.compute
    ops = facts.summary("get_hlo_op_profile")
    low_share, low_ops = low_intensity_share(facts.results)
    ridge = ops.get("ridge_flop_per_byte")
    below = f"below the device's ridge point ({ridge:g} FLOP/byte)" if ridge else "under 1 FLOP per byte moved"
    waits = ops.get("memory_wait_percent") or 0.0
    if low_share is not None and (low_share + waits >= MEMORY_BOUND_FINDING_MIN_PERCENT and compute >= 30
                                  and ops.get("memory_bound_defect") and low_ops):
        attention = sum(o.get("share_of_op_time_percent") or 0.0 for o in low_ops
                        if component_of(o)[0] == "materialised_attention")
        if any(h.key == "materialised_attention" for h in found) and attention >= low_share / 2:
            return None  # the same ops are attention's scores: the materialised_attention finding names them
        return _memory_bound_hypothesis(ops, low_share, low_ops, below, compute, facts.base, facts.context(),
                                        facts.step_ms)
    return None


@rule("latency_bound")
def latency_bound(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Thousands of dependent tiny steps: each op's fixed latency, not its bytes or FLOPs, sets the time."""
    compute = facts.compute
    work = facts.health.loop_work
    if not (is_latency_bound(work) and compute >= 30):
        return None
    share, efficiency = work.busiest_ops_share_percent, work.busiest_ops_efficiency_percent
    per_step = facts.health.per_step.ops_per_step_mean
    return Hypothesis(
        "latency_bound", share * (1 - (efficiency or 0) / 100) * compute / 100,
        "Latency-bound: thousands of dependent tiny steps in a loop",
        f"The busiest ops ({share}% of op time) run {work.loop_trips_per_run:g} times per execution of their "
        f"loop, {work.busiest_ops_mean_us} us each, at {efficiency}% of their roofline"
        + (f"; a step runs {per_step:g} ops" if per_step else "")
        + ". Each trip depends on the one before, so the device runs one tiny op after another: per-op latency "
        "sets the time, not memory bandwidth or arithmetic.",
        facts.base + [evidence(tool, metric, value) for tool, metric, value in (
            ("get_hlo_op_profile", "busiest_ops", ", ".join(facts.summary("get_hlo_op_profile").get("busiest_ops") or [])
             or None),
            ("get_hlo_op_profile", "loop_trips_per_run", work.loop_trips_per_run),
            ("get_hlo_op_profile", "busiest_ops_mean_us", work.busiest_ops_mean_us),
            ("get_hlo_op_profile", "busiest_ops_efficiency_percent", efficiency),
            ("get_step_trace", "ops_per_step_mean", per_step)) if value is not None],
        f"Each trip costs about the same whatever its size, so k times more work per trip (batched sequences, a "
        f"wider hidden state) or k times fewer trips does up to k times the work in about the same time: "
        f"{share}% of op time" + (f", about {facts.step_ms * compute / 100 * share / 100:.3g} ms of each "
                                  f"{facts.step_ms:.3g} ms step," if facts.step_ms else "")
        + f" runs at {efficiency}% of its roofline.",
        "Give each sequential step more work, or take fewer steps: batch more sequences through the loop at once, "
        "use larger hidden sizes, unroll the loop (lax.scan(..., unroll=k)) or process several time steps per "
        "trip (a chunked or parallel scan, such as jax.lax.associative_scan for linear recurrences).",
    )


@rule("low_kernel_efficiency")
def low_kernel_efficiency(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """A busy device is not a healthy one when the ops that take most of its time run far below their roof."""
    compute = facts.compute
    ops = facts.summary("get_hlo_op_profile")
    efficiency = ops.get("dominant_ops_roofline_efficiency_percent")
    roof = facts.summary("get_roofline_model")
    stall = roof.get("dma_stall_percent_of_top_ops")
    low_efficiency = efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT
    stalled = stall is not None and stall > DMA_STALL_MAX_PERCENT
    if not (low_efficiency or stalled) or any(h.key in ("memory_bound", "memory_transfers", "latency_bound")
                                              for h in found):
        return None
    share = ops.get("dominant_ops_share_percent") or 0.0
    bound = "compute" if "compute" in str(roof.get("op_time_bound_by", "")).lower() else "memory"
    lost = share * (1 - (efficiency or 100) / 100) if low_efficiency else share * stall / 100
    ev = facts.base + [evidence("get_hlo_op_profile", "dominant_ops", ", ".join(ops.get("dominant_ops") or [])),
                       evidence("get_hlo_op_profile", "dominant_ops_share_percent", share)]
    precision = ops.get("dominant_ops_matmul_precision")
    if precision:
        ev.append(evidence("get_hlo_op_profile", "dominant_ops_matmul_precision", precision,
                           "operand precision of their matmuls, from the HLO's precision_config"))
    if efficiency is not None:
        ev.append(evidence("get_hlo_op_profile", "dominant_ops_roofline_efficiency_percent", efficiency,
                           f"peaks: {ops.get('peak_tflops')} TFLOP/s, {ops.get('peak_hbm_gb_per_s')} GB/s "
                           f"({ops.get('flops_source')})"))
    if stalled:
        ev.append(evidence("get_roofline_model", "dma_stall_percent_of_top_ops", stall,
                           "time the busiest ops wait on their input copies (XProf)"))
    ctx = facts.context()
    rows = {f"{o.get('op')} ({o.get('module')})": o for o in facts.detail("get_hlo_op_profile").get("ops") or []}
    top = rows.get((ops.get("dominant_ops") or [""])[0], {})
    kernel = advice.library_kernel_fix(top)
    # the matrix unit's levers apply only where the busiest ops are matmuls (a compare of all pairs is not one)
    kinds = tuple(dict.fromkeys(str(rows[name].get("category") or "other") for name in ops.get("dominant_ops") or []
                                if name in rows)) or ("matmul",)
    gain = (f"{share:g}% of op time × (1 − {efficiency / 100:.2g}) = {lost:.0f}% of op time if they ran at their roof."
            if low_efficiency and efficiency is not None else f"Up to {lost:.0f}% of op time if they ran at their roof.")
    return Hypothesis(
        "low_kernel_efficiency", lost * compute / 100,
        "The ops that take most of the time run far below their roofline",
        f"The busiest ops ({share}% of op time) reach "
        + (f"{efficiency}% of their roof" if efficiency is not None else "an unmeasured share of their roof")
        + (f" and wait on their input copies {stall}% of their time" if stalled else "")
        + (f"; their matmuls run at precision {precision}, whose extra passes the model's FLOPs do not count"
           if precision else "")
        + (": the device is busy, but not productive." if compute >= 30 else
           f"; the device computes only {compute}% of the step, and unproductively while it does."),
        ev,
        gain,
        sentence(advice.precision_fix(ctx, precision) if precision
                 else kernel or advice.kernel_efficiency_fix(ctx, bound, kinds)),
    )


def _to_roof_gain(share: float, bandwidth: float | None, to_roof: float, compute: float, step_ms: float | None,
                  bounded: bool) -> str:
    """The gain of reaching the HBM roof, with its arithmetic: ops taking `share`% of op time at `bandwidth`% of
    the roof would take that fraction of their time there."""
    if bandwidth is None:
        return f"Up to {to_roof:.0f}% of op time if these ops reached the HBM bandwidth roof."
    per_step = (f", about {step_ms * compute / 100 * to_roof / 100:.3g} ms of each {step_ms:.3g} ms step"
                if step_ms else "")
    return (f"At the HBM roof the same bytes would take {bandwidth:g}% of these ops' time: "
            f"{share:.3g}% of op time × (1 − {bandwidth / 100:.3g}) = {to_roof:.0f}% of op time{per_step}"
            + (", at least: their bandwidth is an upper bound (full pages assumed), so the real gap is wider."
               if bounded else "."))


def _memory_bound_hypothesis(ops: dict[str, Any], low_share: float, low_ops: list[dict], below: str, compute: float,
                             base: list[Evidence], ctx: advice.Context, step_ms: float | None = None) -> Hypothesis:
    """One memory_bound finding whose title, impact and fix follow its kind: far below the bandwidth roof (the
    kernel), at it in loops that re-read the same data with little arithmetic per byte (the bytes per unit of
    work), else the passes a program makes over its data."""
    kind, waits = ops.get("memory_bound_kind"), ops.get("memory_wait_percent") or 0.0
    kind_bandwidth, intensity = ops.get("memory_bound_kind_bandwidth_percent"), ops.get("memory_intensity_flop_per_byte")
    ridge = ops.get("ridge_flop_per_byte")
    if kind == "below_bandwidth_roof":
        below_roof = [o for o in low_ops if (o.get("roofline_efficiency_percent") or 100) < 30] or low_ops
        top = max(below_roof, key=lambda o: o["total_ms"])
    else:
        top = max(low_ops, key=lambda o: o["total_ms"])
    ev = base + [evidence("get_hlo_op_profile", "memory_bound_op_percent", low_share),
                 evidence("get_hlo_op_profile", f"{top['op']} arithmetic_intensity_flops_per_byte",
                          top["arithmetic_intensity_flops_per_byte"]),
                 evidence("get_hlo_op_profile", f"{top['op']} achieved_gb_per_s", top.get("achieved_gb_per_s"))]
    if kind is not None:
        ev.append(evidence("get_hlo_op_profile", "memory_bound_kind", kind))
    if kind_bandwidth is not None:
        ev.append(evidence("get_hlo_op_profile", "memory_bound_kind_bandwidth_percent", kind_bandwidth,
                           f"of {ops.get('peak_hbm_gb_per_s')} GB/s ({ops.get('bandwidth_source')})"))
    if waits:
        ev.append(evidence("get_hlo_op_profile", "memory_wait_percent", waits,
                           "op time waiting for async copies from HBM into on-chip memory"))
    if ops.get("program_hbm_gb_per_s") is not None:
        ev.append(evidence("get_hlo_op_profile", "program_hbm_gb_per_s", ops["program_hbm_gb_per_s"],
                           f"{ops['program_hbm_module']}'s HBM bytes over its op time, "
                           f"{ops['program_hbm_async_copy_share_percent']}% of them in its async copies into VMEM"))
    if ops.get("memory_passes") is not None:
        ev.append(evidence("get_hlo_op_profile", "memory_passes", ops["memory_passes"],
                           "bytes the programs move per execution over the bytes they must read and write"))
    if (ops.get("memory_handed_on_percent") or 0) >= EXTRA_PASSES_DEFECT_PERCENT:
        ev.append(evidence("get_hlo_op_profile", "memory_handed_on_percent", ops["memory_handed_on_percent"],
                           "op time moving arrays one kernel writes only for one other to read back"))
    share = round(low_share + waits, 2)
    whats = (f"{low_share}% of op time is in ops {below}" + (f" and {waits}% waits for data prefetched from HBM"
                                                             if waits else "")
             + "; " + " and ".join(ops.get("memory_bound_why") or [])
             + f". The largest is {top['op']} ({top.get('shape')}, {top['arithmetic_intensity_flops_per_byte']} "
             f"FLOP/byte at {top.get('achieved_gb_per_s')} GB/s).")
    follow_up = ("get_hlo_neighborhood", {"op": top["op"], "module": top.get("module", "")}) if top.get("module") else None
    staked = frozenset((program(o.get("module")), o["op"]) for o in low_ops)
    if kind == "below_bandwidth_roof":
        # At the roof the same bytes take kind_bandwidth% of the time: the rest of the below-roof ops' time is what
        # reaching it recovers (or the extra passes, where those cost more).
        below_roof = [o for o in low_ops if (o.get("roofline_efficiency_percent") or 100) < 30] or low_ops
        below_share = min(sum(o.get("share_of_op_time_percent") or 0.0 for o in below_roof), low_share)
        to_roof = below_share * (1 - (kind_bandwidth or 100) / 100)
        extra = ops.get("memory_extra_pass_percent") or 0.0
        recoverable = max(extra, to_roof)
        fix = advice.below_roof_fix(ctx, low_ops, top)
        if extra >= 20 and not advice.library_kernel_fix(top):
            fix += "; and " + advice.fuse_passes(ctx)
        bounded = bool(ops.get("memory_bound_kind_bandwidth_is_upper_bound"))
        found = Hypothesis(
            "memory_bound", recoverable * compute / 100, "Memory-bound ops run far below the HBM bandwidth roof",
            whats, ev,
            _to_roof_gain(below_share, kind_bandwidth, to_roof, compute, step_ms, bounded)
            + (f" Making the programs' {ops.get('memory_passes'):g} passes over their data one would cut "
               f"{extra:.0f}% of op time." if extra > to_roof else ""),
            sentence(fix), follow_up=follow_up, extra_evidence=neighborhood_evidence,
            ops=staked)
        # "use another algorithm or kernel" is no change to make: a finding that names one (an idiom's, a lever's)
        # comes first, the more so where the op is a library's own (a sort, a top-k) the user cannot tune
        found.names_no_change = not advice.below_roof_names_a_change(low_ops, top)
        return found
    if kind == "at_bandwidth_roof" and ops.get("memory_bound_rereads_in_loops"):
        ceiling = 100 * intensity / ridge if intensity is not None and ridge else None
        recoverable = share * (1 - (ceiling or 0) / 100)
        at_roof = (kind_bandwidth or 0) >= AT_ROOF_MIN_PERCENT
        fix = advice.more_work_per_byte(ctx, None if at_roof else kind_bandwidth)
        if (ops.get("memory_extra_pass_percent") or 0) >= 20:
            fix = advice.fuse_passes(ctx) + "; and " + fix
        where = ("at the HBM bandwidth roof" if at_roof else f"at {kind_bandwidth:g}% of the HBM bandwidth")
        return Hypothesis(
            "memory_bound", recoverable * compute / 100,
            f"Memory-bound {where}: a loop re-reads the same data with little arithmetic per byte",
            whats, ev,
            (f"At {intensity:g} FLOP per byte this work can reach at most {ceiling:.2g}% of the compute peak: "
             if ceiling is not None else "")
            + "its time falls only with the bytes per unit of work; serving k rows or tokens per byte read does up "
            f"to k times the work in about the same time ({share:g}% of op time at stake)"
            + ("." if at_roof else
               f"; a kernel reaching the roof would also cut their time by up to {100 - (kind_bandwidth or 0):.0f}% "
               f"({share:g}% of op time × (1 − {(kind_bandwidth or 0) / 100:.2g}))."),
            sentence(fix), follow_up=follow_up, extra_evidence=neighborhood_evidence,
            ops=staked)
    passes = ops.get("memory_passes") or 1.0
    # Only the extra passes are recoverable (the data must still move once), or the bandwidth left unused.
    extra = ops.get("memory_extra_pass_percent") or 0.0
    bandwidth = ops.get("memory_bandwidth_efficiency_percent")
    gap = low_share * (1 - bandwidth / 100) if bandwidth is not None else 0.0
    recoverable = max(extra, gap)
    return Hypothesis(
        "memory_bound", recoverable * compute / 100, "Memory-bound ops move more bytes than the work needs",
        whats, ev,
        f"Bandwidth-bound time shrinks only with the bytes moved: making {passes:g} passes one cuts {extra:.0f}% of "
        "op time (each op's share × (1 − 1/its passes))"
        + (f"; using the full bandwidth instead of {bandwidth:g}% would cut {low_share:g}% × (1 − "
           f"{bandwidth / 100:.2g}) = {gap:.0f}%" if bandwidth is not None else "")
        + "; the data's one necessary pass stays.",
        sentence(advice.fuse_passes(ctx, bool(ops.get("memory_handed_on_by_product")))), follow_up=follow_up,
        extra_evidence=neighborhood_evidence, ops=staked)
