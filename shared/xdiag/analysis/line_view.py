"""The user's program by device time, line by line and function by function: pprof's `list` and `top -cum` for the
time the device spends on each line's ops.

Each op's time (xdiag.analysis.op_stats) goes to its lines through the op's Python stack (the HLO module's stack
frame index: xdiag.analysis.source_lines): its *self* line is its innermost user frame (the line its source names,
as every finding's lines do; an op no user frame names is summed under its library frame, or under NO_LINE where the
profile names none), and every user line on its stack (each counted once) holds it in its *total*. A line's callees
are the next user frames inward on those stacks: a line's total is its self time plus its callees' time under it.
Functions the same way, by the function each frame runs in. Self times sum to the op time, exactly.

Beside each line: its ops' kinds, their achieved FLOP rate and HBM bandwidth against the roof of each op's precision
(the op rows' own costs and roofline: xdiag.analysis.roofline), the host time the Python tracer recorded in it
(JAX's `$file.py:LINE function` frames, PyTorch's `file.py(LINE): function`), and the code itself where its file is
readable (xdiag.analysis.source_code: a checkout named by `source_root`, or the path the profile records).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.host_vocabulary import (
    COMPILE_EVENT, DISPATCH_EVENT, HOST_TRANSFER_EVENT, SYNC_EVENT,
)
from xdiag.analysis.intervals import ends_past_earlier, frame_parents, open_frame
from xdiag.analysis.op_stats import OpStat, op_stats
from xdiag.analysis.roofline import (
    compute_peak, eight_bit_operands, mark_streamed_program, streams_through_on_chip_memory,
)
from xdiag.analysis.source_code import STALE, SourceReader
from xdiag.analysis.source_lines import (
    MODULE_EVENT, Frame, frame_kinds, is_library, op_kind, python_frame, short_path, user_files,
)
from xdiag.profile.columns import distinct_values, isin_ids
from xdiag.profile.space import HloInstruction, HloModule, Session
from xdiag.text_numbers import whole_number

NO_LINE = "(no source line)"
"""Where the op time no stack names goes, so that the self times sum to the op time."""
HOST_KINDS = (("sync", SYNC_EVENT), ("dispatch", DISPATCH_EVENT), ("compile", COMPILE_EVENT),
              ("transfer", HOST_TRANSFER_EVENT))
"""What the host time of a user's frame is spent on, by the events it encloses (xdiag.analysis.host_vocabulary):
waiting for the device, launching work, compiling, copying; the rest of it is the frame's own Python (input
preparation, the loop)."""


@dataclass
class Rates:
    """The costed work of some ops, summed: FLOPs and HBM bytes over their own time, and the time each op's roof
    of its precision would allow for them. Where a program streams its data through on-chip memory (TPU VMEM: its
    async copies carry most of its HBM bytes), its ops that work on what the copies brought, and the waits for
    those copies, are bound by the program's HBM rate (roofline.program_hbm_traffic, mark_fed_by_async_copies), not
    by their own rates on on-chip bytes: the program's rate is theirs, and their time is memory-bound, as the op
    profile's memory-bound rows count them (roofline.memory_bound_rows)."""

    flops: float = 0.0
    seconds: float = 0.0  # of the rows with a FLOP rate
    hbm_bytes: float = 0.0
    hbm_seconds: float = 0.0  # of the rows with an HBM rate of their own
    streamed_ps: float = 0.0  # ops fed by the streaming program's async copies, and the waits for those copies
    wait_ps: float = 0.0  # of streamed_ps, the waits (no FLOP rate: the other rates leave them out)
    program_hbm: dict = field(default_factory=dict)  # the streaming program's HBM traffic, where streamed_ps
    roof_flops: float = 0.0  # sum over rows of seconds x the compute peak of its operands' precision
    roof_bytes: float = 0.0  # sum over rows of seconds x the HBM peak
    efficiency_ps: float = 0.0  # sum of roofline_efficiency_percent x time, rows with a measured efficiency
    efficiency_time_ps: float = 0.0
    bound_ps: dict[str, float] = field(default_factory=dict)
    precision_ps: dict[str, float] = field(default_factory=dict)
    upper_bound: bool = False  # some of its ops' costs are upper bounds (a paged kernel's full pages)

    def add(self, row: dict, stat: OpStat, peaks: dict | None, program_hbm: dict) -> None:
        """`program_hbm`: the streaming program's (roofline.mark_streamed_program's answer; {} where none)."""
        if row.get("waits_for_on_chip_prefetch") and streams_through_on_chip_memory(program_hbm, row["module"]):
            self.wait_ps += stat.total_ps  # waiting for the streamed bytes: HBM bounds it
            self._add_streamed(stat.total_ps, program_hbm)
            return
        if row.get("achieved_gflops_per_s") is None or row.get("not_a_measurement"):
            return  # no FLOP count, a transfer timed by its wait, or costs the op's time shows wrong (over a peak)
        self.upper_bound = self.upper_bound or bool(row.get("rates_are_upper_bounds"))
        seconds = stat.costed_ps / 1e12
        runs = stat.costed_count
        self.flops += float(row.get("flops_per_run") or 0.0) * runs
        self.seconds += seconds
        precision = _precision(row)
        self.precision_ps[precision] = self.precision_ps.get(precision, 0.0) + stat.costed_ps
        if peaks and peaks.get("peak_flops_per_s"):
            self.roof_flops += seconds * compute_peak(row.get("operand_shapes") or [], peaks)
        if row.get("fed_by_async_copies"):  # its own rate is on on-chip bytes: it says nothing
            self._add_streamed(stat.costed_ps, program_hbm)
            return
        if row.get("achieved_gb_per_s") is not None:
            self.hbm_bytes += stat.hbm_bytes * runs
            self.hbm_seconds += seconds
            if peaks and peaks.get("peak_hbm_bytes_per_s"):
                self.roof_bytes += seconds * peaks["peak_hbm_bytes_per_s"]
        if row.get("roofline_efficiency_percent") is not None:
            self.efficiency_ps += row["roofline_efficiency_percent"] * stat.costed_ps
            self.efficiency_time_ps += stat.costed_ps
        if row.get("bound"):
            self.bound_ps[row["bound"]] = self.bound_ps.get(row["bound"], 0.0) + stat.costed_ps

    def _add_streamed(self, ps: float, program_hbm: dict) -> None:
        self.streamed_ps += ps
        self.program_hbm = program_hbm
        self.bound_ps["memory"] = self.bound_ps.get("memory", 0.0) + ps  # as roofline.memory_bound_rows counts them

    def record(self, line_ps: int) -> dict:
        """achieved_tflops_per_s, flops_percent_of_roof (of the compute roofs of its ops' precisions), precision (the
        one most of its costed time runs at) and precisions (all of them, where several),
        achieved_gb_per_s, hbm_percent_of_roof (its ops' own HBM bytes over their time, ops fed by async copies
        left out), fed_by_async_copies_percent (of the line's time: ops fed by a streaming program's async copies
        into on-chip memory, and the waits for them) with that program's program_hbm_gb_per_s and
        program_hbm_efficiency_percent (its HBM rate, the copies' bytes included, which bounds them),
        roofline_efficiency_percent (time-weighted over its ops with a measured one), bound, measured_percent (of
        the line's time its rates speak for), rates_are_upper_bounds, data_on_chip (its costed ops move no HBM
        bytes and no copies feed them); {} where none is costed. Rows whose rates are no measurement (over a peak)
        are left out."""
        measured_ps = self.seconds * 1e12 + self.wait_ps
        if not measured_ps:
            return {}
        out: dict = {"measured_percent": round(100 * measured_ps / line_ps, 2) if line_ps else 0.0}
        if self.seconds:
            out.update(achieved_tflops_per_s=round(self.flops / self.seconds / 1e12, 4),
                       precision=max(self.precision_ps, key=self.precision_ps.get))
        mixed = [p for p, ps in sorted(self.precision_ps.items(), key=lambda kv: -kv[1]) if ps]
        if len(mixed) > 1:
            out["precisions"] = mixed  # the roof is each op's own: FLOPs over what their roofs allow in their time
        if self.roof_flops:
            out["flops_percent_of_roof"] = round(100 * self.flops / self.roof_flops, 1)
        if self.hbm_seconds and not self.hbm_bytes and not self.streamed_ps:
            out["data_on_chip"] = True  # its ops' arrays stay in on-chip memory (TPU VMEM): no HBM rate to give
        elif self.hbm_seconds and self.hbm_bytes:
            out["achieved_gb_per_s"] = round(self.hbm_bytes / self.hbm_seconds / 1e9, 2)
            if self.roof_bytes:
                out["hbm_percent_of_roof"] = round(100 * self.hbm_bytes / self.roof_bytes, 1)
        if self.streamed_ps:
            out.update(fed_by_async_copies_percent=round(100 * self.streamed_ps / line_ps, 1) if line_ps else 0.0,
                       program_hbm_gb_per_s=self.program_hbm["program_hbm_gb_per_s"],
                       program_hbm_efficiency_percent=self.program_hbm["program_hbm_efficiency_percent"])
        if self.efficiency_time_ps:
            out["roofline_efficiency_percent"] = round(self.efficiency_ps / self.efficiency_time_ps, 1)
        if self.bound_ps:
            out["bound"] = max(self.bound_ps, key=self.bound_ps.get)
        if self.upper_bound:
            out["rates_are_upper_bounds"] = True
        return out


