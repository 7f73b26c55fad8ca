"""get_roofline_model: is the work compute-bound or memory-bound, and how close to the roof?"""

from __future__ import annotations

from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.op_stats import costed_work, op_stats
from xdiag.analysis.roofline import ON_CHIP_RATE_MARGIN, STREAMED_PROGRAM_COPY_SHARE_PERCENT, compute_peak
from xdiag.analysis.xprof.session_views import try_view
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import xprof_source
from xdiag.tools.registry import ToolOutput, tool

_COPY_CATEGORIES = ("copy-start", "copy-done", "async copy", "memcpy")


@tool(
    "get_roofline_model",
    "The program's roofline against checked device peaks (datasheet or recorded, named): achieved FLOP/s and "
    "bandwidth over device op time (idle excluded), compute- or memory-bound, efficiency; beside it XProf's "
    "roofline (whose time includes device idle) with its impossible per-op rows flagged.",
    parameters={"top_n": {"type": "integer", "description": "how many ops to list (1-200, default 20)", "minimum": 1,
                         "maximum": 200}},
)
def get_roofline_model(session: Session, top_n: int = 20) -> ToolOutput:
    """summary: xdiag's roofline over the ops whose FLOPs and bytes are known (transfers left out), over their
    own time: op_time_achieved_tflops_per_s, op_time_achieved_gb_per_s, op_time_intensity_flop_per_byte,
    op_time_bound_by (compute | HBM), op_time_roofline_efficiency_percent, costed_compute_op_time_percent
    (of the compute op time; under 50% the figures are left out with roofline_unavailable_because), time_basis,
    async_wait_percent (of the costed op time, waits for async copies), prefetch_wait_percent (those of them
    for prefetches into VMEM that carry most of the program's HBM bytes, which then count in the efficiency with
    the bytes they bring across HBM; other waits are left out, and above 20% of the time the efficiency is left
    out with why), on_chip_bytes_left_out_percent
    (shape bytes of ops too fast for HBM, served on chip), op_time_hbm_gb_per_s_with_prefetches (where the program
    prefetches into VMEM: the ops' HBM bytes and the prefetched arrays over their time, waits included);
    the checked peaks (device_model, peak_tflops, peak_hbm_gb_per_s, ridge_flop_per_byte, flops_source, bandwidth_source,
    peak_warnings); XProf's own figures under its names (roofline_efficiency_percent, bound_by,
    peak_flop_rate_gflops, peak_hbm_bw_gibs, … over the capture window, idle included), xprof_idle_percent,
    xprof_note (why the two differ), dma_stall_percent_of_top_ops (TPU), and xprof_impossible_op_rows (XProf's
    per-op efficiencies above 100%, each with why it is not a measurement). Not available on CPU: a CPU
    profile records no peaks (get_hlo_op_profile still gives each op's arithmetic intensity)."""
    if session.platform == "CPU":
        raise NotAvailable(
            "a CPU profile records no peak FLOP/s or memory bandwidth, so there is no roof; "
            "get_hlo_op_profile gives each op's arithmetic intensity and achieved rate from its HLO shapes"
        )
    peaks = session_peaks(session) or {}
    summary: dict = {k: peaks.get(k) for k in ("device_model", "peak_tflops", "peak_hbm_gb_per_s", "ridge_flop_per_byte",
                                                "flops_source", "bandwidth_source", "peak_warnings")}
    summary.update(program_roofline(session, peaks))
    detail: dict = {}
    view, reason = try_view(session, "roofline")
    if view is None:
        detail["xprof"] = {"available": False, "reason": reason}
    else:
        summary.update({k: v for k, v in view.items() if k not in ("detail", "unavailable")})
        rows = [dict(r) for r in view.get("detail", {}).get("top_operations", [])]
        summary["xprof_impossible_op_rows"] = _mark_impossible_rows(rows, peaks)[:min(10, top_n)]
        detail["xprof"] = {**view, "detail": {**view.get("detail", {}), "top_operations": rows[:top_n]}}
        stalls = [(r.get("dma_stall_percent"), r.get("total_self_time_ms")) for r in rows]
        stalls = [(s, t) for s, t in stalls if s is not None and t]
        if stalls and any(s for s, _ in stalls):
            weight = sum(t for _, t in stalls)
            summary["dma_stall_percent_of_top_ops"] = round(sum(s * t for s, t in stalls) / weight, 2)
    ops_view, _ = try_view(session, "hlo_op_profile")
    if ops_view and ops_view.get("idle_percent") is not None:
        summary["xprof_idle_percent"] = ops_view["idle_percent"]
        summary["xprof_note"] = _reconcile(summary)
    return ToolOutput(summary, detail, xprof_source() + " and xdiag's HLO cost model")


