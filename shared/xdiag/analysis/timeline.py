"""Derived tables every tool reads: XLA op executions, steps, and time accounting.

Built once per session from the compact event columns and cached on the session, so the
15 tools share one pass over the events. Works the same on host planes (XLA:CPU ops run
as events on the CPU client's threads) and device planes (GPU streams, TPU `XLA Ops`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from xdiag.cost.custom_calls import is_gemm_call
from xdiag.profile.columns import factorize_rows, isin_ids, unique_with_inverse
from xdiag.profile.space import NO_VALUE, HloInstruction, HloModule, Line, Plane, Session
from xdiag.profile.trace_json import BLOCKING_COPY_STAT, FIRST_LAUNCH_STAT, FORMAT_STAT, KINETO

COLLECTIVE_OPCODES = {
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
    "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done", "collective-permute-start",
    "collective-permute-done", "send", "recv", "send-done", "recv-done", "ragged-all-to-all",
}
DATA_MOVEMENT_OPCODES = {
    "copy", "transpose", "reshape", "broadcast", "slice", "concatenate", "pad", "dynamic-slice",
    "dynamic-update-slice", "gather", "scatter", "copy-start", "copy-done", "reverse", "iota",
}
ASYNC_COPY_OPCODES = {"copy-start", "copy-done"}
"""Copies between memory spaces: to or from the host (offload) a transfer, to or from on-chip memory a prefetch."""
TRANSFER_OP_CATEGORIES = ("async_copy", "memcpy")
"""Op categories that only move data between memory spaces (host offload, H2D/D2H copies)."""
COPY_OP_CATEGORIES = (*TRANSFER_OP_CATEGORIES, "prefetch")
"""Op categories whose events are a copy's issue or its wait, not the copy: no rate or cost of their own."""
STRUCTURAL_OPCODES = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}
COMPILE_EVENT = re.compile(
    r"backend_compile|lower_sharding_computation|lower_jaxpr_to_stablehlo|jit_compile|_cached_compilation|"
    r"XlaCompile|compile_or_get_cached|PjitFunction::Compile|PjRtClient::Compile|Compile\b"
)
SYNC_EVENT = re.compile(
    r"np\.asarray|device_get|block_until_ready|__array__|\b_value\b|copy_to_host|TransferFromDevice|"
    r"CopyToHost|BlockHostUntilReady|PjRtBuffer::ToLiteral|ToLiteralSync|\.item\b|__float__|__int__"
)
CALLBACK_EVENT = re.compile(
    r"pure_callback|io_callback|debug_callback|_wrapped_callback|\bhost_callback\b|xla_python_\w*callback|PyCallback"
)
"""Python running as a host callback from compiled code (not e.g. the runtime's 'rendezvous callback', nor a Python
tracer event of a file whose name contains one of these words, e.g. `$host_callback_step.py:46 step`)."""
HOST_TRANSFER_EVENT = re.compile(
    r"\bdevice_put\b|DevicePut|BufferFromHostBuffer|Linearize|H2D Dispatch|D2H Dispatch|TransferToDevice|"
    r"TransferFromDevice|TransferToInfeed|TransferFromOutfeed|DmaBuffer"
)
"""The host's side of host<->device copies (jax.device_put, the TPU runtime re-tiling a buffer for the link,
Linearize / Delinearize and their transposes, the DMAs it issues, and mapping host buffers for DMA, e.g. pinned
host memory an offloading program reads): a plain transfer leaves nothing on the device's op lines."""
DEVICE_TO_HOST_COPY_EVENT = re.compile(
    r"TransferFromDevice|D2H Dispatch|Delinearize|TransferFromOutfeed|CopyToHost|MemcpyDtoH|\bDtoH\b"
)
"""The host's side of device->host copies only (a read of a result: its DMA, and the TPU runtime's re-tiling of it
for the host)."""
COMPLETION_SUFFIX = "=>Done"
"""The TPU runtime marks the completion of what it issued (`X=>IssueEvent`) with a short `X=>IssueEvent=>Done`
event: the DMA itself runs between the two, with no event of its own."""
DISPATCH_EVENT = re.compile(r"^PjitFunction\(|^PmapFunction\(|ExecuteHelper|LoadedExecutable::Execute\b|^ExecutorState::Process$")
"""Launching work: a jitted call or program execution (JAX, PjRt), or TensorFlow's executor running a graph's ops
one by one (each op launches its own kernel)."""
EXECUTE_EVENT = re.compile(r"LoadedExecutable::Execute(Helper\w*|Sharded\w*)?$|LoadedExecutable::Execute \(")
"""One event per compiled program launched: counts dispatches without the nesting of PjitFunction events."""
JITTED_CALL_EVENT = re.compile(r"^PjitFunction\(|^PmapFunction\(")
"""One Python call of a jitted function, named after it: its first call is where warm-up shows."""


@dataclass(frozen=True)
class HostVocabulary:
    """What a host's events are called in one runtime's words: a blocking sync, a launch (its time), a launch (one
    counted per program or kernel)."""

    sync: re.Pattern
    dispatch: re.Pattern
    execute: re.Pattern
    sync_stat: str | None = None
    """A stat that marks further events as blocking syncs, whatever their name (PyTorch: async copies that block)."""
    one_launch_on_several_threads: bool = True
    """An SPMD launch shows on the calling thread and again on each device's thread (PjRt); PyTorch's autograd
    thread launches its own kernels, each once."""
    runtime_call: re.Pattern | None = None
    """The GPU runtime's API calls (CUDA/HIP: launches, allocations, stream and event calls), each as quick as the
    last at steady state: one far longer than its call's median is a one-time cost (loading a kernel's module on
    first use, creating the context, a stream or a library handle, growing the allocator), not per-call overhead.
    Its syncs and copies are left out: how long they wait is the device's work, not the call's."""
    first_launch_stat: str | None = None
    """A stat on the launch that ran its kernel's first run: only there can a slow launch be loading the module."""


XLA_HOST = HostVocabulary(SYNC_EVENT, DISPATCH_EVENT, EXECUTE_EVENT)
_CUDA_LAUNCH = re.compile(
    r"^(cuda|hip|cu)(Ext)?(Module)?LaunchKernel(ExC)?(_v2|_ptsz)?$|^(cuda|hip)LaunchCooperativeKernel\w*$|"
    r"^(cuda|hip|cu)GraphLaunch$"
)
PYTORCH_HOST = HostVocabulary(
    # .item()/.cpu()/print of a tensor wait in aten::_local_scalar_dense or a blocking copy; explicit waits are
    # the runtime's synchronize calls. cudaMemcpyAsync is left out: it blocks only on pageable memory.
    sync=re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^(cuda|hip)Memcpy$|^hipMemcpyWithStream$|"
                    r"^aten::_local_scalar_dense$"),
    dispatch=_CUDA_LAUNCH,
    execute=_CUDA_LAUNCH,
    sync_stat=BLOCKING_COPY_STAT,
    one_launch_on_several_threads=False,
    runtime_call=re.compile(r"^(cuda|hip|cu)[A-Z]\w*$"),
    first_launch_stat=FIRST_LAUNCH_STAT,
)
"""PyTorch eager on CUDA/ROCm (Kineto traces): every kernel is its own launch, every sync a runtime call."""
STEP_STAT = "step_num"
_KERNEL_SUFFIX = re.compile(r"_(\d+)$")


