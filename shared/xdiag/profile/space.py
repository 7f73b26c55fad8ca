"""The compact, read-once representation of a profile session that every tool reads.

A session is one capture: one XSpace file per host. Events are kept per line as numpy
columns (start, duration, name id and the handful of stats the analyses use), never as
protobuf objects, so memory stays a small multiple of the file size.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from xdiag.text_numbers import whole_number

NO_VALUE = np.iinfo(np.int64).min
"""Sentinel in numeric stat columns for events that do not carry the stat."""

NUMERIC_STATS = (
    "step_num",
    "group_id",
    "program_id",
    "_p",
    "_c",
    "device_ordinal",
    "correlation_id",
    "bytes_allocated",
    "bytes_reserved",
    "peak_bytes_in_use",
    "requested_bytes",
    "allocation_bytes",
    "device_offset_ps",
    "device_duration_ps",
    "flops",
    "bytes_accessed",
    "model_flops",
)
"""Stats kept as int64 columns (doubles are rounded)."""

STRING_STATS = ("hlo_op", "hlo_module", "tf_op", "kernel_details", "memcpy_details", "step_name", "hlo_category", "tf_op_type")
"""Stats kept as indexes into the plane's string table."""


class StatColumns:
    """Per-event stat columns of one line, stored sparse (most stats are on few events) and handed out dense.

    `columns[name]` / `.get(name)` build a dense array (fill value where the event lacks the stat) on each
    call and keep nothing, so memory grows with the stats a profile has, not with events × stats.
    """

    def __init__(self, size: int, fill: int, dtype):
        self._size, self._fill, self._dtype = size, fill, dtype
        self._sparse: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def put(self, name: str, index: np.ndarray, values: np.ndarray) -> None:
        self._sparse[name] = (index, values.astype(self._dtype, copy=False))

    def sparse(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(event indexes, values) of the events that carry the stat, or None."""
        return self._sparse.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._sparse

    def __getitem__(self, name: str) -> np.ndarray:
        index, values = self._sparse[name]
        dense = np.full(self._size, self._fill, dtype=self._dtype)
        dense[index] = values
        return dense

    def get(self, name: str, default=None):
        return self[name] if name in self._sparse else default

    def keys(self):
        return self._sparse.keys()

    def items(self):
        return ((name, self[name]) for name in self._sparse)


class TimeColumn:
    """One line's event times (starts or durations) in ps, kept as narrowly as they fit exactly:
    `values * scale + base`.

    Most of a profile's memory is these columns. CPU profiles record whole nanoseconds and a line's times
    span seconds, so relative to the line's least time and in ns they fit in 4 bytes instead of 8; where
    they do not (sub-ns device times over more than 4.3 ms, spans over 4.3 s) they stay int64 ps.
    `ps()` hands out int64 ps, a new array unless the column is stored wide.
    """

    __slots__ = ("values", "scale", "base")

    def __init__(self, values: np.ndarray, scale: int = 1, base: int = 0):
        self.values, self.scale, self.base = values, scale, base

    @classmethod
    def pack(cls, ps: np.ndarray) -> TimeColumn:
        """The narrowest exact form of int64 ps times; may reuse (and overwrite) `ps`."""
        if not len(ps):
            return cls(ps.astype(np.int64, copy=False))
        base = int(ps.min())
        span = int(ps.max()) - base
        if span >= 2**32 * 1000:
            return cls(ps.astype(np.int64, copy=False))
        ps -= base
        # In float64 both the ps (< 2**42) and, where they are whole ns, their quotients are exact; a time that is
        # not a whole ns leaves a fraction of at least 0.001, far above float64's spacing at 2**32. Dividing this
        # way is several times cheaper than integer division and remainder over a large profile's columns.
        ns = ps / 1000.0
        if (ns == np.trunc(ns)).all():
            # float64 -> int32 converts several times faster than -> uint32: shift into int32's range and back.
            ns -= 2**31
            values = ns.astype(np.int32).view(np.uint32)
            values ^= np.uint32(2**31)
            return cls(values, 1000, base)
        del ns
        if span < 2**32:
            return cls(ps.astype(np.uint32), 1, base)
        ps += base
        return cls(ps)

    @property
    def is_wide(self) -> bool:
        return self.values.dtype == np.int64 and self.scale == 1 and self.base == 0

    def ps(self) -> np.ndarray:
        if self.is_wide:
            return self.values
        out = self.values.astype(np.int64)
        if self.scale != 1:
            out *= self.scale
        if self.base:
            out += self.base
        return out

    def at(self, index: np.ndarray) -> np.ndarray:
        """ps()[index] (positions or a boolean mask) without building the whole column."""
        out = self.values[index].astype(np.int64, copy=False)
        if self.scale != 1:
            out *= self.scale
        if self.base:
            out += self.base
        return out

    def least(self) -> int:
        """The earliest time (0 where there is none), as a Python int: no sum with it wraps."""
        return int(self.values.min()) * self.scale + self.base if len(self.values) else 0

    def most(self) -> int:
        """The latest time (0 where there is none), as a Python int."""
        return int(self.values.max()) * self.scale + self.base if len(self.values) else 0

    def shift(self, ps: int) -> None:
        """Adds `ps` to every time: in the base where there is one, else in place (into a copy where the values are
        a read-only map's)."""
        if self.is_wide:
            if self.values.flags.writeable:
                self.values += ps
            elif ps:
                self.values = self.values + ps
        else:
            self.base += ps

    def __len__(self) -> int:
        return len(self.values)


class Line:
    """One timeline (a thread, a stream, 'XLA Ops'…) and its events as columns.

    `start_ps`, `duration_ps` and `end_ps` are int64 ps built from the packed `starts` and `durations` on
    each access (see TimeColumn): take them once per use, not once per event; `starts.at(index)`,
    `durations.at(index)` and `end_ps_at(index)` build only the events asked for.
    """

    def __init__(
        self, id: int, name: str, display_name: str, timestamp_ns: int, metadata_id: np.ndarray,
        starts: TimeColumn, durations: TimeColumn, numeric: StatColumns, strings: StatColumns,
    ):
        self.id, self.name, self.display_name, self.timestamp_ns = id, name, display_name, timestamp_ns
        self.metadata_id = metadata_id  # key into Plane.event_names: the narrowest unsigned type holding the ids
        self.starts = starts  # relative to timestamp_ns as read; relative to Session.origin_ns once assembled
        self.durations = durations
        self.numeric = numeric  # stat -> int64 column, NO_VALUE where absent
        self.strings = strings  # stat -> int32 column into Plane.strings, -1 where absent

    def __len__(self) -> int:
        return len(self.metadata_id)

    @property
    def start_ps(self) -> np.ndarray:
        return self.starts.ps()

    @property
    def duration_ps(self) -> np.ndarray:
        return self.durations.ps()

    def end_ps_at(self, index: np.ndarray) -> np.ndarray:
        """end_ps[index] (positions or a boolean mask) without building the whole columns."""
        ends = self.starts.at(index)
        ends += self.durations.at(index)
        return ends

    @property
    def end_ps(self) -> np.ndarray:
        ends = self.starts.ps()
        if not self.starts.is_wide:
            ends += self.durations.ps()
            return ends
        return ends + self.durations.ps()


@dataclass
class Plane:
    """One XPlane: `/host:CPU`, `/device:GPU:0`, `/host:metadata`, `Task Environment`…"""

    id: int
    name: str
    host: str
    event_names: dict[int, str]
    event_display_names: dict[int, str]
    event_metadata_stats: dict[int, dict[str, object]]
    stats: dict[str, object]
    strings: list[str]
    lines: list[Line]

    @property
    def is_device(self) -> bool:
        return self.name.startswith("/device:")

    @property
    def event_count(self) -> int:
        return sum(len(line) for line in self.lines)

    def string(self, index: int) -> str | None:
        return self.strings[index] if index >= 0 else None

    def names_of(self, line: Line) -> np.ndarray:
        """Event names of a line as an object array (built on demand; not cached)."""
        lookup = np.array([""], dtype=object)
        if self.event_names:
            top = max(self.event_names)
            lookup = np.empty(top + 1, dtype=object)
            lookup[:] = ""
            for key, name in self.event_names.items():
                if key >= 0:
                    lookup[key] = name
        ids = np.clip(line.metadata_id, 0, len(lookup) - 1)
        return lookup[ids]


@dataclass
class HloInstruction:
    name: str
    opcode: str
    dtype: str
    dims: tuple[int, ...]
    layout: tuple[int, ...]  # minor_to_major
    operands: tuple[str, ...]
    fusion_kind: str
    op_name: str  # framework op path from OpMetadata
    source: str  # "file:line" from OpMetadata, "" when absent
    called: tuple[str, ...]  # names of called computations
    tuple_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    custom_call_target: str = ""
    lhs_contracting: tuple[int, ...] = ()  # dot, and GEMM custom calls (from their backend config)
    lhs_batch: tuple[int, ...] = ()  # dot, and GEMM custom calls
    conv_kernel_dims: tuple[int, ...] = ()  # convolutions: the kernel's input-feature dimension, then its spatial ones
    kernel_cost_estimate: tuple[float, ...] = ()  # custom kernels (Pallas): (FLOPs, bytes) their author estimated
    fusion_backend_kind: str = ""  # custom fusions: what emits them (`__triton`, `__ynn_fusion`, …), from the backend config
    memory_space: int = 0  # of an array value's layout: 0 the device's memory; others (TPU host memory: 5) not
    tuple_memory_spaces: tuple[int, ...] = ()  # of a tuple value: each element's memory space (copy-start: dest, src)
    is_host_transfer: bool = False  # a send/recv (and its done) that moves data to or from the host, not a device
    operand_precision: tuple[int, ...] = ()  # dot/convolution: per operand, 0 DEFAULT, 1 HIGH, 2 HIGHEST
    attention_scores: tuple[int, ...] = ()  # fused attention custom calls (cuDNN): the score matrix's dims [B,H,Sq,Sk]
    attention_causal: bool = False  # ... and whether its mask is causal (flash kernels skip the masked half)
    conv_is_matrix_product: bool = False  # a convolution whose windows never slide (XLA:TPU's fused matmuls)
    conv_output_spatial: tuple[int, ...] = ()  # a convolution's output positions along each spatial dimension
    kernel_position_mask: bool = False  # a Mosaic (Pallas TPU) kernel whose body builds index iotas: a positional mask
    stack_frame_id: int = 0  # its innermost Python frame in the module's stack_frames (1-based), 0 where none is recorded
    trip_count: int = 0  # a while loop: how many times it runs its body, read from the loop (hlo_module); 0 unknown
    parameter_number: int = -1  # a parameter: its position in the computation's parameters (a fusion's operands)
    tuple_index: int = -1  # a get-tuple-element: the element it reads
    comparison: str = ""  # a compare: its direction (EQ, NE, LT, LE, GT, GE)
    dimensions: tuple[int, ...] = ()  # the dimensions a sort, reduce, broadcast or transpose works along
    indices_are_sorted: bool = False  # a scatter or gather: the program promised its indices are sorted
    integer_value: int | None = None  # a scalar integer constant: its value (a mask's offset from an iota)

    @property
    def shape_text(self) -> str:
        if self.dtype == "tuple":
            return "(" + ", ".join(f"{t}[{','.join(map(str, d))}]" for t, d in self.tuple_shapes) + ")"
        layout = "{" + ",".join(map(str, self.layout)) + "}" if self.layout else ""
        return f"{self.dtype}[{','.join(map(str, self.dims))}]{layout}"


@dataclass
class HloComputation:
    name: str
    instructions: list[HloInstruction]
    root: str = ""  # the instruction whose value the computation returns; "" where the profile does not say

    @cached_property
    def by_name(self) -> dict[str, HloInstruction]:
        return {i.name: i for i in self.instructions}

    @cached_property
    def position(self) -> dict[int, int]:
        """Each instruction's index in `instructions`, by its id(): to put instructions found by name back in order."""
        return {id(instruction): k for k, instruction in enumerate(self.instructions)}

    @cached_property
    def users(self) -> dict[str, list[HloInstruction]]:
        """For each instruction: the instructions of this computation that read its value."""
        out: dict[str, list[HloInstruction]] = {}
        for instruction in self.instructions:
            for operand in dict.fromkeys(instruction.operands):
                out.setdefault(operand, []).append(instruction)
        return out


@dataclass
class HloModule:
    """An HLO module the profile carries (from the `/host:metadata` plane)."""

    name: str
    program_id: int
    entry: str
    computations: dict[str, HloComputation]
    host: str
    donated_parameters: frozenset[str] = frozenset()  # entry parameters whose buffers the outputs reuse (donated)
    stack_frames: tuple[tuple[str, int, str, int], ...] = ()
    """The Python frames its ops were traced from (HloModuleProto.stack_frame_index), each (file, line, function,
    caller's frame id), ids 1-based as the instructions' stack_frame_id."""

    def stack(self, instruction: HloInstruction) -> list[tuple[str, int, str]]:
        """The instruction's Python stack, innermost frame first: each (file, line, function). Where the module has
        no stack frame index, the one frame its OpMetadata's source_file and source_line name (older JAX); else []."""
        out: list[tuple[str, int, str]] = []
        frame_id, seen = instruction.stack_frame_id, set()
        while 0 < frame_id <= len(self.stack_frames) and frame_id not in seen:
            seen.add(frame_id)
            file, line, function, frame_id = self.stack_frames[frame_id - 1]
            out.append((file, line, function))
        if not out and instruction.source:
            file, _, line = instruction.source.rpartition(":")
            out.append((file, whole_number(line, 0), ""))
        return out

    @property
    def display_name(self) -> str:
        """The name with its id, as XProf's memory and graph viewers want it: `jit_step(36)`."""
        return f"{self.name}({self.program_id})"

    @property
    def entry_computation(self) -> HloComputation:
        return self.computations[self.entry]

    def find(self, instruction_name: str) -> tuple[HloComputation, HloInstruction] | None:
        """The instruction of that name and its computation: of the first computation that has one."""
        return self._where.get(instruction_name)

    @cached_property
    def _where(self) -> dict[str, tuple[HloComputation, HloInstruction]]:
        """Every instruction name, once: `find` was a scan of every computation per call (3,729 calls, 0.55 s of
        an analysis of a 92 MiB TPU capture)."""
        out: dict[str, tuple[HloComputation, HloInstruction]] = {}
        for computation in self.computations.values():
            for name, instruction in computation.by_name.items():
                out.setdefault(name, (computation, instruction))
        return out

    @cached_property
    def loop_bodies(self) -> set[str]:
        """The computations a `while` runs as its body or condition: their instructions run once per trip."""
        return {name for computation in self.computations.values() for i in computation.instructions
                if i.opcode == "while" for name in i.called}

    @cached_property
    def enclosing_loop(self) -> dict[str, HloInstruction]:
        """For each computation a loop's body runs (directly, or through the calls, conditionals and fusions the
        body makes): the innermost `while` that runs it."""
        callers: dict[str, list[tuple[str, HloInstruction]]] = {}
        for computation in self.computations.values():
            for instruction in computation.instructions:
                for called in instruction.called:
                    callers.setdefault(called, []).append((computation.name, instruction))
        out: dict[str, HloInstruction] = {}

        def find(name: str, seen: frozenset) -> HloInstruction | None:
            if name in out or name in seen:
                return out.get(name)
            for caller, instruction in callers.get(name, ()):
                if instruction.opcode == "while":
                    return instruction
                found = find(caller, seen | {name})
                if found is not None:
                    return found
            return None

        for name in self.computations:
            loop = find(name, frozenset())
            if loop is not None:
                out[name] = loop
        return out

    @cached_property
    def fused_opcodes(self) -> dict[str, list[str]]:
        """For each fusion instruction of any computation: the opcodes it fuses."""
        out: dict[str, list[str]] = {}
        for computation in self.computations.values():
            for instruction in computation.instructions:
                if instruction.opcode == "fusion" and instruction.called:
                    called = self.computations.get(instruction.called[0])
                    if called is not None:
                        out[instruction.name] = [i.opcode for i in called.instructions]
        return out


@dataclass
class HostProfile:
    """What one host's XSpace file held."""

    hostname: str
    path: Path
    size_bytes: int
    planes: list[Plane]
    errors: list[str]
    warnings: list[str]
    pages: object | None = field(default=None, repr=False, compare=False)
    """The memory map its columns are views of, where they are (a host read by `xdiag.profile.hosts_map`)."""
    summarized: bool = False
    """Known from its summary only (xdiag.tools.host_summary): its planes and line names, none of its events."""

    def release_pages(self) -> None:
        """Hands the pages of its mapped columns back (their values stay: a later read maps them in again from the
        file), so that a pass over every host holds one host's columns at a time, not all of them. Nothing where
        its columns are the process's own memory."""
        mapped = getattr(self.pages, "_mmap", None)
        if mapped is not None and hasattr(mapped, "madvise"):
            mapped.madvise(mmap.MADV_DONTNEED)


_DEVICE_RE = re.compile(r"^/device:(?P<kind>[A-Z]+):(?P<index>\d+)")


def platform_of(plane_names: Iterable[str]) -> str:
    """TPU, GPU or CPU: the accelerator that planes of these names belong to, else CPU."""
    kinds = {m.group("kind") for name in plane_names if (m := _DEVICE_RE.match(name))}
    for kind in ("TPU", "GPU"):
        if kind in kinds:
            return kind
    return "CPU"


@dataclass
class Session:
    """One capture: every host's planes and the HLO modules, read once."""

    name: str
    hosts: list[HostProfile]
    hlo_modules: list[HloModule]
    origin_ns: int
    cache: dict[str, object] = field(default_factory=dict, repr=False)  # derived tables shared by tools
    stored_tables: dict = field(default_factory=dict, repr=False)
    """Derived tables a prepared session file carried, as stored (xdiag.analysis.prepared puts them in the cache)."""

    @property
    def planes(self) -> list[Plane]:
        return [plane for host in self.hosts for plane in host.planes]

    @property
    def paths(self) -> list[Path]:
        return [host.path for host in self.hosts]

    @property
    def size_bytes(self) -> int:
        return sum(host.size_bytes for host in self.hosts)

    def hosts_with_events(self) -> list[HostProfile]:
        """The hosts whose events this session holds (every host, but in a session assembled from summaries)."""
        return [host for host in self.hosts if not host.summarized]

    @property
    def event_count(self) -> int:
        return sum(plane.event_count for plane in self.planes)

    def host_by_host(self, planes: Iterable[Plane]) -> Iterator[Plane]:
        """`planes` (of this session, in its order) one by one, each host's mapped pages handed back once the caller
        has gone past its planes (HostProfile.release_pages): a pass over the columns of every host holds one host's
        at a time."""
        owner = {id(plane): host for host in self.hosts for plane in host.planes}
        current = None
        for plane in planes:
            host = owner.get(id(plane))
            if current is not None and host is not current:
                current.release_pages()
            current = host
            yield plane
        if current is not None:
            current.release_pages()

    def close(self) -> None:
        """Releases what derived views hold outside memory (XProf's private copies of the files)."""
        for value in list(self.cache.values()):
            if hasattr(value, "close"):
                value.close()
        self.cache.clear()

    def device_planes(self, with_events: bool = False) -> list[Plane]:
        planes = [p for p in self.planes if _DEVICE_RE.match(p.name)]
        return [p for p in planes if p.event_count] if with_events else planes

    def host_planes(self) -> list[Plane]:
        return [p for p in self.planes if p.name == "/host:CPU"]

    @property
    def platform(self) -> str:
        """TPU, GPU or CPU: the accelerator the profile's device planes name, else CPU."""
        return platform_of(p.name for p in self.planes)

    def module(self, name_or_display: str) -> HloModule | None:
        for module in self.hlo_modules:
            if name_or_display in (module.name, module.display_name):
                return module
        return None

    def module_for(self, name: str, program_id: int | None = None) -> HloModule | None:
        """The module a profile event names; prefer the one with the matching program id."""
        candidates = [m for m in self.hlo_modules if m.name == name or m.display_name == name]
        if program_id is not None:
            exact = [m for m in candidates if m.program_id == program_id]
            if exact:
                return exact[0]
        return candidates[0] if candidates else None