MAX_ASYNC_WAIT_PERCENT = 20.0
"""Above this share of the costed op time in waits for async transfers (host offload, peer copies), the program's
op-by-op roofline is left out: those waits have no roof of their own. Waits for prefetches into VMEM count with the
bytes they bring across HBM."""


def program_roofline(session: Session, peaks: dict) -> dict:
    """The whole program on the roofline: FLOPs and bytes of the costed ops over their own time; its efficiency
    the time the ops would take at their own roofs (compute or bandwidth, f32 operands against their own peak)
    over the time they took, bound by whichever side holds more of that time."""
    work = costed_work(session)
    costed, flops, moved, seconds = work.stats, work.flops, work.bytes, work.seconds
    out: dict = {
        "costed_compute_op_time_percent": work.covered_percent,
        "time_basis": "device op time of the costed ops (idle, transfers and async waits excluded)",
    }
    if not moved or not work.speaks_for_the_program:
        out["roofline_unavailable_because"] = work.not_representative_because()
        return out
    peak_flops, peak_bw = peaks.get("peak_flops_per_s"), peaks.get("peak_hbm_bytes_per_s")
    if peak_bw:
        # Bytes no HBM could carry in their op's time were served on chip (roofline()): not HBM traffic.
        on_chip = sum(stat.hbm_bytes * stat.costed_count for stat in costed if not stat.moves_data_asynchronously
                      and stat.hbm_bytes * stat.costed_count / peak_bw > ON_CHIP_RATE_MARGIN * stat.costed_ps / 1e12)
        moved -= on_chip
        if on_chip:
            out["on_chip_bytes_left_out_percent"] = round(100 * on_chip / (moved + on_chip), 1)
    out.update(
        op_time_achieved_tflops_per_s=round(flops / seconds / 1e12, 3),
        op_time_achieved_gb_per_s=round(moved / seconds / 1e9, 1),
        op_time_intensity_flop_per_byte=round(flops / moved, 3) if moved else None,
    )
    if peak_flops and peak_bw:
        # Each op against its own roof (f32 operands have a lower one): the time the ops would take at their
        # roofs over the time they took, with the bytes the op table counts (HBM only: VMEM-held arrays are not
        # bound by it). Async waits are left out, as their rows are (their bytes move between start and done), but
        # where prefetches into VMEM carry most of the program's HBM bytes (a decode loop streaming its weights), its
        # ops read what they brought: each prefetch then counts with its wait and the array it brought across HBM.
        prefetches = [stat for stat in op_stats(session) if stat.prefetch_wait]  # costed or not (category prefetch)
        prefetched = sum((stat.cost.get("result_bytes") or 0.0) * stat.count for stat in prefetches)
        streams = prefetched >= moved * STREAMED_PROGRAM_COPY_SHARE_PERCENT / (100 - STREAMED_PROGRAM_COPY_SHARE_PERCENT)
        if not streams:
            prefetches, prefetched = [], 0.0
        prefetch_s = sum(stat.total_ps for stat in prefetches) / 1e12
        memory_s = prefetched / peak_bw
        compute_s = timed_s = costed_prefetch_s = 0.0
        for stat in costed:
            if stat.prefetch_wait and streams:
                costed_prefetch_s += stat.costed_ps / 1e12
                continue
            if stat.moves_data_asynchronously:
                continue
            flop_s = stat.cost["flops"] * stat.costed_count / compute_peak(stat.cost.get("operand_shapes") or [], peaks)
            byte_s = stat.hbm_bytes * stat.costed_count / peak_bw
            if byte_s > ON_CHIP_RATE_MARGIN * stat.costed_ps / 1e12:
                byte_s = 0.0  # bytes no HBM could carry in its time: served on chip (roofline(): not HBM-bound)
            compute_s, memory_s = (compute_s + flop_s, memory_s) if flop_s >= byte_s else (compute_s, memory_s + byte_s)
            timed_s += stat.costed_ps / 1e12
        efficiency = 100 * (compute_s + memory_s) / (timed_s + prefetch_s) if timed_s + prefetch_s else 0.0
        waits = 100 * (1 - (timed_s + costed_prefetch_s) / seconds) if seconds else 0.0  # transfers: no HBM roof
        out["async_wait_percent"] = round(100 * (1 - timed_s / seconds) if seconds else 0.0, 2)
        with_prefetches = seconds - costed_prefetch_s + prefetch_s
        out["prefetch_wait_percent"] = round(100 * prefetch_s / with_prefetches if with_prefetches else 0.0, 2)
        if prefetches:
            # The ops' own bytes (op_time_achieved_gb_per_s) and what their prefetches brought, over both's time.
            out["op_time_hbm_gb_per_s_with_prefetches"] = round((moved + prefetched) / with_prefetches / 1e9, 1)
        out["op_time_bound_by"] = "compute" if compute_s >= memory_s else "HBM"
        if waits >= MAX_ASYNC_WAIT_PERCENT:
            out["roofline_unavailable_because"] = (
                f"{waits:.1f}% of the costed op time is waits for async copies (prefetches that carry less than half "
                "of the program's HBM bytes, transfers to or from the host or a peer), whose bytes move between their "
                "start and their wait: the ops' own roofs do not speak for the program")
        elif efficiency > 100:
            # Not a measurement: left out of the figure the report shows, with why.
            out["roofline_unavailable_because"] = (
                f"{efficiency:.0f}% of the roof is not physically possible: a peak is wrong (see peak_warnings) or "
                "some ops' bytes or FLOPs are not what their shapes say (data held on chip, moved by another engine)")
        else:
            out["op_time_roofline_efficiency_percent"] = round(efficiency, 2)
    return out