def _precision(row: dict) -> str:
    """The precision whose compute roof bounds an op (as roofline.compute_peak chooses it)."""
    narrow = eight_bit_operands(row)
    if narrow:
        return narrow
    if any(str(s).startswith(("f32", "f64")) for s in row.get("operand_shapes") or []):
        return "f32"
    return "16-bit"


@dataclass
class LineTime:
    """One line (or function) of the user's program: its device time, self and total, and what runs on it."""

    key: str  # `folder/file.py:LINE` (Frame.short), a function's `folder/file.py: function`, or NO_LINE
    file: str = ""  # the path the profile records
    line: int = 0
    function: str = ""
    library: bool = False  # no user frame: the library's frame that made the op
    self_ps: int = 0
    total_ps: int = 0
    callees: dict[str, int] = field(default_factory=dict)  # next user frame inward -> the time under this one
    kinds: dict[str, int] = field(default_factory=dict)  # op kind -> self time
    ops: dict[str, int] = field(default_factory=dict)  # op name -> self time
    rates: Rates = field(default_factory=Rates)
    host_ps: int = 0  # the Python tracer's time in this frame with no deeper user frame
    host_kinds: dict[str, int] = field(default_factory=dict)  # sync / dispatch / compile / transfer -> host time
    modules: dict[str, int] = field(default_factory=dict)  # PyTorch nn.Module -> self time


