"""Aggregation of the op table by HLO op, shared by the op-profile, roofline and detect_* tools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.attention_hlo import attention_key_lengths
from xdiag.analysis.categories import COPY_OP_CATEGORIES, categorize
from xdiag.analysis.op_table import op_table, profile_op_costs
from xdiag.analysis.roofline import TRANSFER_RATE_REASON, eight_bit_operands, roofline
from xdiag.analysis.source_lines import OpSource, op_source
from xdiag.cost.custom_calls import CUSTOM_CODE_REASON, bandwidth_floor
from xdiag.cost.library_kernels import UPPER_BOUND
from xdiag.cost.hlo import ON_CHIP_MEMORY_SPACE, instruction_cost
from xdiag.cost.torch_ops import NO_SHAPES_REASON, NOT_COSTED_REASON, recorded_op_cost
from xdiag.profile.columns import first_rows, unique_with_inverse
from xdiag.profile.space import NO_VALUE, Session
from xdiag.profile.trace_json import (
    CPU_OP_INPUTS_STAT, CPU_OP_STAT, KINETO, OP_ID_STAT, SHAPES_STAT, UNCAPTURED_LAUNCH_STAT, trace_format,
)


ASYNC_OPCODES = {"copy-start", "copy-done", "async-start", "async-done"}
"""Ops whose event is the start of, or the wait for, work that runs between them."""
LOOP_COST_REASON = "a loop's FLOPs and bytes are its body's, counted in the rows of the body's ops"


@dataclass
class OpStat:
    module: str
    name: str
    category: str
    count: int
    total_ps: int
    cost: dict | None  # flops/bytes/shapes from the HLO, when the profile carries the module
    source: OpSource | None = None  # the user's line (and the library's) its HLO's Python stack names

    @property
    def total_ms(self) -> float:
        return self.total_ps / 1e9

    @property
    def costed_count(self) -> int:
        """The runs its FLOPs and bytes per run speak for: all of them, but in a PyTorch kernel row some of whose
        runs no costed CPU op launched (_launched_cost)."""
        return int(self.cost.get("costed_runs", self.count)) if self.cost else self.count

    @property
    def costed_ps(self) -> int:
        """The time of those runs: its rates are their FLOPs and bytes over their own time, never another run's."""
        return int(self.cost.get("costed_ps", self.total_ps)) if self.cost else self.total_ps

    @property
    def moves_data_asynchronously(self) -> bool:
        """A transfer, or the start of or wait for async work (copy-start/-done, async-start/-done): its bytes move
        between its events, not during its own time."""
        return self.category in COPY_OP_CATEGORIES or bool(self.cost and self.cost["opcode"] in ASYNC_OPCODES)

    @property
    def prefetch_wait(self) -> bool:
        """The wait for an async copy or slice into on-chip memory (TPU VMEM: its result is in memory space 1 and
        the HBM read runs between start and done): time the program waits on HBM bandwidth."""
        return bool(self.cost and self.cost["opcode"] in ("copy-done", "async-done")
                    and self.cost.get("result_memory_space") == ON_CHIP_MEMORY_SPACE)

    @property
    def hbm_bytes(self) -> float:
        """Bytes per run that cross the HBM bus: the op's bytes, less the share of its arrays kept on chip (TPU
        VMEM, which the HBM roofline does not bound)."""
        share = self.cost.get("hbm_share") if self.cost else None
        return (self.cost["bytes"] if self.cost else 0.0) * (1.0 if share is None else share)

    def row(self, total_op_ps: int, peaks: dict | None = None) -> dict:
        """The op's table row; with the device's checked peaks (device_peaks.session_peaks) also its roofline:
        bound (compute|memory), roof_gflops_per_s, roofline_efficiency_percent and not_a_measurement (why) for values a
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
            seconds, runs = self.costed_ps / 1e12, self.costed_count
            if runs < self.count:
                # A rate over some runs, theirs alone: the others' FLOPs are not known, nor counted in their time.
                row.update(costed_runs=runs, costed_ms=round(self.costed_ps / 1e9, 4),
                           costed_share_of_op_time_percent=round(100 * self.costed_ps / total_op_ps, 2)
                           if total_op_ps else 0.0,
                           rates_over=f"{runs} of {self.count} runs: {self.cost['uncosted_runs_because']}")
            # The roofline's bytes are those that cross the HBM bus: not those of arrays kept on chip (TPU VMEM).
            share, hbm_bytes = self.cost.get("hbm_share"), self.hbm_bytes
            row.update(
                shape=self.cost["shape"],
                operand_shapes=self.cost["operand_shapes"],
                opcode=self.cost["opcode"],
                framework_op=self.cost["op_name"],
                flops_per_run=self.cost["flops"],
                bytes_per_run=self.cost["bytes"],
                arithmetic_intensity_flops_per_byte=round(self.cost["flops"] / hbm_bytes, 3) if hbm_bytes else None,
            )
            if share is not None:
                row.update(hbm_bytes_per_run=round(hbm_bytes), hbm_share_of_bytes=share, data_on_chip=share == 0)
            for key in ("matmul_precision", "in_loop_body"):
                if self.cost.get(key):
                    row[key] = self.cost[key]
            if self.prefetch_wait:
                row["waits_for_on_chip_prefetch"] = True
                # The array it waits for was read from HBM into VMEM by the copy it ends: HBM traffic of its program.
                row["prefetched_hbm_bytes_per_run"] = self.cost.get("result_bytes") or 0.0
            if self.moves_data_asynchronously:
                # An async copy's bytes cross a link between copy-start and copy-done (an async slice's between
                # async-start and async-done); the op's own event is the start or the wait, so bytes over its time
                # is no bandwidth (XProf shows such rows at 10^7 %).
                row.update(achieved_gflops_per_s=None, achieved_gib_per_s=None, achieved_gb_per_s=None,
                           rate_not_measured_because=TRANSFER_RATE_REASON)
            else:
                row.update(
                    achieved_gflops_per_s=round(self.cost["flops"] * runs / seconds / 1e9, 3) if seconds else None,
                    achieved_gib_per_s=round(hbm_bytes * runs / seconds / 2**30, 3) if seconds else None,
                    achieved_gb_per_s=round(hbm_bytes * runs / seconds / 1e9, 3) if seconds else None,
                )
                row.update(roofline(row, peaks))
                if row.get("operands_on_chip_inferred"):
                    row.update(achieved_gib_per_s=None, achieved_gb_per_s=None)  # no HBM rate: see that reason
            if self.cost.get("program_memory_passes") is not None:
                row["program_memory_passes"] = self.cost["program_memory_passes"]
            if self.cost.get("handed_on_bytes") and self.cost["bytes"]:
                row["handed_on_share_of_bytes"] = round(min(self.cost["handed_on_bytes"] / self.cost["bytes"], 1.0), 4)
                row["handed_on_array"] = self.cost["handed_on_array"]
            row["cost_source"] = self.cost.get("cost_source", "HLO shapes")
            if UPPER_BOUND in row["cost_source"]:
                # Its bytes and FLOPs assume full pages: every rate from them, and its share of the roof, is at most.
                row["rates_are_upper_bounds"] = True
        elif self.cost:
            row.update(shape=self.cost["shape"], operand_shapes=self.cost["operand_shapes"], opcode=self.cost["opcode"],
                       framework_op=self.cost["op_name"], flops_per_run=None,
                       flops_unknown_because=self.cost.get("flops_unknown_because", CUSTOM_CODE_REASON))
            if self.cost["opcode"] == "custom-call":
                row.update(bandwidth_floor(self.cost["bytes"], self.count, self.total_ps))
        if self.cost and "attention_key_lengths" in self.cost:
            # Present where the op's HLO was read: the attentions its program computes (an empty list: none).
            row["attention_key_lengths"] = self.cost["attention_key_lengths"]
        if self.cost:
            for key in ("loop", "loop_trip_count"):  # the innermost while it runs in, and that loop's trip count
                if self.cost.get(key):
                    row[key] = self.cost[key]
        if self.source is not None:
            row["source"] = self.source.record()
        return row


def op_stats(session: Session) -> list[OpStat]:
    """Per (program, op): executions, total time and HLO cost, busiest first. Cached.

    Programs that share a name (every `jit_dot` of a benchmark) are told apart by program id, so each op keeps
    its own program's shapes; such a row's module is the display name with the id, e.g. `jit_dot(49)`."""
    if "op_stats" in session.cache:
        return session.cache["op_stats"]
    ops = op_table(session)
    profile_costs = profile_op_costs(session)
    launched_costs = _launched_op_costs(session) if trace_format(session) == KINETO else None
    out: list[OpStat] = []
    if len(ops):
        # The table's distinct rows (millions of ops on large profiles, a few thousand keys), in np.unique's order.
        # An op's distinct keys differ only in the kernel (a GPU op may launch several: im2col, then its GEMM).
        unique, rank = unique_with_inverse(np.array([f"{m}\x00{p}\x00{n}" for m, p, n, *_ in ops.op_keys], dtype=object))
        # Summed per op code, then per key: no array per row beyond the durations (times in ps are integers, exact
        # in a float64 in either order).
        own_ps = np.bincount(ops.op, weights=ops.self_duration_ps(), minlength=len(rank))  # a loop without its body
        totals = np.bincount(rank, weights=own_ps, minlength=len(unique))
        # An execution launches each of its kernels once: an op ran as often as its most launched kernel.
        counts = np.zeros(len(unique), np.int64)
        np.maximum.at(counts, rank, np.bincount(ops.op, minlength=len(rank)))
        # A key's category is its first execution's (a GPU op's kernels may differ in category).
        first_code: dict[int, int] = {}
        first_row = first_rows(ops.op, len(rank))
        never = len(ops)  # a code in no row (first -1) comes after every code that ran
        for code in np.argsort(np.where(first_row < 0, never, first_row), kind="stable").tolist():
            first_code.setdefault(int(rank[code]), code)
        shared_names = _names_with_several_programs(session)
        attention_keys: dict[int, list[int]] = {}  # per module read: the key lengths of the attentions its HLO computes
        for k, key in enumerate(unique):
            module_name, pid_text, name = key.split("\x00", 2)
            pid = int(pid_text)
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            cost = instruction_cost(module, name) if module else None
            if cost is not None:
                if id(module) not in attention_keys:
                    attention_keys[id(module)] = sorted(attention_key_lengths(module))
                cost = {**cost, "attention_key_lengths": attention_keys[id(module)]}
            recorded = profile_costs.get((module_name, name))
            if recorded and cost and cost["opcode"] == "custom-call" and (not recorded["flops"] or cost["library_kernel"]):
                # XLA's cost model cannot see into a custom call and records 0 FLOPs for it, or the kernel author's
                # estimate (flash attention's forward: the dense reference's, causal or not): not a count where the
                # kernel's operands and known semantics give one.
                recorded = None
            if recorded:
                # The profiler's own cost model beats counting from shapes, but where it counts work the program
                # did not ask for: the MXU's extra passes at f32 precision (3x HIGH, 6x HIGHEST) in a matrix
                # product, and in other fusions every element its converts and broadcasts touch (a matrix-vector
                # product fused with its bf16->f32 converts: 5 "FLOPs" per weight where it does 2).
                category = ops.op_categories[first_code[k]]
                # A reduce-window's shape count is one add per element, not per element of each window: the
                # profile's count stands there.
                windowed = module is not None and "reduce-window" in {cost and cost["opcode"],
                                                                      *module.fused_opcodes.get(name, [])}
                shaped = cost["flops"] if cost and cost["flops_known"] and not windowed else 0
                flops, source = recorded["flops"], "profile cost model"
                if shaped and category in ("matmul", "convolution") and shaped > 1.5 * flops and eight_bit_operands(
                        {"operand_shapes": cost["operand_shapes"]}):
                    flops, source = shaped, (f"HLO shapes (the profile's count is {flops / shaped:.2g}x: XLA's cost "
                                             "model counts an 8-bit product's multiply-adds at half)")
                elif shaped and flops > 1.5 * shaped:
                    why = ("the MXU's extra passes for f32 precision" if category in ("matmul", "convolution") else
                           "XLA's cost model counts each element its converts and broadcasts touch")
                    flops, source = shaped, (f"HLO shapes (the arithmetic the program asks for; the profile's count "
                                             f"is {recorded['flops'] / shaped:.1f}x: {why})")
                cost = {**(cost or {"shape": recorded["shape"], "operand_shapes": [], "opcode": recorded["hlo_category"],
                                    "fusion_kind": "", "op_name": "", "source": recorded["source"]}),
                        "flops": flops, "bytes": recorded["bytes"], "flops_known": True, "cost_source": source}
            category = ops.op_categories[first_code[k]]
            if launched_costs is not None and not module_name:
                cost = _launched_cost(launched_costs, name, int(counts[k]), category)
            if cost and category == "control_flow":
                # Its body's ops carry the loop's FLOPs and bytes in their own rows: counting them here too would
                # divide them by the loop's own time (dispatching its trips), not by the time they took.
                cost = {**cost, "flops_known": False, "flops_unknown_because": LOOP_COST_REASON}
            label = module.display_name if module is not None and module_name in shared_names else module_name
            out.append(
                OpStat(
                    module=label,
                    name=name,
                    category=category,
                    count=int(counts[k]),
                    total_ps=int(totals[k]),
                    cost=cost,
                    source=op_source(module, name),
                )
            )
    out.sort(key=lambda s: -s.total_ps)
    session.cache["op_stats"] = out
    return out


_UNCAPTURED = ("launched before the capture",)  # a key no kernel name is: kernel name -> runs of it launched early
_COSTED_KINDS = ("matmul", "convolution", "attention")
"""Kernel kinds whose FLOPs a PyTorch trace can give (from the launching op's shapes): the others' rows say none."""
_NOT_ARITHMETIC = ("elementwise", "memcpy", "data_movement")
"""Kernel kinds that never do a costed op's products (its bias copy, a layout change of an operand)."""


class _RecordCosts(dict):
    """op_record -> its op_cost, each costed once (an op's record recurs every step)."""

    def __missing__(self, record: str) -> dict | None:
        self[record] = found = recorded_op_cost(record)
        return found


def _first_uncosted_reason(session: Session, costs: _RecordCosts) -> str | None:
    """Why the first CPU op the files name that is counted here but whose inputs do not give its FLOPs has none: the
    host planes in the session's order, each one's op records in the order its file first holds them (their string
    ids)."""
    for plane in session.host_planes():
        found = [sparse[1] for line in plane.lines if (sparse := line.strings.sparse(CPU_OP_INPUTS_STAT)) is not None]
        for record in np.unique(np.concatenate(found)).tolist() if found else []:
            cost = costs[plane.strings[record]]
            if cost is not None and "reason" in cost:
                return cost["reason"]
    return None


def launched_cpu_ops(session: Session, costs: _RecordCosts | None = None) -> dict[tuple[str, int], list[tuple]]:
    """(host, op number) -> the kernels a costed PyTorch CPU op launched, each (kernel name, duration ps, the op's
    FLOPs, its bytes, its label: "aten::addmm f32[4096,100] f32[100,64] f32[64]"), from the op records the reader
    linked to the kernels (CPU_OP_STAT, OP_ID_STAT) costed by xdiag.cost.torch_ops."""
    costs = _RecordCosts() if costs is None else costs
    launched: dict[tuple, list] = {}
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            number = line.numeric.get(OP_ID_STAT)
            if number is None:
                continue
            linked = np.flatnonzero(number != NO_VALUE)
            names = plane.names_of(line)[linked]
            records = line.strings[CPU_OP_STAT][linked]
            for name, op, duration, record in zip(
                    names.tolist(), number[linked].tolist(), line.durations.at(linked).tolist(), records.tolist()):
                cost = costs[plane.strings[record]]
                if cost is not None and "flops" in cost:
                    launched.setdefault((plane.host, op), []).append(
                        (name, duration, cost["flops"], cost["bytes"], cost["label"]))
    return launched


def _launched_op_costs(session: Session) -> dict:
    """Kernel name -> [FLOPs, bytes, costed runs, FLOPs per CPU-op label, their time in ps]: each costed PyTorch CPU
    op's FLOPs and bytes (launched_cpu_ops) shared out over the kernels it launched that do its arithmetic
    (GEMM, convolution or attention kernels by name; where none is named so, all but its elementwise and copy
    kernels, or all of them where those are all it launched) by their time, so each runs
    at the op's rate; the op's other kernels (a bias copy, a memset) get none. None -> why the rest have none;
    _UNCAPTURED -> per kernel name, its runs launched before the capture began (UNCAPTURED_LAUNCH_STAT), counted
    where some op is costed."""
    out: dict = {}
    costs = _RecordCosts()
    shapes = any(p.stats.get(SHAPES_STAT) for p in session.host_planes())
    reason = _first_uncosted_reason(session, costs)
    out[None] = reason if reason else NOT_COSTED_REASON if shapes else NO_SHAPES_REASON
    launched = launched_cpu_ops(session, costs)
    kinds = {name: categorize(None, None, name) for kernels in launched.values() for name, *_ in kernels}
    uncaptured: dict[str, int] = {}
    for plane in session.device_planes(with_events=True) if launched else ():
        for line in plane.lines:
            early = line.numeric.get(UNCAPTURED_LAUNCH_STAT)
            if early is not None:
                for name in plane.names_of(line)[np.flatnonzero(early == 1)].tolist():
                    uncaptured[name] = uncaptured.get(name, 0) + 1
    for kernels in launched.values():
        # An op's elementwise and copy kernels (addmm's bias copied into the output before a cuBLAS gemv) never do
        # its products: where no kernel is named a GEMM, convolution or attention, the FLOPs go to the others.
        doing = ([k for k in kernels if kinds[k[0]] in _COSTED_KINDS]
                 or [k for k in kernels if kinds[k[0]] not in _NOT_ARITHMETIC] or kernels)
        total = sum(k[1] for k in doing)
        for name, duration, flops, bytes_, label in doing:
            share = duration / total if total else 1 / len(doing)
            entry = out.setdefault(name, [0.0, 0.0, 0, {}, 0])
            entry[0] += flops * share
            entry[1] += bytes_ * share
            entry[2] += 1
            entry[3][label] = entry[3].get(label, 0.0) + flops * share
            entry[4] += duration
    out[_UNCAPTURED] = uncaptured
    return out


def _launched_cost(costs: dict, name: str, count: int, category: str) -> dict | None:
    """A PyTorch kernel row's cost from the CPU ops that launched it: FLOPs and bytes per run over the runs a costed
    op launched, with those runs (costed_runs) and their time (costed_ps) where they are not all of them: the row's
    rates are theirs over their own time; why the others have none (uncosted_runs_because). Where none is costed,
    why not, for the kinds that do arithmetic."""
    entry = costs.get(name)
    early = costs[_UNCAPTURED].get(name, 0)
    if entry is not None and entry[2]:
        flops, bytes_, runs, labels, costed_ps = entry
        label = max(labels, key=labels.get)
        inputs, _, output = label.partition(" -> ")  # a convolution's label ends with its output's shape
        op_name, *shapes = inputs.split(" ")
        cost = {"shape": output, "operand_shapes": [s for s in shapes if "[" in s], "opcode": op_name,
                "fusion_kind": "", "op_name": label, "source": "", "flops": flops / runs, "bytes": bytes_ / runs,
                "flops_known": True, "cost_source": "launching CPU op's input shapes (Kineto 'Input Dims'/'Input type')"}
        if runs < count:
            others = count - runs
            some = f"the other {others}" if early == others else f"{early} of the other {others}"
            because = (f"{some} {'were' if early > 1 else 'was'} launched before the capture began (their launch call "
                       "is not in the trace), so their op and shapes are not known" if early else "")
            if others > early:
                because += ("; " if because else "") + (
                    f"{others - early} {'were' if others - early > 1 else 'was'} launched by a CPU op whose FLOPs "
                    f"are not counted ({costs[None]})")
            cost.update(costed_runs=runs, costed_ps=costed_ps, uncosted_runs_because=because)
        return cost
    if category not in _COSTED_KINDS and entry is None:
        return None
    because = costs[None]
    if early:
        because += (f"; {early} of its {count} runs were launched before the capture began (their launch call is not "
                    "in the trace), so their op and shapes are not known")
    return {"shape": "", "operand_shapes": [], "opcode": "", "fusion_kind": "", "op_name": "", "source": "",
            "flops_known": False, "flops_unknown_because": because}


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


MIN_COSTED_PERCENT = 50.0
"""A rate over the costed ops speaks for the program only when they hold at least half its compute op time."""


@dataclass
class CostedWork:
    """The compute ops (transfers left out: their time is a wait) whose FLOPs and bytes are known, together."""

    stats: list[OpStat]
    flops: float
    bytes: float
    seconds: float
    covered_percent: float  # of the compute op time

    @property
    def upper_bound_flops_percent(self) -> float:
        """The share of these FLOPs counted from costs that are upper bounds (paged kernels' full pages): a rate over
        them is at most that rate."""
        bounded = sum(s.cost["flops"] * s.costed_count for s in self.stats
                      if UPPER_BOUND in s.cost.get("cost_source", ""))
        return round(100 * bounded / self.flops, 2) if self.flops else 0.0

    @property
    def speaks_for_the_program(self) -> bool:
        return bool(self.seconds) and self.covered_percent >= MIN_COSTED_PERCENT

    def not_representative_because(self) -> str:
        if not self.seconds:
            return "no op with known FLOPs and bytes ran on the device"
        return (f"only {self.covered_percent}% of the compute op time is in ops whose FLOPs and bytes are known "
                "(kernels that no HLO instruction or costed PyTorch op accounts for, opaque custom calls, runs "
                "launched before the capture); a rate over them would not be the program's")


def costed_work(session: Session) -> CostedWork:
    working = [s for s in op_stats(session) if s.category not in COPY_OP_CATEGORIES]
    working_ps = sum(s.total_ps for s in working)
    costed = [s for s in working if s.cost and s.cost["flops_known"]]
    # The costed runs' time only: a row some of whose runs are costed counts those runs' FLOPs over their own time.
    seconds = sum(s.costed_ps for s in costed) / 1e12
    return CostedWork(
        stats=costed,
        flops=sum(s.cost["flops"] * s.costed_count for s in costed),
        # HBM bytes only; an async op's bytes move between its start and its wait, counted by neither event.
        bytes=sum(s.hbm_bytes * s.costed_count for s in costed if not s.moves_data_asynchronously),
        seconds=seconds,
        covered_percent=round(100 * seconds * 1e12 / working_ps, 2) if working_ps else 0.0,
    )