def _reconcile(summary: dict) -> str:
    """Why XProf's program efficiency and xdiag's differ, in numbers."""
    idle, xprof, ours = summary["xprof_idle_percent"], summary.get("roofline_efficiency_percent"), summary.get(
        "op_time_roofline_efficiency_percent")
    text = f"XProf's roofline divides by a time that is {idle}% device idle"
    if xprof is None or idle >= 100:
        return text + "; xdiag's figures use device op time only"
    busy = xprof / (1 - idle / 100)
    text += f": its {xprof}% over the window is {busy:.3g}% over busy time"
    if ours is not None and (ours > 1.5 * busy or busy > 1.5 * ours):
        costed = summary.get("costed_compute_op_time_percent")
        provenance = summary.get("flops_provenance") or "its cost model"
        text += (f"; xdiag's {ours}% over op time counts each op's FLOPs and bytes from its HLO shapes (GEMM custom "
                 f"calls included, {costed}% of compute op time costed) against the checked peaks; XProf's FLOP "
                 f"counts (provenance: {provenance}) and recorded peaks differ")
    return text


def _mark_impossible_rows(rows: list[dict], peaks: dict) -> list[dict]:
    """XProf's per-op rows above 100% of the roof: each keeps its number and gets `not_a_measurement` (why);
    returns them as {op, category, xprof_percent, why}."""
    out = []
    recorded, datasheet = peaks.get("recorded_peak_hbm_gb_per_s"), peaks.get("peak_hbm_gb_per_s")
    for row in rows:
        value = row.get("roofline_efficiency_percent")
        if value is None or value <= 100:
            continue
        category = str(row.get("category", "")).lower()
        if any(c in category for c in _COPY_CATEGORIES):
            why = ("an async copy's bytes are counted as HBM traffic over the copy op's own event (its start or its "
                   "wait), while they cross the host/peer link between copy-start and copy-done")
        elif recorded and datasheet and recorded < datasheet / 1.15:
            why = (f"XProf measures against the recorded {recorded:,.0f} GB/s, below the datasheet's {datasheet:,.0f} "
                   f"GB/s; against the datasheet this op is at {value * recorded / datasheet:.0f}%")
        else:
            why = "above the device's peak: the op's cost (FLOPs/bytes) or the peak XProf uses is wrong"
        row["not_a_measurement"] = why
        out.append({"op": row.get("name"), "category": row.get("category"), "xprof_percent": value, "why": why})
    return out
