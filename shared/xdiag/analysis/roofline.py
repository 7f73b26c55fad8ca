"""Ops on the roofline: each costed op's bound, roof and efficiency against checked device peaks, and what
the rows say together (memory-bound time that is a defect, how close the dominant ops come to their roof).

Pure functions over op rows (analysis.op_stats.OpStat.row) and peaks (analysis.device_peaks), so the op-profile tool,
the health snapshot and the rules read one definition.
"""

from __future__ import annotations

TRANSFER_RATE_REASON = (
    "a transfer's bytes move between its start and its completion over a host or peer link, not during this "
    "event's own time (the start, or the wait at the end)"
)


def roofline(row: dict, peaks: dict | None) -> dict:
    """bound, roof_gflops_per_s, roofline_efficiency_percent and not_a_measurement (why, above 100%) of one costed op row, against checked
    peaks; {} without peaks (CPU) or without an achieved rate."""
    if not peaks or not peaks.get("peak_flops_per_s") or not peaks.get("peak_hbm_bytes_per_s"):
        return {}
    intensity, achieved = row.get("arithmetic_intensity_flops_per_byte"), row.get("achieved_gflops_per_s")
    bandwidth = row.get("achieved_gb_per_s")
    on_chip = bool(row.get("data_on_chip"))  # no HBM bytes: only the compute peak bounds it
    if (intensity is None and not on_chip) or achieved is None or bandwidth is None:
        return {}
    peak_bw = peaks["peak_hbm_bytes_per_s"]
    peak_flops = compute_peak(row.get("operand_shapes") or [], peaks)
    narrow = eight_bit_operands(row)
    wide = not narrow and any(str(s).startswith(("f32", "f64")) for s in row.get("operand_shapes") or [])
    f32_peak = peaks.get("peak_f32_matmul_flops_per_s")
    narrow_peak = peaks.get(EIGHT_BIT_PEAKS[narrow]) if narrow else None
    if not on_chip and intensity and bandwidth * 1e9 > peak_bw * ON_CHIP_RATE_MARGIN:
        # Bytes the shapes say moved at a rate HBM cannot carry were served from on-chip memory (a TPU's VMEM, a
        # GPU's caches): HBM does not bound this op, and that rate is no HBM bandwidth.
        return {"bound": "compute", "roof_gflops_per_s": round(peak_flops / 1e9, 3),
                "roofline_efficiency_percent": round(100 * achieved * 1e9 / peak_flops, 1),
                "operands_on_chip_inferred": (
                    f"its operand and result bytes would move at {bandwidth:,.0f} GB/s, over the HBM peak of "
                    f"{peak_bw / 1e9:,.0f} GB/s: they are served from on-chip memory, so HBM bandwidth does not "
                    "bound it and that figure is not an HBM rate")}
    compute_bound = on_chip or intensity * peak_bw >= peak_flops
    roof = peak_flops if compute_bound else intensity * peak_bw
    efficiency = 100 * (achieved * 1e9 / peak_flops if compute_bound else bandwidth * 1e9 / peak_bw)
    out: dict = {
        "bound": "compute" if compute_bound else "memory",
        "roof_gflops_per_s": round(roof / 1e9, 3),
        "roofline_efficiency_percent": round(efficiency, 1),
    }
    if compute_bound and narrow:
        if narrow_peak:
            out["roof_basis"] = f"{narrow} operands: the datasheet's {narrow} matrix peak"
        else:
            out["efficiency_basis"] = f"16-bit peak; the datasheet gives no {narrow} peak for this device"
    if compute_bound and wide:
        if f32_peak:
            out["roof_basis"] = peaks.get("f32_matmul_basis") or "f32 operands' own peak"
        else:
            # Only the 16-bit peak is known; f32 operands run at a lower, device-specific rate (TF32, FP32).
            out["efficiency_basis"] = "16-bit peak; this op's f32 operands have a lower peak"
    if efficiency > 100:
        # The same key as XProf's impossible rows (get_roofline_model): the number stays, marked with why.
        out["not_a_measurement"] = (
            f"{efficiency:.0f}% of the {'compute' if compute_bound else 'bandwidth'} peak is not physically possible: "
            "the peak is wrong, or the op's bytes/FLOPs are not what its shapes say (e.g. data served from a cache, "
            "or moved by another engine)")
    return out