class OpTable:
    """One row per XLA op execution (an HLO instruction run on a device).

    Stored per row: start_ps; end_ps, the op's real end (its `end: <op>` event's end where it has one, XLA:CPU
    async ops); event_end_ps, the end of its own event (before any `end:` pairing); op, the row's index in op_keys
    (the distinct (module, program_id, name) rows, with op_categories beside them); device_code, its index in
    device_labels. name, module, program_id (NO_VALUE when unknown), category (see categorize()) and device
    ("<host> CPU:<ordinal>", "<host> /device:GPU:0") are functions of the codes: columns gathered from them on
    first use and kept, so a table (or a selection of its rows) whose names are never read never holds them.
    """

    STORED = ("start_ps", "end_ps", "event_end_ps", "op", "device_code")
    CODED = ("name", "module", "program_id", "category", "device")
    KEYS = ("op_keys", "op_categories", "device_labels")

    def __init__(self, *, start_ps: np.ndarray, end_ps: np.ndarray, event_end_ps: np.ndarray, op: np.ndarray,
                 device_code: np.ndarray, op_keys: tuple[tuple[str, int, str, str], ...] = (),
                 op_categories: tuple[str, ...] = (), device_labels: tuple[str, ...] = (),
                 _per_code: dict[str, np.ndarray] | None = None):
        self.start_ps, self.end_ps, self.event_end_ps = start_ps, end_ps, event_end_ps
        self.op, self.device_code = op, device_code
        self.op_keys, self.op_categories = tuple(op_keys), tuple(op_categories)
        self.device_labels = tuple(device_labels)
        self._per_code = {} if _per_code is None else _per_code  # a coded column's value per code, shared by selections
        self._columns: dict[str, np.ndarray] = {}

    def _values_per_code(self, name: str) -> np.ndarray:
        if name == "device":
            return np.array(self.device_labels or ("",), dtype=object)
        if name == "category":
            return np.array(self.op_categories or ("",), dtype=object)
        if name == "program_id":
            return np.array([key[1] for key in self.op_keys] or [NO_VALUE], dtype=np.int64)
        index = {"module": 0, "name": 2}[name]
        return np.array([key[index] for key in self.op_keys] or [""], dtype=object)

    def _coded(self, name: str) -> np.ndarray:
        column = self._columns.get(name)
        if column is None:
            if name not in self._per_code:
                self._per_code[name] = self._values_per_code(name)
            codes = self.device_code if name == "device" else self.op
            column = self._columns[name] = self._per_code[name][codes]
        return column

    name = property(lambda self: self._coded("name"))
    module = property(lambda self: self._coded("module"))
    program_id = property(lambda self: self._coded("program_id"))
    category = property(lambda self: self._coded("category"))
    device = property(lambda self: self._coded("device"))

    def __len__(self) -> int:
        return len(self.op)

    @property
    def duration_ps(self) -> np.ndarray:
        return self.end_ps - self.start_ps

    def self_duration_ps(self) -> np.ndarray:
        """Each op's own time: a control-flow op (while, conditional, call: a `fori_loop`, a `scan`) encloses its
        body's ops on the device's line, so its own time is its span less the time of the ops it encloses (those
        ops, and the own time of loops nested in it); every other op's is its duration."""
        durations = self.duration_ps
        containers = np.flatnonzero(self.in_categories(["control_flow"]))
        if not len(containers):
            return durations
        own = durations.copy()
        for device in np.unique(self.device_code[containers]).tolist():
            on_device = self.device_code == device
            loops = containers[self.device_code[containers] == device]
            loops = loops[np.lexsort((-self.end_ps[loops], self.start_ps[loops]))]  # outer before inner at one start
            body = on_device & ~self.in_categories(["control_flow"])
            starts, ends = self.start_ps[loops], self.end_ps[loops]
            enclosed = covered(self.start_ps[body], self.end_ps[body], starts, ends)
            # Innermost first: a loop's own time is known before the loops around it subtract it.
            inner_end = np.searchsorted(starts, ends, side="left")
            for k in range(len(loops) - 1, -1, -1):
                nested = own[loops[k + 1 : inner_end[k]]].sum() if inner_end[k] > k + 1 else 0
                own[loops[k]] = max(int(durations[loops[k]] - enclosed[k] - nested), 0)
        return own

    def take(self, mask: np.ndarray) -> OpTable:
        """The rows of a boolean mask; the table itself where the mask selects every row (nothing writes into
        a table's columns, and on large profiles a copy is hundreds of MB)."""
        if mask.dtype == bool and len(mask) == len(self) and mask.all():
            return self
        return OpTable(**{f: getattr(self, f)[mask] for f in self.STORED}, **self.keys(), _per_code=self._per_code)

    def on_device(self, device: str) -> np.ndarray:
        """The rows on `device`, as a boolean mask: its code compared, not a string per row."""
        if device not in self.device_labels:
            return np.zeros(len(self), dtype=bool)
        return self.device_code == self.device_labels.index(device)

    def in_categories(self, categories: Iterable[str]) -> np.ndarray:
        """The rows whose category is one of `categories`, as a boolean mask: each op's category tested once."""
        wanted = set(categories)
        return np.array([c in wanted for c in self.op_categories], dtype=bool)[self.op] if len(self) else \
            np.zeros(0, dtype=bool)

    def devices(self, mask: np.ndarray | None = None) -> list[str]:
        """The devices the rows (those of `mask`, a boolean mask, where given) are on, sorted."""
        codes = self.device_code if mask is None else self.device_code[mask]
        present = np.flatnonzero(np.bincount(codes, minlength=len(self.device_labels)))
        return sorted(self.device_labels[i] for i in present.tolist())

    def keys(self) -> dict[str, tuple]:
        """What the codes index: op_keys, op_categories, device_labels."""
        return {f: getattr(self, f) for f in self.KEYS}


def empty_op_table() -> OpTable:
    times, codes = np.empty(0, np.int64), np.empty(0, np.int32)
    return OpTable(start_ps=times, end_ps=times, event_end_ps=times, op=codes, device_code=codes)


@dataclass
class EventSelection:
    """Host-thread events whose names match a pattern (XLA op events excluded)."""

    start_ps: np.ndarray
    end_ps: np.ndarray
    line: np.ndarray  # int32: which host thread each event is on (for nesting; see HostEvents.thread_of_line)