@dataclass
class LineView:
    """Every line and function the ops' stacks name, with the op time (ps) they share out."""

    op_ps: int
    lines: dict[str, LineTime]
    functions: dict[str, LineTime]
    stacks_recorded: bool  # some op's stack names a user frame
    host_traced: bool  # the Python tracer's frames are in the profile

    def ranked(self, by: str = "self", functions: bool = False) -> list[LineTime]:
        """Busiest first by self or total device time (then host time): pprof's `top` and `top -cum`."""
        rows = (self.functions if functions else self.lines).values()
        key = {"self": lambda t: (t.self_ps, t.total_ps, t.host_ps), "total": lambda t: (t.total_ps, t.self_ps,
                                                                                           t.host_ps),
               "host": lambda t: (t.host_ps, t.total_ps)}[by]
        return sorted(rows, key=lambda t: tuple(-v for v in key(t)) + (t.key,))


def _user_frames(module: HloModule, instruction: HloInstruction) -> list[Frame]:
    return [Frame(f, line, fn) for f, line, fn in module.stack(instruction) if not is_library(f)]


def op_user_stack(module: HloModule | None, stat: OpStat) -> list[Frame]:
    """The user frames of the stack an op's line comes from, innermost first: its own stack, or where its line is
    another instruction's (a fusion's fused op, the array a move XLA inserted moves), that instruction's."""
    source = stat.source
    if source is None or source.user is None:
        return []
    found = module.find(stat.name) if module is not None else None
    if found is None:
        return [source.user]
    computation, instruction = found
    own = _user_frames(module, instruction)
    if own and own[0] == source.user:
        return own
    candidates: list[HloInstruction] = []
    for name in instruction.called:
        called = module.computations.get(name)
        candidates += list(called.instructions) if called else []
    current = instruction
    for _ in range(4):  # source_lines.OPERAND_HOPS: the moved array's line
        operand = computation.by_name.get(current.operands[0]) if current.operands else None
        if operand is None:
            break
        candidates.append(operand)
        current = operand
    for candidate in candidates:
        frames = _user_frames(module, candidate)
        if frames and frames[0] == source.user:
            return frames
    return [source.user]