EIGHT_BIT_PEAKS = {"int8": "peak_int8_ops_per_s", "fp8": "peak_fp8_flops_per_s"}
ON_CHIP_RATE_MARGIN = 1.05
"""A rate this far over the HBM peak cannot be HBM traffic (within it: timing noise of one short op)."""


def compute_peak(operand_shapes: list[str], peaks: dict) -> float:
    """The compute roof of an op with these operands: the f32 matrix rate for f32/f64 operands, the int8 or fp8
    rate for two 8-bit operands, else the 16-bit peak (where the datasheet gives no other)."""
    narrow = eight_bit_operands({"operand_shapes": operand_shapes})
    if narrow:
        return peaks.get(EIGHT_BIT_PEAKS[narrow]) or peaks["peak_flops_per_s"]
    if any(str(s).startswith(("f32", "f64")) for s in operand_shapes):
        return peaks.get("peak_f32_matmul_flops_per_s") or peaks["peak_flops_per_s"]
    return peaks["peak_flops_per_s"]


def eight_bit_operands(row: dict) -> str | None:
    """int8 or fp8 where at least two of the op's operands are of that 8-bit type (the two sides of a product),
    else None."""
    kinds = [("int8" if str(s).startswith(("s8[", "u8[")) else "fp8" if str(s).startswith("f8") else None)
             for s in row.get("operand_shapes") or []]
    for kind in ("int8", "fp8"):
        if kinds.count(kind) >= 2:
            return kind
    return None


LOW_INTENSITY_FLOPS_PER_BYTE = 1.0
"""Without device peaks (CPU): ops doing under one FLOP per byte moved are memory-bound on any current CPU."""
EXTRA_PASSES_DEFECT_PERCENT = 20.0
"""Op time that extra passes over the same data cost (re-reads, intermediates written and read back), above
which memory-bound work is a defect rather than the nature of the work."""
MEMORY_BOUND_FINDING_MIN_PERCENT = 50.0
"""Share of op time memory-bound ops must take for their defect to be a finding (and to fail the health check)."""
BANDWIDTH_EFFICIENCY_LOW_PERCENT = 30.0
"""Memory-bound ops below this share of the HBM bandwidth roof leave most of the bandwidth unused."""
AT_ROOF_MIN_PERCENT = 60.0
"""The share of a peak that a report calls "at the roof" (title, text and fix alike): tuned memory-bound kernels
reach 70-90% of a TPU's or GPU's HBM bandwidth (the committed TPU v5e decode loops: 81-92%), so below 60% a faster
kernel can still gain; between BANDWIDTH_EFFICIENCY_LOW_PERCENT and this the reading is the share itself ("at 44%
of the HBM bandwidth"), with both levers."""


def measured_share(row: dict) -> float:
    """The share of op time a row's rates speak for: its costed runs' (a PyTorch kernel row some of whose runs no
    costed op launched: costed_share_of_op_time_percent), else all of it."""
    return row.get("costed_share_of_op_time_percent", row["share_of_op_time_percent"])


def _weighted(rows: list[dict], key: str) -> float | None:
    pairs = [(r[key], measured_share(r)) for r in rows if r.get(key) is not None]
    weight = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / weight, 2) if weight else None


def memory_bound_rows(rows: list[dict]) -> list[dict]:
    """The rows on the memory side of the roofline that do arithmetic: below the device's ridge point (on CPU,
    which records no peaks, under LOW_INTENSITY_FLOPS_PER_BYTE). A compute-bound op never counts; pure data
    movement (0 FLOPs) is the detect_* tools' subject. Ops fed by a streaming program's async copies
    (fed_by_async_copies) count with them: HBM bandwidth bounds them through the copies."""
    return [
        o for o in rows
        if o.get("fed_by_async_copies") or (
            o.get("arithmetic_intensity_flops_per_byte") is not None and (o.get("flops_per_run") or 0) > 0
            and (o["bound"] == "memory" if o.get("bound") else o["arithmetic_intensity_flops_per_byte"] < LOW_INTENSITY_FLOPS_PER_BYTE))
    ]


STARVED_INTENSITY_SHARE_OF_RIDGE = 0.1
"""Memory-bound work at the bandwidth roof whose arithmetic intensity is under this share of the ridge point can
reach no more than that share of the compute peak: where a loop re-reads the same arrays every trip (a decode step
reading every weight for one token), only more work per byte read changes that."""


