"""Aggregation of the op table by HLO op, shared by the op-profile, roofline and detect_* tools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.hlo_cost import instruction_cost, shape_bytes
from xdiag.analysis.timeline import op_table, profile_op_costs
from xdiag.profile.space import NO_VALUE, Session


@dataclass
class OpStat:
    module: str
    name: str
    category: str
    count: int
    total_ps: int
    cost: dict | None  # flops/bytes/shapes from the HLO, when the profile carries the module

    @property
    def total_ms(self) -> float:
        return self.total_ps / 1e9

    def row(self, total_op_ps: int, peaks: dict | None = None) -> dict:
        """The op's table row; with the device's checked peaks (device_peaks.session_peaks) also its roofline:
        bound (compute|memory), roof_gflops_per_s, roofline_efficiency_percent and flags for values a
        measurement cannot have (above the peak, transfers timed by their wait)."""
        row = {
            "op": self.name,
            "module": self.module,
            "category": self.category,
            "count": self.count,
            "total_ms": round(self.total_ms, 4),
            "avg_us": round(self.total_ps / max(self.count, 1) / 1e6, 3),
            "share_of_op_time_percent": round(100 * self.total_ps / total_op_ps, 2) if total_op_ps else 0.0,
        }
        if self.cost and self.cost["flops_known"]:
            seconds = self.total_ps / 1e12
            row.update(
                shape=self.cost["shape"],
                operand_shapes=self.cost["operand_shapes"],
                opcode=self.cost["opcode"],
                framework_op=self.cost["op_name"],
                flops_per_run=self.cost["flops"],
                bytes_per_run=self.cost["bytes"],
                arithmetic_intensity_flops_per_byte=round(self.cost["flops"] / self.cost["bytes"], 3)
                if self.cost["bytes"]
                else None,
            )
            if self.category in TRANSFER_CATEGORIES:
                # An async copy's bytes cross a link between copy-start and copy-done; the op's own event is the
                # start or the wait, so bytes over its time is no bandwidth (XProf shows such rows at 10^7 %).
                row.update(achieved_gflops_per_s=None, achieved_gib_per_s=None, achieved_gb_per_s=None,
                           rate_not_measured_because=TRANSFER_RATE_REASON)
            else:
                row.update(
                    achieved_gflops_per_s=round(self.cost["flops"] * self.count / seconds / 1e9, 3) if seconds else None,
                    achieved_gib_per_s=round(self.cost["bytes"] * self.count / seconds / 2**30, 3) if seconds else None,
                    achieved_gb_per_s=round(self.cost["bytes"] * self.count / seconds / 1e9, 3) if seconds else None,
                )
                row.update(roofline(row, peaks))
            if self.cost.get("program_memory_passes") is not None:
                row["program_memory_passes"] = self.cost["program_memory_passes"]
            if self.cost["source"]:
                row["source"] = self.cost["source"]
            row["cost_source"] = self.cost.get("cost_source", "HLO shapes")
        elif self.cost:
            row.update(shape=self.cost["shape"], operand_shapes=self.cost["operand_shapes"], opcode=self.cost["opcode"],
                       framework_op=self.cost["op_name"], flops_per_run=None,
                       flops_unknown_because="custom calls and host callbacks run code whose FLOPs the HLO does not say")
        return row


TRANSFER_CATEGORIES = {"async_copy", "memcpy"}
TRANSFER_RATE_REASON = (
    "a transfer's bytes move between its start and its completion over a host or peer link, not during this "
    "event's own time (the start, or the wait at the end)"
)


def roofline(row: dict, peaks: dict | None) -> dict:
    """bound, roof_gflops_per_s, roofline_efficiency_percent and flags of one costed op row, against checked
    peaks; {} without peaks (CPU) or without an achieved rate."""
    if not peaks or not peaks.get("peak_flops_per_s") or not peaks.get("peak_hbm_bytes_per_s"):
        return {}
    intensity, achieved = row.get("arithmetic_intensity_flops_per_byte"), row.get("achieved_gflops_per_s")
    bandwidth = row.get("achieved_gb_per_s")
    if intensity is None or achieved is None or bandwidth is None:
        return {}
    peak_flops, peak_bw = peaks["peak_flops_per_s"], peaks["peak_hbm_bytes_per_s"]
    compute_bound = intensity * peak_bw >= peak_flops
    roof = peak_flops if compute_bound else intensity * peak_bw
    efficiency = 100 * (achieved * 1e9 / peak_flops if compute_bound else bandwidth * 1e9 / peak_bw)
    out: dict = {
        "bound": "compute" if compute_bound else "memory",
        "roof_gflops_per_s": round(roof / 1e9, 3),
        "roofline_efficiency_percent": round(efficiency, 1),
    }
    if compute_bound and any(str(s).startswith(("f32", "f64")) for s in row.get("operand_shapes") or []):
        # The datasheet peak is the 16-bit one; f32 operands run at a lower, device-specific rate (TF32, FP32).
        out["efficiency_basis"] = "16-bit peak; this op's f32 operands have a lower peak"
    if efficiency > 100:
        out["flags"] = [
            f"{efficiency:.0f}% of the {'compute' if compute_bound else 'bandwidth'} peak is not physically possible: "
            "the peak is wrong, or the op's bytes/FLOPs are not what its shapes say (e.g. data served from a cache, "
            "or moved by another engine); not a measurement"
        ]
    return out


LOW_INTENSITY_FLOPS_PER_BYTE = 1.0
"""Without device peaks (CPU): ops doing under one FLOP per byte moved are memory-bound on any current CPU."""
EXTRA_PASSES_DEFECT_PERCENT = 20.0
"""Op time that extra passes over the same data cost (re-reads, intermediates written and read back), above
which memory-bound work is a defect rather than the nature of the work."""
BANDWIDTH_EFFICIENCY_LOW_PERCENT = 30.0
"""Memory-bound ops below this share of the HBM bandwidth roof leave most of the bandwidth unused."""


def _weighted(rows: list[dict], key: str) -> float | None:
    pairs = [(r[key], r["share_of_op_time_percent"]) for r in rows if r.get(key) is not None]
    weight = sum(w for _, w in pairs)
    return round(sum(v * w for v, w in pairs) / weight, 2) if weight else None


def memory_bound_rows(rows: list[dict]) -> list[dict]:
    """The rows on the memory side of the roofline that do arithmetic: below the device's ridge point (on CPU,
    which records no peaks, under LOW_INTENSITY_FLOPS_PER_BYTE). A compute-bound op never counts; pure data
    movement (0 FLOPs) is the detect_* tools' subject."""
    return [
        o for o in rows
        if o.get("arithmetic_intensity_flops_per_byte") is not None and (o.get("flops_per_run") or 0) > 0
        and (o["bound"] == "memory" if o.get("bound") else o["arithmetic_intensity_flops_per_byte"] < LOW_INTENSITY_FLOPS_PER_BYTE)
    ]