def _function_key(frame: Frame) -> str:
    return f"{short_path(frame.file)}: {frame.function or '?'}"


def _entry(table: dict[str, LineTime], key: str, frame: Frame | None, library: bool = False,
           function: bool = False) -> LineTime:
    entry = table.get(key)
    if entry is None:
        entry = table[key] = LineTime(key=key, file=frame.file if frame else "", line=0 if function or not frame
                                      else frame.line, function=frame.function if frame else "", library=library)
    return entry


def _charge(table: dict[str, LineTime], keys: list[tuple[str, Frame]], ps: int, function: bool = False) -> None:
    """Adds an op's time to the totals of the frames on its stack (outermost first), each once, and to the callee
    edge from each frame to the next distinct one inward after its last appearance."""
    last = {key: i for i, (key, _) in enumerate(keys)}  # each key's innermost appearance: one pass, not one per key
    seen: set[str] = set()
    for key, frame in keys:
        if key in seen:
            continue
        seen.add(key)
        entry = _entry(table, key, frame, function=function)
        entry.total_ps += ps
        if last[key] + 1 < len(keys):  # the frame after a key's last appearance is another key's
            inner = keys[last[key] + 1][0]
            entry.callees[inner] = entry.callees.get(inner, 0) + ps


def _add_op(lines: dict[str, LineTime], functions: dict[str, LineTime], stack: list[Frame], source,
            stat: OpStat, ps: int, kind: str, row: dict | None, peaks: dict | None, program_hbm: dict,
            nn_module: str = "") -> None:
    """`ps` of an op's time on the lines and functions of its user stack (innermost first): the innermost's self
    time, every frame's total; with no user frame, on its library's frame or NO_LINE. `row`: the op's row, whose
    rates count where all its time is here (Rates.add, with `program_hbm`)."""
    if stack:
        outermost = list(reversed(stack))
        _charge(lines, [(f.short, f) for f in outermost], ps)
        _charge(functions, [(_function_key(f), f) for f in outermost], ps, function=True)
        own = _entry(lines, stack[0].short, stack[0])
        own_function = _entry(functions, _function_key(stack[0]), stack[0], function=True)
    else:
        frame = source.library if source is not None else None
        key = source.key if source is not None and source.key else NO_LINE
        own = _entry(lines, key, frame, library=frame is not None)
        own.total_ps += ps
        own_function = _entry(functions, _function_key(frame) if frame else NO_LINE, frame,
                              library=frame is not None, function=True)
        own_function.total_ps += ps
    for entry in (own, own_function):
        entry.self_ps += ps
        entry.kinds[kind] = entry.kinds.get(kind, 0) + ps
        entry.ops[stat.name] = entry.ops.get(stat.name, 0) + ps
        if row is not None:
            entry.rates.add(row, stat, peaks, program_hbm)
        if nn_module:
            entry.modules[nn_module] = entry.modules.get(nn_module, 0) + ps