def memory_bound_kind(low: list[dict]) -> tuple[str | None, float | None]:
    """Which reading of "memory-bound" holds for the memory-bound rows, by where most of their time is:
    at_bandwidth_roof (at >= BANDWIDTH_EFFICIENCY_LOW_PERCENT of the HBM bandwidth: the bytes set the time) or
    below_bandwidth_roof (far below it: the kernel, not the bytes, sets the time); and the time-weighted bandwidth
    efficiency of the rows of that kind. (None, None) without measured memory-bound rows."""
    measured = [o for o in low if o.get("roofline_efficiency_percent") is not None and not o.get("not_a_measurement")
                and not o.get("fed_by_async_copies")]  # theirs is a compute-roof share; the program's rate speaks
    below = [o for o in measured if o["roofline_efficiency_percent"] < BANDWIDTH_EFFICIENCY_LOW_PERCENT]
    # A rate that is only an upper bound never shows work at the roof: below it, it is below for certain.
    at = [o for o in measured if o not in below and not o.get("rates_are_upper_bounds")]
    if not below and not at:
        return None, None
    share = lambda group: sum(measured_share(o) for o in group)  # noqa: E731
    kind, group = ("below_bandwidth_roof", below) if share(below) > share(at) else ("at_bandwidth_roof", at)
    return kind, _weighted(group, "roofline_efficiency_percent")


PREFETCH_WAIT_SIGNIFICANT_PERCENT = 20.0
"""Op time waiting for async copies from HBM above which a program's HBM traffic is mostly in those copies: its
ops read on-chip memory, and only the program's bytes over its time measure its use of HBM."""


def program_hbm_traffic(rows: list[dict], peak_hbm_gb_per_s: float | None) -> dict:
    """The HBM traffic of the program holding most op time, async copies included: program_hbm_module,
    program_hbm_gb_per_run (the bytes its ops move to and from HBM, plus the arrays its async copies bring into
    on-chip memory), program_hbm_gb_per_s (over its op time), program_hbm_efficiency_percent (of the peak) and
    program_hbm_async_copy_share_percent (of those bytes, the copies'), program_hbm_intensity_flop_per_byte (its
    FLOPs over those bytes); program_hbm_gb_per_run is per execution of its outermost loop (the fewest-run loop).
    {} where the program has no async copies from HBM (its ops' own rates already say it all) or no peak. Rows whose
    byte counts are not HBM traffic (a rate over the peak) add their time but not their bytes: the rate is then a
    lower bound, and says so (program_hbm_note)."""
    if not peak_hbm_gb_per_s or not rows:
        return {}
    by_module: dict[str, float] = {}
    for row in rows:
        by_module[row["module"]] = by_module.get(row["module"], 0.0) + row["total_ms"]
    module = max(by_module, key=by_module.get)
    mine = [r for r in rows if r["module"] == module]
    copied = sum((r.get("prefetched_hbm_bytes_per_run") or 0.0) * r["count"] for r in mine)
    if not copied:
        return {}
    runs = min((r["count"] for r in mine if r.get("category") == "control_flow"), default=0) or None
    own = sum(r.get("hbm_bytes_per_run", r.get("bytes_per_run") or 0.0) * r.get("costed_runs", r["count"])
              for r in mine if r.get("achieved_gb_per_s") is not None and not r.get("not_a_measurement"))
    left_out = round(sum(r["share_of_op_time_percent"] for r in mine if r.get("not_a_measurement")), 2)
    seconds = by_module[module] / 1e3
    rate = (own + copied) / seconds / 1e9
    flops = sum((r.get("flops_per_run") or 0.0) * r.get("costed_runs", r["count"]) for r in mine)
    out = {"program_hbm_module": module,
           "program_hbm_gb_per_s": round(rate, 1),
           "program_hbm_efficiency_percent": round(100 * rate / peak_hbm_gb_per_s, 1),
           "program_hbm_async_copy_share_percent": round(100 * copied / (own + copied), 1),
           "program_hbm_intensity_flop_per_byte": round(flops / (own + copied), 3)}
    if runs:
        out["program_hbm_gb_per_run"] = round((own + copied) / runs / 1e9, 4)
    if left_out:
        out["program_hbm_note"] = (f"a lower bound: {left_out}% of op time is in ops whose byte counts are not HBM "
                                   "traffic (over the peak), counted in the time but not the bytes")
    return out