def roofline_summary(rows: list[dict]) -> dict:
    """From every op row: memory_bound_op_percent, memory_passes (time-weighted passes of their programs over
    their own data), memory_extra_pass_percent (op time those extra passes cost), memory_bandwidth_efficiency_percent, memory_bound_defect and memory_bound_why (several
    passes, or bandwidth left unused: memory-bound work near its roof is the nature of the work, not a defect),
    and dominant_ops_roofline_efficiency_percent over the busiest ops with a measured efficiency covering half
    the op time (None when they cover less: no peaks, or kernels the HLO does not name)."""
    low = memory_bound_rows(rows)
    passes = _weighted(low, "program_memory_passes")
    # Only the passes beyond the first are avoidable: a program moving its data k times wastes (1 - 1/k) of it.
    extra = round(sum(o["share_of_op_time_percent"] * (1 - 1 / max(o.get("program_memory_passes") or 1.0, 1.0))
                      for o in low), 2)
    bandwidth = _weighted([o for o in low if not o.get("flags")], "roofline_efficiency_percent")
    why = []
    if extra >= EXTRA_PASSES_DEFECT_PERCENT:
        why.append(f"their programs move their own data {passes:g} times per execution, so {extra:g}% of op time "
                   "goes to passes a fused program would not make")
    if bandwidth is not None and bandwidth < BANDWIDTH_EFFICIENCY_LOW_PERCENT:
        why.append(f"they reach only {bandwidth:g}% of the HBM bandwidth")
    measured = sorted((o for o in rows if o.get("roofline_efficiency_percent") is not None and not o.get("flags")
                       and not o.get("efficiency_basis")),
                      key=lambda o: -o["share_of_op_time_percent"])
    dominant, covered = [], 0.0
    for row in measured:
        dominant.append(row)
        covered += row["share_of_op_time_percent"]
        if covered >= 50:
            break
    costed = any(o.get("arithmetic_intensity_flops_per_byte") is not None for o in rows)
    return {
        "memory_bound_op_percent": round(sum(o["share_of_op_time_percent"] for o in low), 2) if costed else None,
        "memory_passes": passes,
        "memory_extra_pass_percent": extra,
        "memory_bandwidth_efficiency_percent": bandwidth,
        "memory_bound_defect": bool(why),
        "memory_bound_why": why,
        "dominant_ops_roofline_efficiency_percent": _weighted(dominant, "roofline_efficiency_percent") if covered >= 50 else None,
        "dominant_ops_share_percent": round(covered, 2) if covered >= 50 else None,
        "dominant_ops": [f"{o['op']} ({o['module']})" for o in dominant[:3]] if covered >= 50 else [],
        "flagged_op_rows": sum(1 for o in rows if o.get("flags")),
    }