def line_view(session: Session) -> LineView:
    """The session's op time by line and by function, with rates and host time. Cached per session."""
    if "line_view" in session.cache:
        return session.cache["line_view"]
    stats = op_stats(session)
    peaks = session_peaks(session)
    op_ps = sum(s.total_ps for s in stats)
    lines: dict[str, LineTime] = {}
    functions: dict[str, LineTime] = {}
    recorded = False
    modules = {}
    torch_stacks = torch_kernel_stacks(session) if not session.hlo_modules else {}
    rows = [stat.row(op_ps, peaks) for stat in stats]
    program_hbm = mark_streamed_program(rows, peaks)
    for stat, row in zip(stats, rows):
        if not stat.total_ps:
            continue
        module = modules.get(stat.module)
        if stat.module not in modules:
            module = modules[stat.module] = _module_of(session, stat.module)
        kind = op_kind(stat.name, stat.category, stat.source)
        launched = torch_stacks.get(stat.name) if not stat.module else None
        if launched:  # a PyTorch kernel: its time by the user's frames around each launch
            parts = _shares(stat.total_ps, launched)
            whole = len(parts) == 1 and parts[0][1] == stat.total_ps
            for (names, nn_module), ps in parts:
                stack = [f for f in (python_frame(n) for n in reversed(names)) if f is not None]
                if ps and stack:
                    recorded = True
                    _add_op(lines, functions, stack, None, stat, ps, kind, row if whole else None, peaks,
                            program_hbm, nn_module.removeprefix(MODULE_EVENT))
            left = stat.total_ps - sum(ps for _, ps in parts)
            if left:
                _add_op(lines, functions, [], None, stat, left, kind, None, peaks, program_hbm)
            continue
        stack = op_user_stack(module, stat)
        recorded = recorded or bool(stack)
        _add_op(lines, functions, stack, stat.source, stat, stat.total_ps, kind, row, peaks, program_hbm)
    traced = _add_host_time(session, lines, functions)
    view = LineView(op_ps=op_ps, lines=lines, functions=functions, stacks_recorded=recorded, host_traced=traced)
    session.cache["line_view"] = view
    return view


def _module_of(session: Session, label: str) -> HloModule | None:
    """The module of an op row (`jit_step`, or `jit_step(36)` where several programs share the name)."""
    if not label:
        return None
    name, _, pid = label.rpartition("(")
    program_id = whole_number(pid[:-1]) if pid.endswith(")") else None
    if name and program_id is not None:
        found = session.module_for(name, program_id)
        if found is not None:
            return found
    return session.module_for(label, None)


# ---------------------------------------------------------------------------------------------- host time


def _python_lines(session: Session):
    """(plane, line) of the host lines that may hold Python frames: JAX's Python tracer's, PyTorch's threads."""
    covered = session.hosts_with_events()
    for plane in session.host_by_host([p for host in covered for p in host.planes]):
        for line in plane.lines:
            if len(line) and (line.name.startswith("thread ") or "python" in line.name.lower()):
                yield plane, line


