"""get_hlo_op_profile: which HLO ops take the time, and how well do they use the hardware?"""

from __future__ import annotations

from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.op_stats import category_totals, op_stats
from xdiag.analysis.recompute import rematerialised_time
from xdiag.analysis.source_lines import source_lines_missing, time_by_kind, time_by_line
from xdiag.analysis.roofline import loop_work, mark_streamed_program, roofline_summary
from xdiag.analysis.transfers import transfer_spans
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source, percent
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_hlo_op_profile",
    "Which HLO ops take the most time (per op: count, total and average time, category, shapes, FLOPs, bytes, "
    "arithmetic intensity), and how op time splits across categories.",
    parameters={"top_n": {"type": "integer", "description": "how many ops to list (1-200, default 20)", "minimum": 1,
                         "maximum": 200}},
)
def get_hlo_op_profile(session: Session, top_n: int = 20) -> ToolOutput:
    """summary: op_count, distinct_ops, op_executions, total_op_time_ms, top_op, top_op_module, top_op_category,
    top_op_share_percent, top_category, category_percent {category: % of op time}, top_op_source (the user's line,
    function and library line its HLO's Python stack names: xdiag.analysis.source_lines), op_time_by_kind (matmul,
    attention, collectives, elementwise and reductions, data movement, custom kernels, host transfers, other: ms,
    share and the 1-3 source lines that hold most of each, each line's share counting that kind's ops at it),
    op_time_by_line (the 20 busiest source lines, each with every op at it, whatever its kind, and their share: the
    figure a finding gives for that line), shares_are (every share here is of all op time), source_lines_not_available (why, and how to record them,
    where the profile's HLO names no line, or a PyTorch trace holds no Python stacks); the HBM traffic of the busiest
    program, its async copies into VMEM included (roofline.program_hbm_traffic): program_hbm_module,
    program_hbm_gb_per_s, program_hbm_efficiency_percent, program_hbm_async_copy_share_percent,
    program_hbm_intensity_flop_per_byte, program_hbm_gb_per_run, program_hbm_note; from the op rows
    (roofline.roofline_summary): memory_bound_op_percent, memory_passes, memory_extra_pass_percent,
    memory_handed_on_percent (op time moving arrays one kernel writes only for one other to read back),
    memory_handed_on_by_product, memory_bandwidth_efficiency_percent, memory_bound_kind,
    memory_bound_kind_bandwidth_percent, memory_intensity_flop_per_byte, memory_wait_percent,
    memory_bound_rereads_in_loops, memory_bound_defect/why, memory_bound_defect_note,
    memory_bound_kind_bandwidth_is_upper_bound and dominant_ops_efficiency_is_upper_bound (rated from costs that are
    upper bounds: rows with rates_are_upper_bounds), dominant_ops_roofline_efficiency_percent, dominant_ops_share_percent, dominant_ops, dominant_ops_matmul_precision,
    dominant_ops_measured_share_percent, dominant_ops_unmeasured, flagged_op_rows; loop_work's busiest_ops_mean_us,
    busiest_ops, busiest_ops_efficiency_percent, busiest_ops_share_percent, loop_trips_per_run (read from the loop), loop_trips_from, loop_of_busiest_op; rematerialised_op_percent,
    rematerialised_op_count and rematerialised_ops (op time in the ops jax.checkpoint recomputes), rematerialised_saveable_dot_gib (the outputs of the recomputed matmuls with no batch dimensions: what jax.checkpoint_policies.dots_with_no_batch_dims_saveable keeps instead); async_copies (transfer_spans: copies, GB per copy,
    measured link GB/s) where the profile has copy-start/copy-done pairs; and on TPU/GPU the checked peaks
    (device_model, peak_tflops, peak_hbm_gb_per_s, ridge_flop_per_byte, flops_source, bandwidth_source,
    peak_warnings). detail: ops [top_n rows, each with
    arithmetic intensity, achieved GFLOP/s and GB/s, handed_on_share_of_bytes and handed_on_array where some of its
    bytes pass between two kernels only, attention_key_lengths where its program's HLO was read (the key lengths of
    the attentions that HLO computes: scores, a softmax along the keys, a product with values; empty: none), and on
    TPU/GPU bound, roof, roofline efficiency and not_a_measurement;
    roof_basis (8-bit or f32 operands' own peak), operands_on_chip_inferred (bytes no HBM could carry in its time:
    no HBM rate shown), fed_by_async_copies (its operands prefetched into VMEM by a streaming program),
    prefetched_hbm_bytes_per_run (a prefetch wait: the array it brought across HBM), and for a custom kernel no cost
    model gives: bytes_floor_per_run, achieved_gb_per_s_floor, floor_basis], categories_ms, xprof (device only: XProf's
    op_profile totals and categories; its op lists are detail.ops again, left out)."""
    stats = op_stats(session)
    if not stats:
        raise NotAvailable("the profile holds no XLA op executions (no hlo_op events on host threads or device planes)")
    total_ps = sum(s.total_ps for s in stats)
    categories = category_totals(stats)
    total_ms = total_ps / 1e9
    top = stats[0]
    summary = {
        "distinct_ops": len(stats),
        "op_executions": sum(s.count for s in stats),
        "total_op_time_ms": round(total_ms, 4),
        "top_op": top.name,
        "top_op_module": top.module,
        "top_op_category": top.category,
        "top_op_share_percent": percent(top.total_ps, total_ps),
        "top_category": next(iter(categories)),
        "category_percent": {k: percent(v, total_ms) for k, v in categories.items()},
        "op_time_by_kind": time_by_kind(stats),
        "op_time_by_line": time_by_line(stats),
        "shares_are": "of all op time: the ops' summed execution time on every device over the capture",
    }
    if top.source is not None:
        summary["top_op_source"] = top.source.record()
    missing = source_lines_missing(session)
    if missing:
        summary["source_lines_not_available"] = missing
    peaks = session_peaks(session)
    if peaks:
        summary.update({k: peaks[k] for k in ("device_model", "peak_tflops", "peak_hbm_gb_per_s", "ridge_flop_per_byte",
                                              "flops_source", "bandwidth_source", "peak_warnings")})
    rows = [s.row(total_ps, peaks) for s in stats]
    program_hbm = mark_streamed_program(rows, peaks)
    summary.update(program_hbm)
    summary.update(roofline_summary(rows, peaks.get("ridge_flop_per_byte") if peaks else None, program_hbm))
    summary.update(loop_work(rows))
    summary.update(rematerialised_time(session, rows))
    transfers = transfer_spans(session)
    if transfers:
        summary["async_copies"] = transfers
    detail = {
        "ops": rows[: max(top_n, 1)],
        "categories_ms": categories,
        "note": "op time is the sum of execution intervals; ops that overlap (several threads or streams) add up",
    }
    source = host_plane_source(session) if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "hlo_op_profile", top_n=top_n)
        detail["xprof"] = without_op_lists(view) if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, source)


XPROF_OP_LISTS = ("top_ops_by_time", "top_ops_by_flops", "top_ops_by_bytes")
"""XProf's op_profile ranks the same ops as detail.ops, with the same times, counts, FLOPs and bytes: said once."""


def without_op_lists(view: dict) -> dict:
    """XProf's op_profile as this tool gives it: its totals (idle time, core time) and its categories, which are its
    own; its op lists left out, being detail.ops again."""
    kept = {k: v for k, v in (view.get("detail") or {}).items() if k not in XPROF_OP_LISTS}
    return {**view, "detail": kept}