class HostEvents:
    """A host's thread lines, queried by event-name pattern.

    Nothing is copied up front: a query matches the pattern once per distinct event name, then
    gathers only the matching events, so memory follows what the analysis asks for rather than
    the profile's size.
    """

    def __init__(self, host: str, lines: list[tuple[Plane, Line]], vocabulary: HostVocabulary = XLA_HOST,
                 release: Callable[[], None] | None = None):
        self.host = host
        self._release = release or (lambda: None)  # after each query: its pages go back (HostProfile.release_pages)
        self.vocabulary = vocabulary
        self._lines = lines
        self._selections: dict[str, EventSelection] = {}
        self._unions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.thread_of_line = _threads_of_lines([line.name for _, line in lines])

    def _non_op(self, line: Line) -> np.ndarray | None:
        """Events that are not XLA ops (None: all of them)."""
        sparse = line.strings.sparse("hlo_op")
        if sparse is None:
            return None
        mask = np.ones(len(line), dtype=bool)
        mask[sparse[0][sparse[1] >= 0]] = False
        return mask

    def _matching(self, pattern: re.Pattern, stat: str | None = None,
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(line number, starts, ends, metadata ids) of each line's non-op events whose names match (or that carry
        `stat`)."""
        ids_by_plane: dict[int, np.ndarray] = {}  # a plane's names are matched once, not once per line (hundreds)
        for number, (plane, line) in enumerate(self._lines):
            ids = ids_by_plane.get(id(plane))
            if ids is None:
                ids = np.array([k for k, n in plane.event_names.items() if pattern.search(n)], dtype=np.int64)
                ids_by_plane[id(plane)] = ids
            marked = line.numeric.sparse(stat) if stat else None
            if not len(ids) and marked is None:
                continue
            mask = isin_ids(line.metadata_id, ids)
            if marked is not None:
                mask[marked[0]] = True
            non_op = self._non_op(line)
            if non_op is not None:
                mask &= non_op
            starts = line.starts.at(mask)
            yield number, starts, starts + line.durations.at(mask), line.metadata_id[mask]
        self._release()

    def select(self, pattern: re.Pattern, stat: str | None = None) -> EventSelection:
        key = pattern.pattern if stat is None else f"{pattern.pattern}\x00{stat}"
        if key in self._selections:
            return self._selections[key]
        starts, ends, lines = [], [], []
        for number, line_starts, line_ends, _ in self._matching(pattern, stat):
            starts.append(line_starts)
            ends.append(line_ends)
            lines.append(np.full(len(line_starts), self.thread_of_line[number], dtype=np.int32))
        empty = np.empty(0, np.int64)
        selection = EventSelection(
            start_ps=np.concatenate(starts) if starts else empty,
            end_ps=np.concatenate(ends) if ends else empty,
            line=np.concatenate(lines) if lines else np.empty(0, np.int32),
        )
        self._selections[key] = selection
        return selection

    def names(self, pattern: re.Pattern, stat: str | None = None) -> np.ndarray:
        """The names of the events `select(pattern, stat)` returns, in the same order."""
        names = []
        for number, _, _, ids in self._matching(pattern, stat):
            unique, inverse = np.unique(ids, return_inverse=True)  # a few distinct names, many events: look up each once
            event_names = self._lines[number][0].event_names
            names.append(np.array([event_names.get(int(i), "") for i in unique], dtype=object)[inverse])
        return np.concatenate(names) if names else np.empty(0, dtype=object)

    def union(self, pattern: re.Pattern) -> tuple[np.ndarray, np.ndarray]:
        """merge_intervals of the matching events, built line by line: each line's events merge on their own
        first (nested calls collapse), so the events are never gathered in one place (the dispatch events of
        the 2 GiB bench profile are 12 million)."""
        if pattern.pattern not in self._unions:
            if pattern.pattern in self._selections:
                selected = self._selections[pattern.pattern]
                merged = merge_intervals(selected.start_ps, selected.end_ps)
            else:
                per_line = [merge_intervals(starts, ends) for _, starts, ends, _ in self._matching(pattern)]
                merged = merge_intervals(
                    np.concatenate([s for s, _ in per_line]) if per_line else np.empty(0, np.int64),
                    np.concatenate([e for _, e in per_line]) if per_line else np.empty(0, np.int64),
                )
            self._unions[pattern.pattern] = merged
        return self._unions[pattern.pattern]

    def issued_until_done(self, pattern: re.Pattern) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) from each issue event matching `pattern` to its completion (`<issue name>=>Done`, the
        first not yet taken after it, in order): what runs in between, e.g. a DMA, has no event of its own."""
        done_names = {n for plane, _ in self._lines for n in plane.event_names.values()
                      if n.endswith(COMPLETION_SUFFIX) and pattern.search(n)}
        starts, ends = [], []
        for done_name in sorted(done_names):
            issued = self.select(re.compile(f"^{re.escape(done_name[:-len(COMPLETION_SUFFIX)])}$"))
            done = self.select(re.compile(f"^{re.escape(done_name)}$"))
            issue_starts = np.sort(issued.start_ps)
            done_ends = np.sort(done.end_ps)
            # FIFO: the k-th issue completes with the k-th completion that ends after it.
            n = min(len(issue_starts), len(done_ends))
            first = int(np.searchsorted(done_ends, issue_starts[0], side="right")) if n else 0
            n = min(len(issue_starts), len(done_ends) - first)
            if n > 0:
                starts.append(issue_starts[:n])
                ends.append(np.maximum(done_ends[first:first + n], issue_starts[:n]))
        empty = np.empty(0, np.int64)
        return (np.concatenate(starts), np.concatenate(ends)) if starts else (empty, empty)

    def step_annotations(self) -> tuple[str, list[tuple[int, int, int]]]:
        """(annotation name, [(step number, start, end)]) from events that carry a step_num stat."""
        name, steps = "", []
        for plane, line in self._lines:
            sparse = line.numeric.sparse(STEP_STAT)
            if sparse is None:
                continue
            index, numbers = sparse
            if not name and len(index):
                name = plane.event_names.get(int(line.metadata_id[index[0]]), "")
            starts = line.starts.at(index)
            ends = starts + line.durations.at(index)
            steps += zip(numbers.tolist(), starts.tolist(), ends.tolist())
        self._release()
        return name, steps


_PYTHON_LINE = re.compile(r"^python[\d.]*$")
_MAIN_THREAD_LINE = re.compile(r"^main/\d+$")


def _threads_of_lines(names: list[str]) -> list[int]:
    """Per host line, the thread it records: its own number, except that the Python tracer's line (`python3`) and
    the runtime's line of the process's main thread (`main/<pid>`) are one thread, the one that runs the program's
    Python, so a call seen on both (PjitFunction on one, its execute on the other) nests as one call. Where there
    are several of either, which pairs up is unknown: each keeps its own."""
    threads = list(range(len(names)))
    python = [i for i, n in enumerate(names) if _PYTHON_LINE.match(n)]
    main = [i for i, n in enumerate(names) if _MAIN_THREAD_LINE.match(n)]
    if len(python) == 1 and len(main) == 1:
        threads[main[0]] = python[0]
    return threads


@dataclass
class Step:
    host: str
    number: int
    start_ps: int
    end_ps: int
    device: str | None = None  # the device whose own timeline this step is on; None: every device of the host

    @property
    def duration_ps(self) -> int:
        return self.end_ps - self.start_ps