def op_stats(session: Session) -> list[OpStat]:
    """Per (program, op): executions, total time and HLO cost, busiest first. Cached.

    Programs that share a name (every `jit_dot` of a benchmark) are told apart by program id, so each op keeps
    its own program's shapes; such a row's module is the display name with the id, e.g. `jit_dot(49)`."""
    if "op_stats" in session.cache:
        return session.cache["op_stats"]
    ops = op_table(session)
    profile_costs = profile_op_costs(session)
    out: list[OpStat] = []
    if len(ops):
        keys = np.array([f"{m}\x00{p}\x00{n}" for m, p, n in zip(ops.module, ops.program_id, ops.name)], dtype=object)
        unique, inverse = np.unique(keys, return_inverse=True)
        totals = np.bincount(inverse, weights=ops.duration_ps.astype(float))
        counts = np.bincount(inverse)
        first = np.full(len(unique), -1)
        first[inverse[::-1]] = np.arange(len(inverse))[::-1]
        shared_names = _names_with_several_programs(session)
        for k, key in enumerate(unique):
            module_name, pid_text, name = key.split("\x00", 2)
            pid = int(pid_text)
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            cost = instruction_cost(module, name) if module else None
            recorded = profile_costs.get((module_name, name))
            if recorded:
                # The profiler's own cost model beats counting from shapes.
                cost = {**(cost or {"shape": recorded["shape"], "operand_shapes": [], "opcode": recorded["hlo_category"],
                                    "fusion_kind": "", "op_name": "", "source": recorded["source"]}),
                        "flops": recorded["flops"], "bytes": recorded["bytes"], "flops_known": True,
                        "cost_source": "profile cost model"}
            label = module.display_name if module is not None and module_name in shared_names else module_name
            out.append(
                OpStat(
                    module=label,
                    name=name,
                    category=str(ops.category[first[k]]),
                    count=int(counts[k]),
                    total_ps=int(totals[k]),
                    cost=cost,
                )
            )
    out.sort(key=lambda s: -s.total_ps)
    session.cache["op_stats"] = out
    return out