STREAMED_PROGRAM_COPY_SHARE_PERCENT = 50.0
"""A program whose async copies carry at least this share of its HBM bytes streams its data through on-chip
memory: its ops fed from there are bound by the copies' bandwidth, not by their own roofs."""
FED_BY_ASYNC_COPIES = ("its operands were brought into on-chip memory by its program's async copies: the program's "
                       "HBM rate (program_hbm_gb_per_s, the copies' bytes included), not its own, bounds it")


def mark_streamed_program(rows: list[dict], peaks: dict | None) -> dict:
    """program_hbm_traffic of the op rows, and their ops fed by its async copies marked (mark_fed_by_async_copies):
    what the op profile and the line view both read the rows by."""
    program_hbm = program_hbm_traffic(rows, peaks.get("peak_hbm_gb_per_s") if peaks else None)
    mark_fed_by_async_copies(rows, program_hbm)
    return program_hbm


def streams_through_on_chip_memory(program_hbm: dict, module: str | None = None) -> bool:
    """Whether program_hbm_traffic's program (module, where given, is it) streams its data through on-chip memory
    (STREAMED_PROGRAM_COPY_SHARE_PERCENT)."""
    return ((program_hbm.get("program_hbm_async_copy_share_percent") or 0) >= STREAMED_PROGRAM_COPY_SHARE_PERCENT
            and (module is None or module == program_hbm["program_hbm_module"]))


def mark_fed_by_async_copies(rows: list[dict], program_hbm: dict) -> None:
    """Marks (fed_by_async_copies) the ops of a streaming program (STREAMED_PROGRAM_COPY_SHARE_PERCENT) that do
    arithmetic on data mostly held on chip, far below their compute roof: a decode loop's matrix-vector products
    reading weight tiles prefetched into VMEM, whose rate on their own (on-chip) bytes says nothing."""
    if not streams_through_on_chip_memory(program_hbm):
        return
    for row in rows:
        share = row.get("hbm_share_of_bytes")
        if (row["module"] == program_hbm["program_hbm_module"] and share is not None and share < 0.5
                and (row.get("flops_per_run") or 0) > 0 and row.get("bound") == "compute"
                and (row.get("roofline_efficiency_percent") or 0) < BANDWIDTH_EFFICIENCY_LOW_PERCENT):
            row["fed_by_async_copies"] = FED_BY_ASYNC_COPIES