def _cached(session: Session, key: str, build):
    if key not in session.cache:
        session.cache[key] = build()
    return session.cache[key]


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint intervals.

    Inputs run to tens of millions of intervals on large profiles: temporaries are freed as soon as done
    and the sort is skipped where the starts are already in order."""
    if len(starts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all()):
        s, running_end = starts, np.array(ends, dtype=np.int64)
    else:
        order = np.argsort(starts, kind="stable")
        s, running_end = starts[order], ends[order].astype(np.int64, copy=False)
        del order
    np.maximum.accumulate(running_end, out=running_end)
    new_segment = np.empty(len(s), dtype=bool)
    new_segment[0] = True
    np.greater(s[1:], running_end[:-1], out=new_segment[1:])
    merged_s = s[new_segment]
    # running_end never decreases, so a segment's end is its value at the segment's last interval.
    last = np.flatnonzero(new_segment)
    last[:-1] = last[1:] - 1
    last[-1] = len(s) - 1
    merged_e = np.maximum(running_end[last], 0)
    return merged_s, merged_e


def union_with(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """merge_intervals of the merged intervals and more: the same union as merging every interval again, at the
    size of the merged ones. The new intervals are merged on their own first (nested host events collapse), so
    tens of millions of them are sorted once, not joined to the rest before."""
    starts, ends = merge_intervals(starts, ends)
    return merge_intervals(np.concatenate([merged[0], starts]), np.concatenate([merged[1], ends]))


def covered(starts: np.ndarray, ends: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """For each window, how much of it the union of the intervals covers (ps)."""
    return covered_by_merged(merge_intervals(starts, ends), win_s, win_e)


def covered_by_merged(merged: tuple[np.ndarray, np.ndarray], win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """covered() of intervals already merged (merge_intervals' answer)."""
    ms, me = merged
    win_s, win_e = np.asarray(win_s, dtype=np.int64), np.asarray(win_e, dtype=np.int64)
    if len(ms) == 0:
        return np.zeros(len(win_s), dtype=np.int64)
    prefix = np.concatenate([[0], np.cumsum(me - ms)])

    def upto(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ms, t, side="right") - 1
        safe = np.clip(idx, 0, None)
        inside = np.minimum(t, me[safe]) - ms[safe]
        return np.where(idx >= 0, prefix[safe] + np.clip(inside, 0, None), 0)

    return upto(win_e) - upto(win_s)


HOST_MEMORY_SPACE = 5
"""XLA's memory space of host memory (`S(5)` in a layout: pinned host buffers, host offload)."""


def _copy_spaces(instruction: HloInstruction, module: HloModule | None) -> set[int]:
    """The memory spaces an async copy reads and writes: a copy-start's result holds (destination, source, context);
    a copy-done's are its copy-start's."""
    if instruction.opcode == "copy-done" and module is not None and instruction.operands:
        found = module.find(instruction.operands[0])
        if found is not None and found[1].opcode == "copy-start":
            instruction = found[1]
    return set(instruction.tuple_memory_spaces[:2])


def _async_copy_category(instruction: HloInstruction, module: HloModule | None) -> str:
    """A copy to or from host memory moves data over the host link (async_copy, a transfer); one between device
    memory and the on-chip memory (e.g. TPU `S(1)`) is the compiler's prefetch, overlapped with compute; one inside
    device memory is data movement. Without memory spaces (files written before they were kept): async_copy."""
    spaces = _copy_spaces(instruction, module)
    if not spaces or HOST_MEMORY_SPACE in spaces:
        return "async_copy"
    return "prefetch" if spaces - {0} else "data_movement"


def categorize(instruction: HloInstruction | None, module: HloModule | None, name: str) -> str:
    """The op's category: matmul, convolution, collective, async_copy (to or from host memory), prefetch (to or
    from on-chip memory), reduction, convert, data_movement, elementwise, custom_call, host_callback (Python
    callbacks and host send/recv), control_flow, memcpy or other."""
    if instruction is None:
        return _category_from_name(name)
    opcode = instruction.opcode
    if instruction.is_host_transfer:
        # send/recv with the host (how a TPU runs a host callback): the device waits for the host, not a peer.
        return "host_callback"
    if opcode in COLLECTIVE_OPCODES:
        return "collective"
    if opcode in ASYNC_COPY_OPCODES:
        return _async_copy_category(instruction, module)
    if opcode == "custom-call":
        target = instruction.custom_call_target.lower()
        if "callback" in target or "callback" in name.lower():
            return "host_callback"
        if is_gemm_call(instruction):
            return "matmul"
        if "conv" in target:
            return "convolution"
        return "custom_call"
    if opcode == "fusion" and module is not None:
        fused = set(module.fused_opcodes.get(instruction.name, [])) - STRUCTURAL_OPCODES
        if fused & COLLECTIVE_OPCODES:
            return "collective"
        if "dot" in fused:
            return "matmul"
        if "convolution" in fused:
            called = module.computations.get(instruction.called[0]) if instruction.called else None
            convolutions = [i for i in called.instructions if i.opcode == "convolution"] if called else []
            # XLA:TPU fuses matrix products as convolutions whose windows never slide: a matmul to the reader.
            return ("matmul" if convolutions and all(c.conv_is_matrix_product for c in convolutions)
                    else "convolution")
        if fused & {"reduce", "reduce-window"}:
            return "reduction"
        if fused and fused <= {"convert"}:
            return "convert"
        if fused and fused <= DATA_MOVEMENT_OPCODES:
            return "data_movement"
        if "custom-call" in fused:
            return "custom_call"
        return "elementwise"
    if opcode == "dot":
        return "matmul"
    if opcode == "convolution":
        return "matmul" if instruction.conv_is_matrix_product else "convolution"
    if opcode in ("reduce", "reduce-window", "sort"):
        return "reduction"
    if opcode == "convert":
        return "convert"
    if opcode in DATA_MOVEMENT_OPCODES:
        return "data_movement"
    if opcode in ("while", "conditional", "call"):
        return "control_flow"
    if opcode in STRUCTURAL_OPCODES:
        return "other"
    return "elementwise"


_ELEMENTWISE_KERNELS = ("eigenmetakernel", "tensorflow::functor::", "elementwise_kernel", "vectorized_elementwise")
"""Kernels a framework launches one op at a time without a compiler (TensorFlow's Eigen kernels, PyTorch eager)."""


_CONVOLUTION_KERNELS = ("cudnn::detail::dgrad", "cudnn::detail::wgrad", "implicit_convolve", "conv2d_grouped_direct",
                        "convolve_sgemm", "_fprop_", "_dgrad_", "_wgrad_", "miopensp3asmconv", "naive_conv")
"""cuDNN/MIOpen convolution kernels (forward, data and weight gradients) as eager frameworks launch them."""
_KERNEL_NAME_CATEGORIES = (
    ("collective", ("all_reduce", "all_gather", "allgather", "reduce_scatter", "alltoall", "all_to_all")),
    ("convolution", _CONVOLUTION_KERNELS + ("scudnn", "winograd", "_alg0_engine", "_alg1_engine")),
    ("reduction", ("reduce_kernel", "bn_fw_", "bn_bw_", "batch_norm", "layer_norm", "rms_norm", "rmsnorm", "softmax",
                   "welford", "triton_red_", "triton_per_")),
    ("data_movement", ("catarraybatchedcopy", "batched_transpose", "nchwtonhwc", "nhwctonchw", "indexselect",
                       "index_select", "gather_kernel", "scatter_kernel")),
    ("elementwise", ("multi_tensor_apply", "triton_poi_")),
    ("matmul", ("nvjet", "fmha", "flash_fwd", "flash_bwd", "flash_attn", "triton_tem_")),
)
"""Kernels an eager framework (PyTorch, its libraries and Inductor's Triton kernels) launches, by what their names
say they do; checked in this order, before the generic rules (a split-K GEMM's reduce is a reduction)."""


def _category_from_name(name: str) -> str:
    base = name.lower().lstrip("%")
    if base.startswith(("memcpy", "memset")):
        return "memcpy"
    if base in ("data formatting", "data movement"):
        return "data_movement"
    if base.startswith(tuple(ASYNC_COPY_OPCODES)):
        return "async_copy"
    if any(base.startswith(op) for op in COLLECTIVE_OPCODES) or "all-reduce" in base or "allreduce" in base or \
            base.startswith(("nccl", "rccl")):  # NCCL/RCCL kernels: ncclDevKernel_AllGather_RING_LL, ncclKernel_…
        return "collective"
    if "callback" in base:
        return "host_callback"
    for category, parts in _KERNEL_NAME_CATEGORIES:
        if any(part in base for part in parts):
            return category
    if base.startswith(("dot", "gemm", "cublas", "cijk_", "bmm_")) or any(k in base for k in ("matmul", "gemm", "xmma", "cutlass", "wgmma")):
        return "matmul"  # cijk_: Tensile/hipBLASLt GEMMs (ROCm); bmm_: cuBLASLt batched GEMMs
    if base.startswith(("convolution", "conv")):
        return "convolution"
    if base.startswith(("reduce", "reduction")):
        return "reduction"
    if base.startswith("convert"):
        return "convert"
    if base.startswith(tuple(DATA_MOVEMENT_OPCODES)):
        return "data_movement"
    if base.startswith("custom-call"):
        return "custom_call"
    if "fusion" in base or any(k in base for k in _ELEMENTWISE_KERNELS):
        return "elementwise"
    return "other"


def _strings_of(plane: Plane, column: np.ndarray) -> np.ndarray:
    table = np.array(plane.strings + [""], dtype=object)
    return table[np.where(column >= 0, column, len(plane.strings))]


def _tpu_op_name(text: str) -> str:
    # TPU 'XLA Ops' events are named by HLO text: "%copy-start.2 = (f32[...]) copy-start(...)".
    if text.startswith("%"):
        return text[1:].split(" ", 1)[0]
    return text


_SKIP_DEVICE_LINES = {"XLA Modules", "Steps", "TensorFlow Ops", "TensorFlow Name Scope", "XLA TraceMe", "Async XLA Ops", "Overlay"}


def module_spans(plane: Plane) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, ends, names) of the plane's 'XLA Modules' line, sorted by start."""
    for line in plane.lines:
        if line.name == "XLA Modules" and len(line):
            names = np.array([_module_name(n) for n in plane.names_of(line)], dtype=object)
            order = np.argsort(line.start_ps, kind="stable")
            return line.start_ps[order], line.end_ps[order], names[order]
    return None