def _names_with_several_programs(session: Session) -> set[str]:
    seen: dict[str, set[int]] = {}
    for module in session.hlo_modules:
        seen.setdefault(module.name, set()).add(module.program_id)
    return {name for name, ids in seen.items() if len(ids) > 1}


def category_totals(stats: list[OpStat]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for s in stats:
        totals[s.category] = totals.get(s.category, 0.0) + s.total_ms
    return {k: round(v, 4) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def transfer_spans(session: Session) -> dict | None:
    """Async copies (copy-start → copy-done, e.g. TPU host offload) measured on the link they use.

    A copy-done event is only the wait for its copy; where it does wait, its end is the copy's completion.
    Copies in one direction share the link, so each waited copy's service time runs from its copy-start, or
    from the previous completion in the same direction if later, to its completion; the link rate is the
    median of bytes over service time. Direction: a copy of a program parameter brings data to the device
    (prefetch), a copy of a computed value takes it away (offload).

    Returns: copies, gb_per_copy, span_ms_mean (copy-start to copy-done end), link_gb_per_s (median),
    link_rate_samples, copies_in_flight_max, directions {to_device, from_device: copies}; None without pairs."""
    ops = op_table(session)
    if not len(ops):
        return None
    done_mask = np.array([str(n).startswith("copy-done") for n in ops.name], dtype=bool)
    if not done_mask.any():
        return None
    pairs: dict[tuple[str, str], list[tuple[int, int, int, float]]] = {}  # (device, direction) -> (start, end, wait, bytes)
    directions = {"to_device": 0, "from_device": 0}
    for module_name, pid, done_name in {(m, int(p), n) for m, p, n in zip(ops.module[done_mask], ops.program_id[done_mask], ops.name[done_mask])}:
        module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
        found = module.find(done_name) if module else None
        if not found or not found[1].operands or found[1].operands[0] not in found[0].by_name:
            continue
        computation, done = found
        start_op = computation.by_name[done.operands[0]]
        source = computation.by_name.get(start_op.operands[0]) if start_op.operands else None
        direction = "to_device" if source is not None and source.opcode == "parameter" else "from_device"
        size = shape_bytes(done)
        for device in np.unique(ops.device):
            on_device = (ops.device == device) & (ops.module == module_name)
            starts = np.sort(ops.start_ps[on_device & (ops.name == start_op.name)])
            done_rows = on_device & (ops.name == done_name)
            order = np.argsort(ops.end_ps[done_rows])
            ends, waits = ops.end_ps[done_rows][order], (ops.end_ps - ops.start_ps)[done_rows][order]
            n = min(len(starts), len(ends))
            directions[direction] += n
            pairs.setdefault((str(device), direction), []).extend(
                zip(starts[:n].tolist(), ends[-n:].tolist(), waits[-n:].tolist(), [size] * n))
    copies = sum(len(v) for v in pairs.values())
    if not copies:
        return None
    rates, spans_ms, total_bytes, in_flight = [], [], 0.0, 0
    for items in pairs.values():
        items.sort(key=lambda t: t[1])
        previous = None
        for start, end, wait, size in items:
            spans_ms.append((end - start) / 1e9)
            total_bytes += size
            if wait > 0:  # the wait ended when the copy completed: a measured completion
                service = end - max(start, previous if previous is not None else start)
                if service > 0:
                    rates.append(size / (service / 1e12) / 1e9)
                previous = end
    for device in {d for d, _ in pairs}:
        spans = [(s, e) for (d, _), items in pairs.items() if d == device for s, e, _, _ in items]
        level = 0
        for _, step in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]):
            level += step
            in_flight = max(in_flight, level)
    return {
        "copies": copies,
        "gb_per_copy": round(total_bytes / copies / 1e9, 3),
        "span_ms_mean": round(float(np.mean(spans_ms)), 3),
        "link_gb_per_s": round(float(np.median(rates)), 2) if rates else None,
        "link_rate_samples": len(rates),
        "copies_in_flight_max": in_flight,
        "directions": directions,
    }