def roofline_summary(rows: list[dict], ridge_flop_per_byte: float | None = None, program_hbm: dict | None = None) -> dict:
    """From every op row: memory_bound_op_percent, memory_passes (time-weighted passes of their programs over
    their own data), memory_extra_pass_percent (op time those extra passes cost),
    memory_bandwidth_efficiency_percent, memory_bound_kind (memory_bound_kind()) with
    memory_bound_kind_bandwidth_percent, memory_intensity_flop_per_byte (time-weighted), memory_wait_percent (op
    time waiting for async copies from HBM into on-chip memory), memory_bound_rereads_in_loops,
    memory_bound_defect and memory_bound_why (far below the roof; at it with too little arithmetic per byte,
    re-reading arrays every trip of a loop or making several passes: memory-bound work at its roof in one pass,
    or with ample arithmetic per byte, is the nature of the work),
    and, over the ops that dominate the op time (dominant_rows): dominant_ops_share_percent, dominant_ops,
    dominant_ops_matmul_precision (HIGH/HIGHEST where their matmuls ask for more than the default),
    dominant_ops_roofline_efficiency_percent (time-weighted, over those with a measured efficiency where they
    hold at least half the dominant ops' time),
    dominant_ops_measured_share_percent (the op time those hold) and dominant_ops_unmeasured (each other one,
    with why: FLOPs unknown, an impossible value, or only a lower bound; and the runs of a row rated over some of
    them only). Shares of measured rows are their costed runs' (measured_share), never time no rate speaks for.
    Where the ops wait on async copies from HBM for PREFETCH_WAIT_SIGNIFICANT_PERCENT of op time, or the copies
    carry STREAMED_PROGRAM_COPY_SHARE_PERCENT of the program's HBM bytes, the kind, the bandwidth and the arithmetic
    per byte are the program's (program_hbm_traffic), copies included."""
    low = memory_bound_rows(rows)
    passes = _weighted(low, "program_memory_passes")
    # Only the passes beyond the first are avoidable: a program moving its data k times wastes (1 - 1/k) of it.
    extra = round(sum(measured_share(o) * (1 - 1 / max(o.get("program_memory_passes") or 1.0, 1.0)) for o in low), 2)
    bandwidth = _weighted([o for o in low if not o.get("not_a_measurement")], "roofline_efficiency_percent")
    kind, kind_bandwidth = memory_bound_kind(low)
    # Memory-bound time rated from costs that are upper bounds (full pages assumed): its bandwidth is at most that.
    bounded = sum(measured_share(o) for o in low if o.get("rates_are_upper_bounds")) >= sum(
        measured_share(o) for o in low) / 2 if low else False
    intensity = _weighted(low, "arithmetic_intensity_flops_per_byte")
    waits = round(sum(o["share_of_op_time_percent"] for o in rows if o.get("waits_for_on_chip_prefetch")), 2)
    program_hbm = program_hbm or {}
    program_rate = program_hbm.get("program_hbm_efficiency_percent")
    streamed = (waits >= PREFETCH_WAIT_SIGNIFICANT_PERCENT or (program_hbm.get("program_hbm_async_copy_share_percent")
                                                               or 0) >= STREAMED_PROGRAM_COPY_SHARE_PERCENT)
    if streamed and program_rate is not None and low:
        # Its ops read what async copies brought on chip: the program's HBM bytes, copies included, over its time
        # are what measure the bandwidth it uses and its arithmetic per byte, not the ops' own (on-chip) bytes.
        kind = "at_bandwidth_roof" if program_rate >= BANDWIDTH_EFFICIENCY_LOW_PERCENT else "below_bandwidth_roof"
        kind_bandwidth = bandwidth = program_rate
        intensity = program_hbm.get("program_hbm_intensity_flop_per_byte", intensity)
    # Three readings: at the roof with a few FLOPs per byte, the bytes set the time (more work per byte read, or
    # fewer bytes); far below the roof, the kernel does; at the roof with ample arithmetic per byte (convolutions
    # fused with their normalisation), it is the nature of the work. Without peaks (CPU) only the passes tell.
    few_flops_at_roof = (kind == "at_bandwidth_roof" and bool(ridge_flop_per_byte) and intensity is not None
                         and intensity < STARVED_INTENSITY_SHARE_OF_RIDGE * ridge_flop_per_byte)
    # Work a loop repeats reads the same arrays every trip (a decode step's weights, once per token; a recurrent
    # cell's, once per time step): more work per trip amortises them, up to the ridge point, whatever the
    # arithmetic per byte now. Work done once per step is read once, as it must be.
    in_loops = sum(measured_share(o) for o in low if o.get("in_loop_body"))
    under_ridge_at_roof = (kind == "at_bandwidth_roof" and bool(ridge_flop_per_byte) and intensity is not None
                           and intensity < ridge_flop_per_byte)
    rereads = under_ridge_at_roof and in_loops >= 0.5 * sum(measured_share(o) for o in low)
    # Arrays one kernel writes only for the next to read back once: bytes a kernel doing both would not move,
    # whatever the arithmetic per byte (an attention's scores between its two products).
    handed = round(sum(measured_share(o) * (o.get("handed_on_share_of_bytes") or 0.0) for o in low), 2)
    by_product = any(o.get("category") in ("matmul", "convolution") and (o.get("handed_on_share_of_bytes") or 0) >= 0.5
                     for o in low)
    why = []
    if (kind is None or kind == "below_bandwidth_roof" or few_flops_at_roof) and extra >= EXTRA_PASSES_DEFECT_PERCENT:
        why.append(f"their programs move their own data {passes:g} times per execution, so {extra:g}% of op time "
                   "goes to passes a fused program would not make")
    elif handed >= EXTRA_PASSES_DEFECT_PERCENT:
        top = max(low, key=lambda o: o["share_of_op_time_percent"] * (o.get("handed_on_share_of_bytes") or 0.0))
        why.append(f"{handed:g}% of op time moves arrays that one kernel writes to memory only for the next one to "
                   f"read back once (the largest: {top.get('handed_on_array')}, at {top['op']}), which a kernel doing "
                   "both would keep on chip")
    if rereads:
        why.append(f"they run in loops at {kind_bandwidth:g}% of the HBM bandwidth doing only {intensity:g} FLOP per "
                   f"byte (the ridge point is {ridge_flop_per_byte:g}), reading the same arrays every trip, so the "
                   "bytes, not the arithmetic, set the time"
                   + (f", and the device waits {waits:g}% of op time for data it prefetches from HBM" if waits else ""))
    if kind == "below_bandwidth_roof":
        why.append(f"the ops holding most of that time reach {'at most' if bounded else 'only'} {kind_bandwidth:g}% of "
                   "the HBM bandwidth" + (" (an upper bound: their costs assume full pages)" if bounded else ""))
    dominant = dominant_rows(rows)
    measured = [o for o in dominant if _measured(o)]
    covered = round(sum(o["share_of_op_time_percent"] for o in dominant), 2)
    # A row costed over some of its runs measures those runs' time only: the rest of it is not measured.
    measured_time = sum(measured_share(o) for o in measured)
    costed = any(o.get("arithmetic_intensity_flops_per_byte") is not None for o in rows)
    # Each row's share is rounded: their sum may pass 100 by a rounding step, which no share of op time can.
    share = min(round(sum(measured_share(o) for o in low), 2), 100.0) if costed else None
    note = {}
    if kind is None and bounded and ridge_flop_per_byte:
        # Peaks are known but the rates are only upper bounds: whether the bytes or the kernel set the time, and so
        # whether a defect exists, is not known; the health check says so instead of guessing either way.
        why = []
        note["memory_bound_defect_note"] = ("not known: the memory-bound ops are rated from upper bounds of their "
                                            "bytes (full pages assumed), so how close they run to the roof is not known")
    if why and share is not None and share + waits < MEMORY_BOUND_FINDING_MIN_PERCENT:
        # The flag is shown beside the findings: say why it is not one of them.
        note["memory_bound_defect_note"] = (
            f"not a finding: memory-bound ops take {share + waits:g}% of op time, under the "
            f"{MEMORY_BOUND_FINDING_MIN_PERCENT:g}% at which their defect becomes one")
    return {
        "memory_bound_op_percent": share,
        "memory_passes": passes,
        "memory_extra_pass_percent": extra,
        "memory_handed_on_percent": handed,
        "memory_handed_on_by_product": by_product and handed >= EXTRA_PASSES_DEFECT_PERCENT,
        "memory_bandwidth_efficiency_percent": bandwidth,
        "memory_bound_kind": kind,
        "memory_wait_percent": waits,
        "memory_bound_kind_bandwidth_percent": kind_bandwidth,
        "memory_bound_kind_bandwidth_is_upper_bound": bounded,
        "memory_intensity_flop_per_byte": intensity,
        "memory_bound_rereads_in_loops": bool(rereads),
        "memory_bound_defect": bool(why),
        "memory_bound_why": why,
        **note,
        # Over at least half of the dominant ops' time, or it would speak for ops it did not measure.
        "dominant_ops_roofline_efficiency_percent": _weighted(measured, "roofline_efficiency_percent")
        if measured_time >= covered / 2 else None,
        "dominant_ops_share_percent": covered or None,
        # Rated from costs that are upper bounds (full pages assumed) over most of their measured time: their
        # efficiency is at most that, and what they really reach is not known.
        "dominant_ops_efficiency_is_upper_bound": bool(measured) and sum(
            measured_share(o) for o in measured if o.get("rates_are_upper_bounds")) >= measured_time / 2,
        "dominant_ops_measured_share_percent": round(measured_time, 2) if dominant else None,
        "dominant_ops": [f"{o['op']} ({o['module']})" for o in dominant[:3]],
        "dominant_ops_matmul_precision": next((o["matmul_precision"] for o in dominant if o.get("matmul_precision")),
                                              None),
        "dominant_ops_unmeasured": ([f"{_named(o)} ({o['share_of_op_time_percent']}% of op time): {_unmeasured_why(o)}"
                                     for o in dominant if not _measured(o)]
                                    + [f"{_named(o)} ({round(o['share_of_op_time_percent'] - measured_share(o), 2)}% of "
                                       f"op time, the runs not costed): rates over {o['rates_over']}"
                                       for o in measured if o.get("rates_over")])[:5],
        "flagged_op_rows": sum(1 for o in rows if o.get("not_a_measurement")),
    }