def _module_name(text: str) -> str:
    # 'XLA Modules' events are named "jit_f(12190760917235803885)": the module name and a fingerprint.
    return text.split("(", 1)[0]


def _line_ops(plane: Plane, line: Line, host: str, has_xla_ops_line: bool) -> dict[str, np.ndarray] | None:
    """The XLA op (or GPU kernel) executions one line holds, or None when it holds none."""
    hlo_op = line.strings.get("hlo_op")
    count = len(line)
    gpu: dict[str, np.ndarray] = {}  # GPU kernels: their own names, whether a CUDA graph ran them, their launch
    if plane.is_device:
        if line.name in _SKIP_DEVICE_LINES or not count:
            return None
        if line.name == "XLA Ops":
            display = plane.event_display_names
            lookup = {k: _tpu_op_name(display.get(k) or plane.event_names.get(k, "")) for k in np.unique(line.metadata_id)}
            names = np.array([lookup[k] for k in line.metadata_id], dtype=object)
            modules = np.full(count, "", dtype=object)
            spans = module_spans(plane)
            if spans is not None:
                starts = line.start_ps
                idx = np.searchsorted(spans[0], starts, side="right") - 1
                inside = (idx >= 0) & (starts < spans[1][np.clip(idx, 0, None)])
                modules = np.where(inside, spans[2][np.clip(idx, 0, None)], "")
        elif line.name.startswith("Stream") and not has_xla_ops_line:
            names = kernels = plane.names_of(line)
            in_graph = np.zeros(count, dtype=bool)
            if hlo_op is not None:
                # Kernels run inside a CUDA graph carry the command buffer's name as hlo_op: keep the kernel's.
                op_names = _strings_of(plane, hlo_op)
                ids, inverse = unique_with_inverse(hlo_op)  # each distinct name tested once, not once per kernel
                buffer_ids = [i >= 0 and plane.strings[i].startswith("command_buffer") for i in ids.tolist()]
                in_graph = np.array(buffer_ids, dtype=bool)[inverse]
                names = np.where((hlo_op >= 0) & ~in_graph, op_names, names)
            elif "tf_op" in line.strings:
                names = np.where(line.strings["tf_op"] >= 0, _strings_of(plane, line.strings["tf_op"]), names)
            modules = _strings_of(plane, line.strings["hlo_module"]) if "hlo_module" in line.strings else np.full(count, "", object)
            launch = line.numeric.get("correlation_id")
            gpu = {"kernel": kernels, "in_graph": in_graph,
                   "launch": launch if launch is not None else np.full(count, NO_VALUE, np.int64)}
        else:
            return None
        mask = np.ones(count, dtype=bool)
        labels, device = [f"{host} {plane.name}"], np.zeros(count, np.int32)
    else:
        if hlo_op is None or not (hlo_op >= 0).any():
            return None
        mask = hlo_op >= 0
        names = _strings_of(plane, hlo_op[mask])
        modules = _strings_of(plane, line.strings["hlo_module"][mask]) if "hlo_module" in line.strings else np.full(mask.sum(), "", object)
        ordinal = line.numeric.get("device_ordinal")
        if ordinal is not None:
            # One label per ordinal, shared by its rows (a string per row is ~60 bytes on millions of ops).
            ordinals, device = unique_with_inverse(ordinal[mask])
            labels = [f"{host} CPU:{o}" if o != NO_VALUE else f"{host} CPU" for o in ordinals.tolist()]
        else:
            labels, device = [f"{host} CPU"], np.zeros(mask.sum(), np.int32)
    program = line.numeric.get("program_id")
    ends = line.end_ps_at(mask)
    return {
        "name": names if len(names) == mask.sum() else names[mask],
        "module": modules if len(modules) == mask.sum() else modules[mask],
        "program_id": program[mask] if program is not None else np.full(mask.sum(), NO_VALUE, np.int64),
        "device_code": device,  # an index in device_labels, made the table's own index by op_table
        "device_labels": labels,
        "start_ps": line.starts.at(mask),
        "end_ps": ends,
        "event_end_ps": ends,  # the same array: the flow pairing replaces end_ps, never writes into it
        "flow": line.numeric["_p"][mask] if "_p" in line.numeric else np.full(mask.sum(), NO_VALUE, np.int64),
        **gpu,  # a device line's mask selects every row
    }


def _flow_ends(plane: Plane) -> tuple[np.ndarray, np.ndarray]:
    """Flow ids and end times of the `end: <op>` events that finish async XLA:CPU ops, ordered by (id, end)."""
    ids, ends = [], []
    end_ids = np.array([k for k, n in plane.event_names.items() if n.startswith("end: ")], dtype=np.int64)
    for line in plane.lines:
        consumer = line.numeric.get("_c")
        if consumer is None:
            continue
        mask = isin_ids(line.metadata_id, end_ids) & (consumer != NO_VALUE)
        ids.append(consumer[mask])
        ends.append(line.end_ps_at(mask))
    if not ids:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ids_all, ends_all = np.concatenate(ids), np.concatenate(ends)
    order = np.lexsort((ends_all, ids_all))
    return ids_all[order], ends_all[order]