def python_frame_times(session: Session) -> dict:
    """The Python tracer's time in each user frame with no deeper user frame, and what the events inside it are
    (HOST_KINDS): {"traced": whether any user frame was recorded, "frames": {frame event name: [own ps, {kind:
    ps}]}}, summed over the session's Python lines. Cached (a host summary carries it: xdiag.tools.host_summary)."""
    if "python_frame_times" in session.cache:
        return session.cache["python_frame_times"]
    kind_of = frame_kinds(user_files(session.hlo_modules))
    traced, frames = False, {}
    for plane, line in _python_lines(session):
        names = plane.event_names
        user_ids = [k for k, n in names.items() if kind_of(n) == "user"]
        if not user_ids:
            continue
        starts, ends = line.start_ps, line.end_ps
        ids = line.metadata_id.astype(np.int64)
        is_user = isin_ids(ids, np.array(user_ids, dtype=np.int64))
        if not is_user.any():
            continue
        traced = True
        # The innermost user frame around each moment (a stack of open user frames, as frame_parents walks them);
        # each event of a kind (HOST_KINDS) is charged to the innermost frame open at it, once: not where it ends
        # within an earlier one charged to that frame (np.asarray's __array__); each user frame's own time is its
        # span less the spans of the user frames directly inside it. Events of no kind only close frames, which
        # the next frame or charged event closes too: they are not walked.
        kind_of_id = {}  # of the names on the line alone (a plane names thousands)
        for name_id in distinct_values(ids[~is_user]).tolist():
            kind = next((k for k, pattern in HOST_KINDS if pattern.search(names.get(name_id, ""))), "")
            if kind:
                kind_of_id[name_id] = kind
        walked = np.flatnonzero(is_user | isin_ids(ids, np.array(list(kind_of_id), dtype=np.int64)))
        walked = walked[np.lexsort((-ends[walked], starts[walked]))]
        is_frame = is_user[walked]
        frame_events = walked[is_frame]
        frame_ends = ends[frame_events]
        parents = frame_parents(starts[frame_events], frame_ends)
        span = frame_ends - starts[frame_events]
        own = span.copy()
        inside = parents >= 0
        np.subtract.at(own, parents[inside], span[inside])
        frame_names = [names.get(k, "") for k in ids[frame_events].tolist()]
        for name, ps in zip(frame_names, own.tolist()):
            entry = frames.setdefault(name, [0, {}])
            entry[0] += ps
        charged_at = np.flatnonzero(~is_frame)
        events = walked[charged_at]
        frame = open_frame(parents, frame_ends, np.cumsum(is_frame)[charged_at], starts[events])
        in_frame = frame >= 0
        events, frame = events[in_frame], frame[in_frame]
        once = ends_past_earlier(frame, ends[events], floor=-1)
        events, frame = events[once], frame[once]
        # Summed per (frame name, kind), each pair in the order it is first charged (the order of the kinds shown)
        name_index = {name: i for i, name in enumerate(dict.fromkeys(frame_names))}
        kinds = [kind for kind, _ in HOST_KINDS]
        kind_index = {k: kinds.index(kind) for k, kind in kind_of_id.items()}
        pair = (np.array([name_index[n] for n in frame_names], dtype=np.int64)[frame] * len(kinds)
                + np.array([kind_index[k] for k in ids[events].tolist()], dtype=np.int64))
        pairs, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        totals = np.zeros(len(pairs), dtype=np.int64)
        np.add.at(totals, inverse, ends[events] - starts[events])
        by_name = list(name_index)
        for p in np.argsort(first, kind="stable").tolist():
            name, kind = by_name[int(pairs[p]) // len(kinds)], kinds[int(pairs[p]) % len(kinds)]
            charged = frames[name][1]
            charged[kind] = charged.get(kind, 0) + int(totals[p])
    out = {"traced": traced, "frames": frames}
    session.cache["python_frame_times"] = out
    return out


def combined_python_frame_times(parts: list[dict]) -> dict:
    """python_frame_times of several hosts as the whole session's: each frame's times summed."""
    frames: dict = {}
    for part in parts:
        for name, (ps, kinds) in part["frames"].items():
            entry = frames.setdefault(name, [0, {}])
            entry[0] += ps
            for kind, kind_ps in kinds.items():
                entry[1][kind] = entry[1].get(kind, 0) + kind_ps
    return {"traced": any(part["traced"] for part in parts), "frames": frames}


def _add_host_time(session: Session, lines: dict[str, LineTime], functions: dict[str, LineTime]) -> bool:
    """python_frame_times on the line and function each frame names. JAX's tracer names a file by its name alone:
    it is put on the path the HLO's stacks give that name, where one does. True where any user frame was
    recorded."""
    full_paths: dict[str, set[str]] = {}
    for m in session.hlo_modules:
        for file, *_ in m.stack_frames:
            if file and not is_library(file):
                full_paths.setdefault(file.rsplit("/", 1)[-1], set()).add(file)
    times = python_frame_times(session)
    for name, (ps, kinds) in sorted(times["frames"].items()):
        frame = python_frame(name)
        if frame is None or ps <= 0:
            continue
        paths = full_paths.get(frame.file, set())
        if "/" not in frame.file and len(paths) == 1:
            frame = Frame(next(iter(paths)), frame.line, frame.function)
        for table, key in ((lines, frame.short), (functions, _function_key(frame))):
            entry = _entry(table, key, frame, function=table is functions)
            entry.host_ps += ps
            for kind, kind_ps in kinds.items():
                entry.host_kinds[kind] = entry.host_kinds.get(kind, 0) + kind_ps
    return times["traced"]


def torch_kernel_stacks(session: Session) -> dict[str, dict[tuple[tuple[str, ...], str], int]]:
    """PyTorch's kernels by the user's Python frames around the runtime call that launched each: Kineto's
    `python_function` events (with_stack=True) on the launching thread enclose the launch, which names the kernel by
    its correlation id. Kernel name -> {(the user's frame events outermost first, the innermost nn.Module call
    around the launch or ""): its kernels' time in ps}. {} where the trace holds no user frame."""
    kind_of = frame_kinds(frozenset())
    around: dict[tuple[str, int], tuple[tuple[str, ...], str]] = {}  # (host, correlation) -> frames, module
    for plane in session.host_planes():
        names = plane.event_names
        kinds = {k: kind_of(n) for k, n in names.items()}
        if not any(kinds.values()):
            continue
        for line in plane.lines:
            found = line.numeric.sparse("correlation_id")
            if found is None or not len(line):
                continue
            launches = dict(zip(found[0].tolist(), found[1].tolist()))
            starts, ends, ids = line.start_ps, line.end_ps, line.metadata_id.tolist()
            stack: list[tuple[int, str, str]] = []  # open frames and module calls: (end, kind, name)
            for i in np.lexsort((-ends, starts)).tolist():
                start = int(starts[i])
                while stack and stack[-1][0] <= start:
                    stack.pop()
                kind = kinds.get(ids[i], "")
                if kind:
                    stack.append((int(ends[i]), kind, names.get(ids[i], "")))
                elif i in launches and stack:
                    frames = tuple(n for _, k, n in stack if k == "user")
                    module = next((n for _, k, n in reversed(stack) if k == "module"), "")
                    if frames:
                        around[(plane.host, int(launches[i]))] = (frames, module)
    out: dict[str, dict[tuple[tuple[str, ...], str], int]] = {}
    if not around:
        return out
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            found = line.numeric.sparse("correlation_id")
            if found is None:
                continue
            names = plane.names_of(line)
            durations = line.durations.at(found[0])
            for name, correlation, ps in zip(names[found[0]].tolist(), found[1].tolist(), durations.tolist()):
                where = around.get((plane.host, int(correlation)))
                if where is not None:
                    per = out.setdefault(name, {})
                    per[where] = per.get(where, 0) + int(ps)
    return out


def _shares(total: int, parts: dict) -> list[tuple[object, int]]:
    """`total` shared out over `parts` (key -> weight) in whole picoseconds that sum to at most `total`: each its
    weight where the weights fit, else its proportion, the rounding's remainder to the largest."""
    weight = sum(parts.values())
    if weight <= total:
        return list(parts.items())
    shared = [(k, total * w // weight) for k, w in parts.items()]
    left = total - sum(ps for _, ps in shared)
    if shared and left:
        top = max(range(len(shared)), key=lambda i: shared[i][1])
        shared[top] = (shared[top][0], shared[top][1] + left)
    return shared


# ---------------------------------------------------------------------------------------------- records


def _ms(ps: float) -> float:
    return round(ps / 1e9, 4)


def stale_files(view: LineView, reader: SourceReader) -> dict[str, str]:
    """Recorded path -> why the file read for it is not the version the profile ran, where any line the view names
    in it shows so (SourceReader.quote): a file one line proves edited since the capture may have moved every line,
    so none of its lines is quoted."""
    out: dict[str, str] = {}
    for entry in view.lines.values():
        if entry.line and not entry.library and entry.file not in out:
            quoted = reader.quote(entry.file, entry.line, context=0, function=entry.function)
            if STALE in quoted.get("code_not_available", ""):
                out[entry.file] = quoted["code_not_available"]
    return out


def capture_paths_note(view: LineView, reader: SourceReader) -> str | None:
    """Where the user's files a view names are not all readable here: that its paths are the capture machine's, how
    many cannot be read, and what reads them (`source_root`); None where every one can be read."""
    files = sorted({entry.file for entry in view.lines.values()
                    if entry.line and not entry.library and entry.file and entry.file.endswith(".py")})
    missing = [path for path in files if reader.locate(path) is None]
    if not missing:
        return None
    source_root = reader.source_root
    under = f" under source_root {source_root}" if source_root is not None else ""
    return (f"the paths are those the capture machine recorded: {len(missing)} of the {len(files)} files are not "
            f"readable on this machine{under} (e.g. {missing[0]}); give source_root (--source-root DIR on the "
            "command line), a checkout here holding them, to read their code")


def line_record(entry: LineTime, op_ps: int, reader: SourceReader | None = None, top_ops: int = 3,
                stale: dict[str, str] | None = None) -> dict:
    """One line or function as the tool and the CLI give it, with its code where `reader` reads it; `stale`:
    stale_files' answer."""
    out: dict = {"line": entry.key}
    if entry.function and entry.line:
        out["function"] = entry.function
    if entry.library:
        out["library"] = True
    out.update(self_ms=_ms(entry.self_ps), total_ms=_ms(entry.total_ps),
               self_percent=round(100 * entry.self_ps / op_ps, 2) if op_ps else 0.0,
               total_percent=round(100 * entry.total_ps / op_ps, 2) if op_ps else 0.0)
    if entry.kinds:
        out["kinds"] = {k: _ms(v) for k, v in sorted(entry.kinds.items(), key=lambda kv: -kv[1])}
    if entry.ops:
        out["top_ops"] = [{"op": name, "ms": _ms(ps)} for name, ps in
                          sorted(entry.ops.items(), key=lambda kv: -kv[1])[:top_ops]]
    out.update(entry.rates.record(entry.self_ps))
    if entry.modules:
        out["modules"] = [{"module": k, "ms": _ms(v)}
                          for k, v in sorted(entry.modules.items(), key=lambda kv: -kv[1])[:3]]
    if entry.callees:
        out["callees"] = [{"line": k, "ms": _ms(v)} for k, v in sorted(entry.callees.items(), key=lambda kv: -kv[1])]
    if entry.host_ps:
        out["host_ms"] = _ms(entry.host_ps)
        kinds = dict(entry.host_kinds)
        rest = entry.host_ps - sum(kinds.values())
        if kinds and rest > 0:
            kinds["python"] = rest  # the frame's own Python and the library calls that are none of HOST_KINDS
        if kinds:
            out["host_kinds"] = {k: _ms(v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}
    if reader is not None and entry.line and not entry.library:
        if stale and entry.file in stale:
            out["code_not_available"] = stale[entry.file]
        else:
            out.update(reader.quote(entry.file, entry.line, function=entry.function))
    return out


def line_times(session: Session) -> dict[str, dict]:
    """The stable, small answer another analysis compares (xdiag diff's "the lines whose time moved most"): line key
    (`folder/file.py:LINE`, a library's frame, or NO_LINE) -> {self_ms, total_ms, host_ms, function}. Self times sum
    to the session's op time."""
    view = line_view(session)
    return {key: {"self_ms": _ms(t.self_ps), "total_ms": _ms(t.total_ps), "host_ms": _ms(t.host_ps),
                  "function": t.function}
            for key, t in view.lines.items()}



def line_times_of_result(result: dict) -> dict[str, dict]:
    """line_times from a get_line_view result as an analysis keeps it (tools/get_line_view.json: status, summary,
    detail), for comparing two analyses without their profiles: its listed lines only (the tool's top_n, busiest
    first); {} where the tool gave no lines."""
    if result.get("status") != "ok":
        return {}
    return {row["line"]: {"self_ms": row.get("self_ms", 0.0), "total_ms": row.get("total_ms", 0.0),
                          "host_ms": row.get("host_ms", 0.0), "function": row.get("function", ""),
                          **({"code": row["code"]} if isinstance(row.get("code"), str) else {})}
            for row in (result.get("detail") or {}).get("lines") or [] if isinstance(row, dict) and "line" in row}