def dominant_rows(rows: list[dict]) -> list[dict]:
    """The ops that dominate the compute op time: the busiest rows (transfers and async waits left out: their
    time is a wait)
    that together hold half of it; rows under 1% of op time (a long tail) are not counted among them."""
    working = sorted((o for o in rows if o.get("category") not in ("async_copy", "memcpy")
                      and not o.get("rate_not_measured_because")),
                     key=lambda o: -o["share_of_op_time_percent"])
    total = sum(o["share_of_op_time_percent"] for o in working)
    dominant, covered = [], 0.0
    for row in working:
        if covered >= total / 2 or row["share_of_op_time_percent"] < 1.0:
            break
        dominant.append(row)
        covered += row["share_of_op_time_percent"]
    return dominant


def _named(row: dict) -> str:
    """An op as its user can find it: what its HLO says it computes (the framework op, `cholesky`) at the user's line
    it records; an HLO instruction's name (`custom-call.56`) only where it records no line (a kernel XLA added)."""
    line = (row.get("source") or {}).get("line")
    kind = str(row.get("framework_op") or "").rsplit("/", 1)[-1] or row.get("opcode")
    return f"{kind} at {line}" if line and kind else row["op"]


def _measured(row: dict) -> bool:
    return (row.get("roofline_efficiency_percent") is not None and not row.get("not_a_measurement")
            and not row.get("efficiency_basis") and not row.get("fed_by_async_copies"))