def _flow_finish(
    flow_ids: np.ndarray, flow_ends: np.ndarray, flow: np.ndarray, start_ps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each op, whether a flow's `end:` event finishes it and when: the first end of its flow id at or after the
    op's start (`flow_ids`, `flow_ends` ordered by id, then end). A flow id is normally unique, but a long capture
    may reuse one (its counter restarting), and pairing with another op's end would stretch an op over seconds."""
    lo, hi = np.searchsorted(flow_ids, flow, "left"), np.searchsorted(flow_ids, flow, "right")
    last = hi.copy()
    # Each op's ends are in time order: bisect every op's range at once until it closes on the first end that is
    # not before the op's start (one round where its id is unique).
    while True:
        open_ = np.flatnonzero(lo < hi)
        if not len(open_):
            break
        mid = (lo[open_] + hi[open_]) // 2
        later = flow_ends[mid] >= start_ps[open_]
        hi[open_[later]] = mid[later]
        lo[open_[~later]] = mid[~later] + 1
    hit = (lo < last) & (flow != NO_VALUE)
    finish = np.where(hit, flow_ends[np.minimum(lo, len(flow_ends) - 1)], 0)
    return hit, finish


def _name_graph_gemms(session: Session, cols: dict[str, np.ndarray]) -> None:
    """Names the library GEMM kernels a CUDA graph ran after the custom calls that launched them.

    Inside a graph a kernel's hlo_op names the command buffer, not its instruction, and a cuBLAS kernel is named
    by the library, not after an instruction as XLA's own kernels are. One graph launch (one correlation id on one
    device) runs its commands in the module's schedule order, so where a launch holds exactly as many such GEMM
    kernels as the module has GEMM custom calls, the k-th kernel is the k-th call. Launches that hold another
    number stay unnamed (their FLOPs unknown)."""
    candidates = np.flatnonzero(cols["in_graph"] & (cols["launch"] != NO_VALUE))
    if not len(candidates):
        return
    groups: dict[tuple, list[int]] = {}
    for row, key in zip(candidates.tolist(), zip(cols["device_code"][candidates].tolist(),
                                                  cols["module"][candidates].tolist(),
                                                  cols["program_id"][candidates].tolist(),
                                                  cols["launch"][candidates].tolist())):
        groups.setdefault(key, []).append(row)
    calls: dict[tuple[str, int], tuple[HloModule | None, list[str]]] = {}
    library_gemm: dict[tuple[str, int, str], bool] = {}
    for (_, module_name, pid, _), rows in groups.items():
        if (module_name, pid) not in calls:
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            calls[(module_name, pid)] = module, [i.name for i in module.entry_computation.instructions
                                                 if is_gemm_call(i)] if module is not None else []
        module, scheduled = calls[(module_name, pid)]
        if not scheduled:
            continue
        gemm_rows = []
        for row in rows:
            kernel = cols["kernel"][row]
            if (module_name, pid, kernel) not in library_gemm:
                named = module.find(kernel) or module.find(_KERNEL_SUFFIX.sub(r".\1", kernel))
                library_gemm[(module_name, pid, kernel)] = named is None and _category_from_name(kernel) == "matmul"
            if library_gemm[(module_name, pid, kernel)]:
                gemm_rows.append(row)
        if len(gemm_rows) == len(scheduled):
            ordered = np.array(gemm_rows)[np.argsort(cols["start_ps"][gemm_rows], kind="stable")]
            cols["name"][ordered] = scheduled


def op_table(session: Session) -> OpTable:
    """Every XLA op execution in the session, with its real end and its category."""

    def build() -> OpTable:
        parts: list[dict[str, np.ndarray]] = []
        # With device planes, XLA ops are the device's events; host threads only launch them.
        use_devices = bool(session.device_planes(with_events=True))
        for host in session.hosts:
            for plane in host.planes:
                if plane.is_device != use_devices or not (plane.is_device or plane.name == "/host:CPU"):
                    continue
                flow_ids, flow_ends = _flow_ends(plane) if not plane.is_device else (np.empty(0, np.int64),) * 2
                has_xla_ops_line = any(line.name == "XLA Ops" and len(line) for line in plane.lines)
                for line in plane.lines:
                    ops = _line_ops(plane, line, host.hostname, has_xla_ops_line)
                    if ops is None:
                        continue
                    if len(flow_ids):
                        hit, finish = _flow_finish(flow_ids, flow_ends, ops["flow"], ops["start_ps"])
                        ops["end_ps"] = np.where(hit, np.maximum(ops["end_ps"], finish), ops["end_ps"])
                    parts.append(ops)
            host.release_pages()  # its rows are taken: a many-host session holds one host's columns at a time
        if not parts:
            return empty_op_table()
        devices: dict[str, int] = {}  # label -> the table's device code, in first-seen order
        for part in parts:
            codes = [devices.setdefault(label, len(devices)) for label in part.pop("device_labels")]
            part["device_code"] = np.array(codes, np.int32)[part["device_code"]]
        if any("kernel" in p for p in parts):
            for part in parts:
                size = len(part["name"])
                part.setdefault("kernel", np.full(size, "", object))
                part.setdefault("in_graph", np.zeros(size, dtype=bool))
                part.setdefault("launch", np.full(size, NO_VALUE, np.int64))
        cols = {k: np.concatenate([p.pop(k) for p in parts]) for k in list(parts[0]) if k != "flow"}
        del parts
        kernel_columns = ()
        if "kernel" in cols:
            _name_graph_gemms(session, cols)
            del cols["in_graph"], cols["launch"]
            kernel_columns = (cols.pop("kernel"),)
        # Resolve each distinct (op, module, program[, kernel]) once; a row keeps only its index among them.
        distinct, inverse = factorize_rows(cols.pop("name"), cols.pop("module"), cols.pop("program_id"), *kernel_columns)
        resolved_names = np.empty(len(distinct), dtype=object)
        resolved_categories = np.empty(len(distinct), dtype=object)
        for k, (name, module_name, pid, *_) in enumerate(distinct):
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            hlo_name = name
            found = module.find(name) if module else None
            if found is None and module is not None:
                # GPU kernels are named after their HLO instruction with '.N' written '_N'.
                hlo_name = _KERNEL_SUFFIX.sub(r".\1", name)
                found = module.find(hlo_name)
                hlo_name = hlo_name if found else name
            resolved_names[k] = hlo_name
            resolved_categories[k] = categorize(found[1] if found else None, module, name)
        cols["op"] = inverse.astype(np.int32)  # so per-op sums need not factorise millions of rows again
        op_keys = tuple((module_name, int(pid), resolved_names[k], kernel[0] if kernel else "")
                        for k, (_, module_name, pid, *kernel) in enumerate(distinct))
        del inverse
        order = np.argsort(cols["start_ps"], kind="stable")
        # In time order, one column at a time: the unordered column goes as soon as its ordered copy exists.
        return OpTable(**{f: cols.pop(f)[order] for f in OpTable.STORED}, op_keys=op_keys,
                       op_categories=tuple(resolved_categories.tolist()), device_labels=tuple(devices))

    return _cached(session, "op_table", build)


def device_op_counts(session: Session) -> dict[str, int]:
    """Device label -> its op executions, for every device with one, sorted by label; cached (a session assembled
    from host summaries carries it: xdiag.analysis.host_summary)."""

    def build() -> dict[str, int]:
        ops = op_table(session)
        counts = np.bincount(ops.device_code, minlength=len(ops.device_labels)).tolist() if len(ops) else []
        return {label: count for label, count in sorted(zip(ops.device_labels, counts)) if count}

    return _cached(session, "device_op_counts", build)


def callback_call_ops(session: Session) -> np.ndarray:
    """Per op code (an index in op_table's op_keys): whether the op begins a host callback call. A TPU runs one
    callback as a chain of host send/recv ops (send, send-done, recv, recv-done, each reading the one before):
    only the chain's first op begins the call; every other callback op (e.g. a custom-call callback) is one call."""

    def build() -> np.ndarray:
        ops = op_table(session)
        begins = np.zeros(len(ops.op_keys), dtype=bool)
        for code, ((module_name, pid, name, *_), category) in enumerate(zip(ops.op_keys, ops.op_categories)):
            if category != "host_callback":
                continue
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            found = module.find(name) if module else None
            if found is None or not found[1].is_host_transfer:
                begins[code] = True
                continue
            computation, instruction = found
            begins[code] = not any(computation.by_name[o].is_host_transfer
                                   for o in instruction.operands if o in computation.by_name)
        return begins

    return _cached(session, "callback_call_ops", build)


def profile_op_costs(session: Session) -> dict[tuple[str, str], dict]:
    """(module, op) -> the cost the profiler recorded for it: FLOPs, bytes accessed, category, shape.

    TPU (and newer GPU) 'XLA Ops' lines carry XLA's own cost model in their event metadata; where it
    exists it is more exact than counting from HLO shapes.
    """

    def build() -> dict[tuple[str, str], dict]:
        costs: dict[tuple[str, str], dict] = {}
        for plane in session.host_by_host(session.device_planes(with_events=True)):
            spans = module_spans(plane)
            fingerprints = {}
            if spans is not None:
                for line in plane.lines:
                    if line.name == "XLA Modules":
                        for name in set(plane.names_of(line)):
                            module, _, rest = name.partition("(")
                            if rest.rstrip(")").isdigit():
                                fingerprints[int(rest.rstrip(")"))] = module
            for line in plane.lines:
                if line.name != "XLA Ops":
                    continue
                for key in np.unique(line.metadata_id).tolist():
                    stats = plane.event_metadata_stats.get(key) or {}
                    if "flops" not in stats and "bytes_accessed" not in stats:
                        continue
                    op = _tpu_op_name(plane.event_display_names.get(key) or plane.event_names.get(key, ""))
                    module = fingerprints.get(stats.get("program_id"), "")
                    costs.setdefault((module, op), {
                        "flops": float(stats.get("flops") or 0),
                        "bytes": float(stats.get("bytes_accessed") or 0),
                        "hlo_category": stats.get("hlo_category", ""),
                        "shape": stats.get("shape_with_layout", ""),
                        "source": str(stats.get("source", "")),
                    })
        return costs

    return _cached(session, "profile_op_costs", build)


def host_events(session: Session) -> list[HostEvents]:
    """Per host: its /host:CPU thread lines, to query for dispatch, compile, sync and step events."""

    def build() -> list[HostEvents]:
        out = []
        for host in session.hosts:
            planes = [plane for plane in host.planes if plane.name == "/host:CPU"]
            vocabulary = PYTORCH_HOST if any(p.stats.get(FORMAT_STAT) == KINETO for p in planes) else XLA_HOST
            out.append(HostEvents(host.hostname, [(plane, line) for plane in planes for line in plane.lines], vocabulary,
                                  host.release_pages))
        return out

    return _cached(session, "host_events", build)


@dataclass
class StepSet:
    steps: list[Step]
    source: str  # how steps were found: step annotations, device Steps line, module executions, op period, whole window
    annotation: str  # the annotation or module name that marks a step
    sources: dict[str, str] = field(default_factory=dict)  # device -> how its own steps were found (device steps only)
    transfer_only: list[str] = field(default_factory=list)  # devices that only copied data: not compute timelines
    markers: dict[str, str] = field(default_factory=dict)  # device -> what marks its own steps (device steps only)


MIN_PERIOD_MATCH = 0.9
"""Share of ops that must repeat one period later for an op sequence to count as a repeating step."""
CLEAR_PERIOD_MATCH = 0.99
"""A multiple of the period that repeats this exactly is the step (layers repeat inside a step, steps repeat whole)."""
_MAX_PERIOD_OPS = 50_000  # ops looked at to find the period; the period then applies to the whole device timeline
_MAX_PERIOD_CANDIDATES = 64


def repeating_period(tokens: np.ndarray) -> tuple[int, float] | None:
    """(period, match) of the smallest repeating unit of a token sequence seen at least twice, else None.

    Candidate periods are the distances between successive occurrences of one token; a candidate holds when
    at least MIN_PERIOD_MATCH of the tokens equal the token one period later (captures start and stop inside
    a step, and a step's data-dependent parts may differ).
    """
    codes = np.unique(np.asarray(tokens[:_MAX_PERIOD_OPS]), return_inverse=True)[1]
    n = len(codes)
    if n < 4:
        return None
    order = np.lexsort((np.arange(n), codes))
    same = codes[order][1:] == codes[order][:-1]
    distances = (order[1:] - order[:-1])[same]
    distances = distances[(distances >= 1) & (distances <= n // 2)]
    if not len(distances):
        return None
    values, counts = np.unique(distances, return_counts=True)
    candidates = np.sort(values[np.argsort(-counts, kind="stable")[:_MAX_PERIOD_CANDIDATES]])
    match = {int(p): float(np.mean(codes[:-p] == codes[p:])) for p in candidates}
    held = [p for p in match if match[p] >= MIN_PERIOD_MATCH]
    if not held:
        return None
    period = held[0]
    if match[period] < CLEAR_PERIOD_MATCH:
        clearer = [p for p in held if p % period == 0 and match[p] >= CLEAR_PERIOD_MATCH]
        period = clearer[0] if clearer else period
    return period, round(match[period], 3)


def _device_of(plane: Plane) -> str:
    return f"{plane.host} {plane.name}"


def transfer_only_devices(session: Session) -> list[str]:
    """Devices whose every op only copies data (H2D/D2H memcpy, async copies): not compute timelines."""

    def build() -> list[str]:
        ops = op_table(session)
        moving = ops.in_categories(TRANSFER_OP_CATEGORIES)
        return sorted(set(ops.devices()) - set(ops.devices(~moving)))

    return _cached(session, "transfer_only_devices", build)


def _windows_from_starts(host: str, device: str, starts: np.ndarray, last_end: int) -> list[Step]:
    """Steps from one start to the next (the gaps between them are idle time in the step); the last ends at `last_end`."""
    ends = np.append(starts[1:], last_end)
    return [Step(host, i, int(a), int(b), device) for i, (a, b) in enumerate(zip(starts, ends)) if b > a]


def _device_steps_lines(session: Session) -> dict[str, list[Step]]:
    """Device -> steps from that device's own `Steps` line (each device runs its step at its own time)."""
    out: dict[str, list[Step]] = {}
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            if line.name == "Steps" and len(line):
                names = plane.names_of(line)
                device = _device_of(plane)
                starts, ends = line.start_ps.tolist(), line.end_ps.tolist()
                out[device] = [
                    Step(plane.host, int(n) if str(n).isdigit() else i, starts[i], ends[i], device)
                    for i, n in enumerate(names)
                ]
                break
    return out


def _module_line_steps(plane: Plane) -> tuple[list[Step], str] | None:
    """Executions of the plane's busiest module on its `XLA Modules` line, each from its start to the next's."""
    spans = module_spans(plane)
    if spans is None or len(spans[0]) < 2:
        return None
    starts, ends, names = spans
    uniq, inverse = np.unique(names, return_inverse=True)
    main = uniq[int(np.argmax(np.bincount(inverse, weights=(ends - starts).astype(float))))]
    mask = names == main
    if mask.sum() < 2:
        return None
    return _windows_from_starts(plane.host, _device_of(plane), starts[mask], int(ends[mask].max())), str(main)


def _op_sequence_steps(ops: OpTable, device: str) -> tuple[list[Step], str]:
    """A device without step markers: the repeating unit of its op sequence as the step, from the first op of one
    repetition to the first of the next. First the sequence of ops (program and op name); else the sequence of
    program launches (runs of ops of one program), which repeats even where a program's kernels vary; else the
    device's whole window as one step."""
    mask = ops.on_device(device)
    starts, ends = ops.start_ps[mask], ops.end_ps[mask]
    host = device.split(" ", 1)[0]
    gaps = np.concatenate([[0], starts[1:] - np.maximum.accumulate(ends)[:-1]])
    # A program is its module and compiled version: jit_dot for two shapes is two programs, not a repetition.
    programs = np.array([f"{m}\x00{p}" for m, p in zip(ops.module[mask], ops.program_id[mask])], dtype=object)
    launch_starts = np.flatnonzero(np.concatenate([[True], programs[1:] != programs[:-1]]))
    for unit, positions, tokens in (
        ("ops", np.arange(len(starts)), np.array([f"{p}\x00{n}" for p, n in zip(programs, ops.name[mask])], dtype=object)),
        ("program launches", launch_starts, programs[launch_starts]),
    ):
        found = repeating_period(tokens)
        if found is None:
            continue
        period, match = found
        first = _unit_starts(positions, gaps, period)
        if len(first) >= 2:
            steps = _windows_from_starts(host, device, starts[first], int(ends[first[-1]:].max()))
            return steps, f"repeating op sequence ({period} {unit} per step, {round(100 * match)}% repeat)"
    return [Step(host, 0, int(starts.min()), int(ends.max()), device)], NO_REPEATING_STEP


def _unit_starts(positions: np.ndarray, gaps: np.ndarray, period: int) -> np.ndarray:
    """The positions that begin a repeating unit of `period` items: a step begins after the longest pause, the
    phase of the period preceded by the largest mean gap (`gaps`: idle time before each item)."""
    phase_gap = np.bincount(np.arange(len(positions)) % period, weights=gaps[positions].astype(float), minlength=period)
    return positions[np.arange(int(np.argmax(phase_gap[:period])), len(positions), period)]


def _program_sequence_steps(plane: Plane, line_steps: list[Step]) -> tuple[list[Step], str] | None:
    """Where the device's `Steps` line marks every program execution as a step but an iteration runs several
    programs (a host loop that converts, normalises and trains in separate jitted calls): the repeating unit of
    the whole program sequence, from its first program's start to the next unit's. None where the Steps line
    marks fewer steps than programs ran, or the sequence repeats program by program."""
    spans = module_spans(plane)
    if spans is None or len(line_steps) < len(spans[0]):
        return None
    starts, ends, names = spans
    found = repeating_period(names)
    if found is None or found[0] < 2:
        return None
    period, match = found
    gaps = np.concatenate([[0], starts[1:] - np.maximum.accumulate(ends)[:-1]])
    first = _unit_starts(np.arange(len(starts)), gaps, period)
    if len(first) < 2:
        return None
    steps = _windows_from_starts(plane.host, _device_of(plane), starts[first], int(ends[first[-1]:].max()))
    # The last unit has no next one to end it: without the host work that follows each unit it is a partial step.
    if len(steps) >= 3 and steps[-1].duration_ps < 0.5 * np.median([s.duration_ps for s in steps[:-1]]):
        steps = steps[:-1]
    return steps, f"repeating program sequence ({period} programs per step, {round(100 * match)}% repeat)"


NO_REPEATING_STEP = "no repeating step: the capture window as one step"
_JITTED_MODULE = re.compile(r"^(jit|pmap)_(.+)$")


def _host_launch_steps(session: Session, ops: OpTable, device: str) -> list[Step] | None:
    """Steps from the host's launches of the device's busiest program (`PjitFunction(f)` for module `jit_f`, one
    compiled version), from one launch to the next: the repeated unit where the device's op sequence does not
    repeat exactly (threads interleave, data-dependent ops)."""
    mask = ops.on_device(device)
    modules, inverse = np.unique(ops.module[mask], return_inverse=True)
    busiest = str(modules[int(np.argmax(np.bincount(inverse, weights=ops.duration_ps[mask].astype(float))))])
    named = _JITTED_MODULE.match(busiest)
    host = device.split(" ", 1)[0]
    events = next((e for e in host_events(session) if e.host == host), None)
    if named is None or events is None or len(np.unique(ops.program_id[mask][ops.module[mask] == busiest])) != 1:
        return None  # one function compiled for several shapes: its launches are different programs
    kind = "PjitFunction" if named.group(1) == "jit" else "PmapFunction"
    launches = events.select(re.compile(rf"^{kind}\({re.escape(named.group(2))}\)$"))
    order = np.argsort(launches.start_ps, kind="stable")
    starts, ends = launches.start_ps[order], launches.end_ps[order]
    outer = np.ones(len(starts), dtype=bool)  # a launch nested in another (a jitted call inside one) is one launch
    outer[1:] = starts[1:] >= np.maximum.accumulate(ends)[:-1]
    starts = starts[outer]
    if len(starts) < 2:
        return None
    steps = _windows_from_starts(host, device, starts, int(ops.end_ps[mask].max()))
    # The last launch has no next one to end its step; where its window is far shorter than the others', the
    # host work that precedes each launch is missing from it: a partial step, left out.
    if len(steps) >= 3 and steps[-1].duration_ps < 0.5 * np.median([s.duration_ps for s in steps[:-1]]):
        steps = steps[:-1]
    return steps


def step_set(session: Session) -> StepSet:
    """The session's steps. Step annotations (host-wide) first; else each device's own timeline: its `Steps`
    line, else its `XLA Modules` executions, else the period of its op sequence, else its whole window.
    One device's windows are never applied to another; devices that only copied data get no steps."""

    def build() -> StepSet:
        steps: list[Step] = []
        annotation = ""
        for events in host_events(session):
            name, marked = events.step_annotations()
            annotation = annotation or name
            steps += [Step(events.host, number, start, end) for number, start, end in marked]
        if steps:
            return StepSet(sorted(steps, key=lambda s: (s.host, s.start_ps)), "step annotations", annotation)
        ops = op_table(session)
        moving_only = transfer_only_devices(session)
        by_line = _device_steps_lines(session)
        sources: dict[str, str] = {}
        markers: dict[str, str] = {}
        planes = {_device_of(p): p for p in session.device_planes(with_events=True)}
        for device in sorted(set(ops.devices()) - set(moving_only)):
            if device in by_line:
                grouped = _program_sequence_steps(planes[device], by_line[device]) if device in planes else None
                if grouped is not None:
                    steps += grouped[0]
                    sources[device], markers[device] = grouped[1], "XLA Modules"
                    continue
                steps += by_line[device]
                sources[device], markers[device] = "device Steps line", "Steps"
                continue
            executions = _module_line_steps(planes[device]) if device in planes else None
            if executions is not None:
                steps += executions[0]
                sources[device] = "executions of the busiest XLA module, start to start (device XLA Modules line)"
                markers[device] = executions[1]
                continue
            found, sources[device] = _op_sequence_steps(ops, device)
            if sources[device] == NO_REPEATING_STEP:
                launches = _host_launch_steps(session, ops, device)
                if launches is not None:
                    found, markers[device] = launches, "host launches"
                    sources[device] = "host launches of the busiest program, start to start"
            steps += found
        if not steps:
            bounds = _profile_bounds(session)
            host = session.hosts[0].hostname if session.hosts else ""
            return StepSet([Step(host, 0, bounds[0], bounds[1])] if bounds[1] > bounds[0] else [], "whole profile", "")
        common = max(set(sources.values()), key=list(sources.values()).count)
        marker = next((markers[d] for d in sources if sources[d] == common and d in markers), "")
        return StepSet(steps, common, marker, sources, moving_only, markers)

    return _cached(session, "step_set", build)


def _profile_bounds(session: Session) -> tuple[int, int]:
    lo, hi = None, None
    for host in session.hosts:
        for plane in host.planes:
            for line in plane.lines:
                if len(line):
                    s, e = int(line.start_ps.min()), int(line.end_ps.max())
                    lo = s if lo is None else min(lo, s)
                    hi = e if hi is None else max(hi, e)
        host.release_pages()
    return (lo or 0, hi or 0)


def profile_window_ps(session: Session) -> tuple[int, int]:
    return _cached(session, "bounds", lambda: _profile_bounds(session))