def _unmeasured_why(row: dict) -> str:
    if row.get("fed_by_async_copies"):
        return row["fed_by_async_copies"]
    if row.get("not_a_measurement"):
        return "its efficiency is above the peak, so not a measurement"
    if row.get("efficiency_basis"):
        return f"only a lower bound is known ({row['roofline_efficiency_percent']}% of the {row['efficiency_basis']})"
    if row.get("flops_unknown_because"):
        return f"FLOPs unknown: {row['flops_unknown_because']}"
    if row.get("flops_per_run") is None:
        return "FLOPs unknown: the profile's HLO does not name this kernel's instruction"
    return "no device peaks to measure against"


def loop_work(rows: list[dict]) -> dict:
    """How the busiest ops (those covering half the op time, named in busiest_ops, at most five) run:
    busiest_ops_mean_us (their time over their
    executions), busiest_ops_efficiency_percent (time-weighted roofline efficiency, whatever its basis),
    busiest_ops_share_percent, and, where the busiest op runs in a loop, loop_trips_per_run: how many times that
    loop (loop_of_busiest_op, the innermost `while` it runs in) runs its body, read from the loop itself (its bound,
    start and step: loop_trips_from "the loop's bound"), else counted (the op's executions over the loop's own,
    where the profile times the loop and they divide exactly: "executions counted"); never a ratio that can be
    fractional. Thousands of sub-microsecond dependent steps are latency-bound."""
    busiest, covered = [], 0.0
    for row in sorted(rows, key=lambda o: -o["share_of_op_time_percent"]):
        if row.get("category") == "control_flow":
            continue
        busiest.append(row)
        covered += row["share_of_op_time_percent"]
        if covered >= 50:
            break
    if not busiest:
        return {}
    executions = sum(o["count"] for o in busiest)
    out = {
        "busiest_ops": [o["op"] for o in busiest[:5]],
        "busiest_ops_share_percent": round(covered, 2),
        "busiest_ops_mean_us": round(sum(o["total_ms"] for o in busiest) * 1e3 / executions, 3) if executions else None,
        "busiest_ops_efficiency_percent": _weighted(busiest, "roofline_efficiency_percent"),
        "loop_trips_per_run": None,
    }
    top = busiest[0]
    if not top.get("loop"):
        return out
    out["loop_of_busiest_op"] = top["loop"]
    if top.get("loop_trip_count"):
        out.update(loop_trips_per_run=int(top["loop_trip_count"]), loop_trips_from="the loop's bound")
        return out
    loop = next((o for o in rows if o["op"] == top["loop"] and o.get("module") == top.get("module")), None)
    if loop is not None and loop["count"] and top["count"] % loop["count"] == 0:
        out.update(loop_trips_per_run=top["count"] // loop["count"], loop_trips_from="executions counted")
    return out
