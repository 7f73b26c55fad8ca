"""Reads Chrome trace JSON (PyTorch Kineto `*.pt.trace.json[.gz]`, and the `trace.json.gz` XProf writes for JAX)
into the same `HostProfile` the xplane reader makes, so every tool reads it unchanged.

One file is one process (one rank). The file is streamed once (gzip or plain; `ijson`'s C parser), each event
turned into columns as it arrives, so memory holds the columns, never the decoded JSON.

Kineto traces become planes the way XProf lays out a GPU profile: `/host:CPU` with a line per thread (cpu_op,
user_annotation incl. `ProfilerStep#N` with its step number, cuda_runtime / cuda_driver calls with their
correlation id, python_function), and `/device:GPU:N` with a `Stream #S` line per stream (kernels, memcpy,
memset, with correlation id and `kernel_details`), a `GPU annotations` line and a `Syncs` line (cuda_sync).
`deviceProperties` become the device planes' stats (name, SMs, memory, compute capability), `distributedInfo`
the host plane's (rank, world size, backend). A CPU-only run (no GPU event: a gloo job, say) has no device to
do the work: each host thread's outermost CPU ops and the communication backend's collective spans (`gloo:all_reduce`
on its worker threads) are read as the host CPU's ops, as XLA:CPU ops are. XProf's Chrome traces keep their own planes and lines: each process
is a plane (`/device:TPU:0`, `/host:CPU`), each thread a line, each event's args its stats.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import re
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import numpy as np

from xdiag.errors import ProfileError
from xdiag.profile.json_shape import JsonShape
from xdiag.profile.trace_columns import LineColumns, PlaneColumns
from xdiag.profile.locate import open_regular, trace_stem
from xdiag.profile.op_records import op_record
from xdiag.profile.read_bounds import check_deadline, read_deadline
from xdiag.sizes import readable_size
from xdiag.profile.space import NUMERIC_STATS, STRING_STATS, HostProfile, Session

KINETO = "PyTorch Kineto trace (Chrome trace JSON)"
XPROF_CHROME = "XProf Chrome trace (trace.json)"
FORMAT_STAT = "trace_format"
"""Host-plane stat naming the format a trace file was read from (absent for xplanes)."""
BLOCKING_COPY_STAT = "blocking_copy"
"""On a runtime call that copies asynchronously (cudaMemcpyAsync): 1 where its copy is from or to pageable host
memory (the GPU event says `Pageable`), which CUDA and HIP perform synchronously: the host waits for the stream."""
_ASYNC_COPY_CALL = re.compile(r"^(cuda|hip)Memcpy\w*Async$")
CPU_OP_INPUTS_STAT = "cpu_op_inputs"
"""On a CPU op: its name and the inputs Kineto recorded with it (op_records.op_record), for the analysis to cost
(xdiag.cost.torch_ops). A host plane numbers its texts in the order it first met them, so of two records the one with
the lower number was met first in the file."""
CPU_OP_STAT = "cpu_op"
"""On a GPU kernel: the record (op_records.op_record) of the CPU op that launched it, where that op carries input
shapes; beside it that op's number in the file (OP_ID_STAT: the kernels of one op execution share it)."""
OP_ID_STAT = "cpu_op_id"
UNCAPTURED_LAUNCH_STAT = "launch_not_in_trace"
"""On a GPU kernel: 1 where its correlation id names no runtime call in the trace: launched before the capture began
(the GPU runs behind the host), so which CPU op launched it, and with what shapes, is not known."""
FIRST_LAUNCH_STAT = "first_launch_of_kernel"
"""On a runtime call: 1 where it launched the first run of its kernel in the trace (by name), where the runtime loads
the kernel's module if it loads lazily (CUDA_MODULE_LOADING=LAZY, HIP's code objects)."""
SHAPES_STAT = "cpu_op_shapes"
"""Host-plane stat: 1 where the trace's CPU ops carry input shapes (record_shapes=True), 0 where none does."""
_CPU_OP, _KERNEL, _COMMS = 1, 2, 3  # event kinds kept per line (launch linking, a CPU-only run's ops)
CPU_ONLY_OPS_STAT = "cpu_ops_as_device_ops"
"""Host-plane stat: 1 where a Kineto trace has no GPU event (a CPU-only run): its CPU ops are then the work a device
would do, and are read as the ops of the host's CPU (the `hlo_op` stat, as XLA:CPU ops carry it), each thread's
outermost ops, and the communication backend's collectives (`gloo:all_reduce` on its worker threads) beside them."""
_BACKEND_COLLECTIVE = re.compile(r"^(gloo|nccl|rccl|mpi|ucc|xccl|hccl):\w+")
"""The communication backend's span of one collective (`gloo:all_reduce`, `nccl:all_reduce`): a gloo job runs it on
the backend's worker thread from the moment the rank enqueues it to the moment every rank has contributed."""
_ENQUEUE_OPS = re.compile(r"^c10d::|^record_param_comms$")
"""The ops that only hand a collective to the backend (an async process group returns at once; the wait is
elsewhere)."""

_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "gpu_user_annotation", "cuda_sync"}
"""Kineto categories that happen on the GPU (lower-cased: old traces write `Kernel`, `Memcpy`, `Memset`)."""
_SKIPPED_CATEGORIES = {"trace"}  # the profiler's own span over the whole capture
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_TOP_KEYS = ("deviceProperties", "distributedInfo")
"""The top-level keys read beside the events: each costs a parse of the file until it is found (Kineto writes them
first), so only what the analyses use."""
_CHUNK = 1 << 20

TRACE_MAX_DECODED_BYTES = 1024**3
"""A trace file's size once inflated, checked while it inflates (a small gzip file can inflate to any size): room for
TRACE_MAX_EVENTS events of up to 1.7 KiB each."""
TRACE_MAX_EVENTS = 600_000
"""Items of `traceEvents` read from one file (a Kineto trace of about 150 MB): what reading and analysing a trace
holds grows with its events (up to about 560 bytes an event, where every CPU op carries input shapes), so this bounds
its memory whatever it holds: 512 MiB (bench/README.md, "Hostile traces")."""
TRACE_MAX_TEXT_BYTES = 32 * 1024**2
"""The distinct texts kept from one file (event, thread and process names, string stats, CPU op records), all
together."""
_MAX_TIME_PS = 86_400 * 10**12
"""An event's time from the file's first event, and its duration: a profile spans seconds to hours, never a day."""

def trace_format(session: Session) -> str | None:
    """The trace format the session's files were read from (KINETO, XPROF_CHROME); None for xplanes."""
    for plane in session.host_planes():
        if plane.stats.get(FORMAT_STAT):
            return str(plane.stats[FORMAT_STAT])
    return None


_MAX_NUMBER_TEXT = 64
"""The characters a number given as text may take to be converted (int64 takes 19 digits; a time in µs with six
decimals 27); a longer one counts as absent."""
_MAX_MAGNITUDE = 30
"""The largest power of ten (Decimal.adjusted) a number is converted at: a larger one is past int64 and any clock
either way, and reads as ±10^31, where int(Decimal("1e999999999")) would build a billion-digit integer (minutes,
gigabytes)."""


def _bounded(value: Decimal | str) -> Decimal | None:
    """The number as a Decimal, its magnitude bounded (_MAX_MAGNITUDE) before any conversion to an integer; None where
    it is not a finite number, or its text is too long."""
    if isinstance(value, str):
        if len(value) > _MAX_NUMBER_TEXT:
            return None
        value = Decimal(value)
    if not value.is_finite():
        return None
    if value.adjusted() > _MAX_MAGNITUDE:
        return Decimal(10 ** (_MAX_MAGNITUDE + 1)).copy_sign(value)
    return value


def _ps(value: Any) -> int | None:
    """µs (int, or Decimal with up to six fractional digits: ps; or the same as a string) to integer ps, exactly;
    None where it is not a finite number."""
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value * 1_000_000
        if isinstance(value, float):
            return round(value * 1_000_000) if math.isfinite(value) else None
        if isinstance(value, (Decimal, str)):
            number = _bounded(value)
            return None if number is None else int(number * 1_000_000)
        return None
    except ArithmeticError:
        return None


def _int(value: Any) -> int | None:
    """The value as an int64 (a number, or a number's text); None where it is none, or out of range."""
    if isinstance(value, (dict, list, bool)) or value is None:
        return None
    try:
        bounded = _bounded(value) if isinstance(value, (Decimal, str)) else value
        if bounded is None:
            return None
        number = int(bounded)
    except (TypeError, ValueError, ArithmeticError):
        return None
    return number if -2**63 <= number < 2**63 else None


def _kernel_details(args: dict) -> str | None:
    """The launch facts in XProf's `kernel_details` form ("regs:38 shm:0 grid:160,1,1 block:256,1,1 occ_pct:50")."""
    parts = []
    for key, label in (("registers per thread", "regs"), ("shared memory", "shm")):
        if args.get(key) is not None:
            parts.append(f"{label}:{args[key]}")
    for key in ("grid", "block"):
        if isinstance(args.get(key), list):
            parts.append(f"{key}:{','.join(str(v) for v in args[key])}")
    if args.get("est. achieved occupancy %") is not None:
        parts.append(f"occ_pct:{args['est. achieved occupancy %']}")
    return " ".join(parts) or None


class _TraceBuilder:
    """Turns streamed events into planes: Kineto's categories into XProf's layout, XProf's own processes as they are."""

    def __init__(self):
        self.planes: dict[object, PlaneColumns] = {}
        self.process_names: dict[object, str] = {}
        self.thread_names: dict[tuple[object, object], str] = {}
        self.base_us: int | None = None
        self.events = 0
        self.kineto_events = 0
        self.flows = 0
        self.async_copy_calls: list[tuple[LineColumns, int, int]] = []  # (line, event index, correlation id)
        self.pageable_copies: set[int] = set()  # correlation ids of GPU copies from or to pageable memory
        self.cpu_ops_with_shapes = 0
        self.shaped_lines: set[int] = set()  # ids of the host lines with a CPU op that carries input shapes
        self.shaped_records: set[int] = set()  # host-plane string ids of the op_records that carry input shapes
        self.text_bytes = 0  # distinct texts kept (TRACE_MAX_TEXT_BYTES)

    def hold_text(self, text: str) -> None:
        self.text_bytes += len(text) + 64  # 64: a str's and a dict entry's own cost
        if self.text_bytes > TRACE_MAX_TEXT_BYTES:
            raise ProfileError(f"more than {readable_size(TRACE_MAX_TEXT_BYTES)} of distinct names and texts; not read "
                               "(a trace is refused past the reader's limits)")

    def _plane(self, key: object, name: str) -> PlaneColumns:
        found = self.planes.get(key)
        if found is None:
            found = self.planes[key] = PlaneColumns(len(self.planes) + 1, name, self.hold_text)
        return found

    def add(self, number: int, event: dict) -> None:
        """Adds the file's event `number` (from 0); a ProfileError naming it where a field the analyses use is of the
        wrong kind or out of range."""
        args = event.get("args")
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            raise ProfileError(f"event {number}: 'args' is {type(args).__name__ if args is not None else 'null'}, not "
                               "an object")
        for key in ("pid", "tid"):
            if isinstance(event.get(key), (dict, list)):
                raise ProfileError(f"event {number}: '{key}' is {type(event[key]).__name__}, not an id")
        phase = event.get("ph")
        if phase == "M":
            if event.get("name") == "process_name":
                self.process_names[event.get("pid")] = name = str(args.get("name", ""))
                self.hold_text(name)
            elif event.get("name") == "thread_name":
                self.thread_names[(event.get("pid"), event.get("tid"))] = name = str(args.get("name", ""))
                self.hold_text(name)
            return
        if phase in ("s", "f", "t"):
            self.flows += 1
            return
        if phase != "X" or "ts" not in event:
            return  # instant, counter and async events carry no duration the analyses use
        category = str(event.get("cat") or "").lower()
        if category in _SKIPPED_CATEGORIES:
            return
        self.events += 1
        start, duration = _ps(event["ts"]), _ps(event.get("dur", 0))
        for field, value in (("ts", start), ("dur", duration)):
            if value is None:
                raise ProfileError(f"event {number}: '{field}' is {str(event.get(field))[:40]!r}, not a time in µs")
        if self.base_us is None:
            if abs(start // 1_000_000) >= 2**62 // 1000:  # the profile's clock is int64 ns
                raise ProfileError(f"event {number}: 'ts' is {str(event['ts'])[:40]!r}, out of any clock's range")
            self.base_us = start // 1_000_000
        start -= self.base_us * 1_000_000
        duration = max(0, duration)
        if abs(start) > _MAX_TIME_PS or duration > _MAX_TIME_PS:
            raise ProfileError(f"event {number}: 'ts' or 'dur' is more than a day from the trace's first event; not a "
                               "profile's time")
        name = str(event.get("name", ""))
        if category:
            self.kineto_events += 1
            self._add_kineto(event, category, name, start, duration, args)
        else:
            self._add_xprof(event, name, start, duration, args)

    def _add_kineto(self, event: dict, category: str, name: str, start: int, duration: int, args: dict) -> None:
        if category in _DEVICE_CATEGORIES:
            device = _int(args.get("device"))
            if device is None:
                device = _int(event.get("pid")) or 0
            plane = self._plane(("device", device), f"/device:GPU:{device}")
            if category == "gpu_user_annotation":
                line = plane.line("annotations", "GPU annotations")
            elif category == "cuda_sync":
                line = plane.line("syncs", "Syncs")
            else:
                stream = _int(args.get("stream"))
                if stream is None:
                    stream = _int(str(event.get("tid", "0")).rsplit(" ", 1)[-1]) or 0
                line = plane.line(("stream", stream), f"Stream #{stream}")
            index = line.add(plane.name_id(name), start, duration, _KERNEL if category == "kernel" else 0)
            correlation = _int(args.get("correlation"))
            if correlation is not None:
                line.put(line.numeric, "correlation_id", index, correlation)
                if "Pageable" in name and category in ("gpu_memcpy", "memcpy"):
                    self.pageable_copies.add(correlation)
            details = _kernel_details(args) if category == "kernel" else None
            if details:
                line.put(line.strings, "kernel_details", index, plane.string_id(details))
            return
        plane = self._plane("host", "/host:CPU")
        pid, tid = event.get("pid"), event.get("tid")
        line = plane.line((pid, tid), f"thread {tid}")
        kind = _CPU_OP if category == "cpu_op" else _COMMS if _BACKEND_COLLECTIVE.match(name) else 0
        index = line.add(plane.name_id(name), start, duration, kind)
        if category == "cpu_op":
            record = plane.string_id(op_record(name, args))
            line.put(line.strings, CPU_OP_INPUTS_STAT, index, record)
            if "Input Dims" in args:
                self.cpu_ops_with_shapes += 1
                self.shaped_lines.add(id(line))
                self.shaped_records.add(record)
        step = _PROFILER_STEP.match(name)
        if step:
            number = _int(step.group(1))
            if number is not None:
                line.put(line.numeric, "step_num", index, number)
        correlation = _int(args.get("correlation"))
        if correlation is not None:
            line.put(line.numeric, "correlation_id", index, correlation)
            if _ASYNC_COPY_CALL.match(name):
                self.async_copy_calls.append((line, index, correlation))

    def _mark_blocking_copies(self) -> None:
        """The async copy calls whose GPU copy is pageable (known once both sides are read, in either order)."""
        for line, index, correlation in self.async_copy_calls:
            if correlation in self.pageable_copies:
                line.put(line.numeric, BLOCKING_COPY_STAT, index, 1)

    def _kernels(self):
        """(plane, line, event index, correlation id) of each GPU kernel that carries a correlation id."""
        for key, plane in self.planes.items():
            if not (isinstance(key, tuple) and key[0] == "device"):
                continue
            for line in plane.lines.values():
                if "correlation_id" not in line.numeric:
                    continue
                kinds = np.frombuffer(line.kinds, np.int8)
                indexes, correlations = (np.frombuffer(a, np.int64) for a in line.numeric["correlation_id"])
                for index, correlation in zip(indexes.tolist(), correlations.tolist()):
                    if kinds[index] == _KERNEL:
                        yield plane, line, index, correlation

    def _mark_first_launches(self) -> None:
        """FIRST_LAUNCH_STAT on the runtime call that launched each kernel name's first run (the earliest call)."""
        host = self.planes.get("host")
        if host is None:
            return
        names = {id(plane): {v: k for k, v in plane.names.items()} for plane in self.planes.values()}
        kernel_of = {correlation: names[id(plane)][line.names[index]]  # correlation id -> its kernel's name
                     for plane, line, index, correlation in self._kernels()}
        first: dict[str, tuple[int, LineColumns, int]] = {}  # kernel name -> (start, line, index) of its first call
        for line in host.lines.values():
            if "correlation_id" not in line.numeric:
                continue
            indexes, correlations = (np.frombuffer(a, np.int64) for a in line.numeric["correlation_id"])
            for index, correlation in zip(indexes.tolist(), correlations.tolist()):
                kernel = kernel_of.get(correlation)
                if kernel is not None and (kernel not in first or line.starts[index] < first[kernel][0]):
                    first[kernel] = (line.starts[index], line, index)
        for _, line, index in first.values():
            line.put(line.numeric, FIRST_LAUNCH_STAT, index, 1)

    def _launching_ops(self) -> dict[int, tuple[LineColumns, int, int]]:
        """Correlation id of each runtime call whose innermost enclosing CPU op carries input shapes -> (the op's line,
        its index, its op_record's string id). The innermost op is the one that launched: a matmul's own copies run
        inside it, but under a nested op (its aten::copy_), never under the matmul directly."""
        out: dict[int, tuple[LineColumns, int, int]] = {}
        host = self.planes.get("host")
        if host is None or not self.shaped_records:
            return out
        shaped = np.array(sorted(self.shaped_records), np.int64)
        for line in host.lines.values():
            if "correlation_id" not in line.numeric or id(line) not in self.shaped_lines:
                continue
            kinds = np.frombuffer(line.kinds, np.int8)
            starts, durations = np.frombuffer(line.starts, np.int64), np.frombuffer(line.durations, np.int64)
            launches, correlations = (np.frombuffer(a, np.int64) for a in line.numeric["correlation_id"])
            ops = np.flatnonzero(kinds == _CPU_OP)
            op_indexes, records = (np.frombuffer(a, np.int64) for a in line.strings[CPU_OP_INPUTS_STAT])
            record_of = np.full(len(kinds), -1, np.int64)
            record_of[op_indexes] = records
            carries_shapes = np.isin(record_of, shaped)
            # Ops and launches in start order (an op before the calls it encloses; the outer of two ops first).
            items = sorted([(int(starts[i]), -int(durations[i]), 0, int(i)) for i in ops.tolist()]
                           + [(int(starts[i]), 0, 1, int(i)) for i in launches.tolist()])
            by_launch = dict(zip(launches.tolist(), correlations.tolist()))
            stack: list[tuple[int, int]] = []  # (end, index) of the ops open at the moment
            for start, negative_duration, is_launch, index in items:
                while stack and stack[-1][0] < start:
                    stack.pop()
                if is_launch:
                    end = start + int(durations[index])
                    if stack and stack[-1][0] >= end and carries_shapes[stack[-1][1]]:
                        out[by_launch[index]] = (line, stack[-1][1], int(record_of[stack[-1][1]]))
                else:
                    stack.append((start - negative_duration, index))
        return out

    def _link_kernels(self) -> None:
        """On each kernel launched by a CPU op that carries input shapes: the op (OP_ID_STAT, and its op_record as
        CPU_OP_STAT), for the analysis to cost and share out over the op's kernels; on each kernel whose launch is not
        in the trace, UNCAPTURED_LAUNCH_STAT. The host plane says whether the trace has shapes (SHAPES_STAT)."""
        host = self.planes.get("host")
        if host is not None:
            host.stats[SHAPES_STAT] = int(self.cpu_ops_with_shapes > 0)
        launched = self._launching_ops()
        if not launched:
            return
        calls = {int(c) for line in host.lines.values() if "correlation_id" in line.numeric
                 for c in np.frombuffer(line.numeric["correlation_id"][1], np.int64).tolist()} if host else set()
        records = list(host.strings)  # by string id
        numbers: dict[tuple[int, int], int] = {}  # (id of the op's line, its index) -> the op's number in this file
        for plane, line, index, correlation in self._kernels():
            if correlation not in calls:
                line.put(line.numeric, UNCAPTURED_LAUNCH_STAT, index, 1)
            found = launched.get(correlation)
            if found is None:
                continue
            op_line, op, record = found
            number = numbers.setdefault((id(op_line), op), len(numbers))
            line.put(line.numeric, OP_ID_STAT, index, number)
            line.put(line.strings, CPU_OP_STAT, index, plane.string_id(records[record]))

    def _mark_cpu_ops(self) -> None:
        """A CPU-only run: on each host thread, the outermost CPU ops (an op enclosed by another is part of it) and the
        backend's collective spans become the host CPU's ops (`hlo_op`); an op that only enqueues a collective
        (c10d::*, record_param_comms) is not one (the work it hands over shows as the backend's span)."""
        host = self.planes.get("host")
        if host is None or any(isinstance(key, tuple) and key[0] == "device" for key in self.planes):
            return
        host.stats[CPU_ONLY_OPS_STAT] = 1
        names = {v: k for k, v in host.names.items()}
        for line in host.lines.values():
            kinds = np.frombuffer(line.kinds, np.int8)
            starts, durations = np.frombuffer(line.starts, np.int64), np.frombuffer(line.durations, np.int64)
            candidates = [int(i) for i in np.flatnonzero((kinds == _CPU_OP) | (kinds == _COMMS)).tolist()
                          if kinds[i] == _COMMS or not _ENQUEUE_OPS.match(names[line.names[i]])]
            open_end, marked = None, []  # end of the outermost op open at the moment
            for index in sorted(candidates, key=lambda i: (int(starts[i]), -int(durations[i]))):
                start, end = int(starts[index]), int(starts[index] + durations[index])
                if open_end is not None and end <= open_end and kinds[index] == _CPU_OP:
                    continue  # inside an op already counted
                if open_end is None or start >= open_end:
                    open_end = end
                marked.append(index)
            for index in sorted(marked):
                line.put(line.strings, "hlo_op", index, host.string_id(names[line.names[index]]))

    def _add_xprof(self, event: dict, name: str, start: int, duration: int, args: dict) -> None:
        pid, tid = event.get("pid"), event.get("tid")
        plane = self._plane(("process", pid), self.process_names.get(pid) or f"process {pid}")
        line = plane.line((pid, tid), f"thread {tid}")
        name_id = plane.name_id(name)
        index = line.add(name_id, start, duration)
        if name_id not in plane.metadata_stats and args:
            # XProf writes an op's cost (flops, bytes_accessed, hlo_category) on every event; the plane keeps it once.
            plane.metadata_stats[name_id] = kept = {
                k: _number_or_text(v) for k, v in args.items()
                if k not in ("long_name", "source_stack", "memory_access_breakdown")}
            self.hold_text("".join(f"{k}{v}" for k, v in kept.items()))
        for key, value in args.items():
            if key in NUMERIC_STATS:
                number = _int(value)
                if number is not None:
                    line.put(line.numeric, key, index, number)
            elif key in STRING_STATS:
                line.put(line.strings, key, index, plane.string_id(str(value)))

    def host(self, path: Path, top: dict[str, Any]) -> HostProfile:
        if not self.events:
            raise ProfileError(f"{path.name}: a trace with no complete ('X') events; nothing to analyse")
        kineto = bool(self.kineto_events) or any(key in top for key in _TOP_KEYS)
        for key, plane in self.planes.items():
            if key not in ("host",) and not (isinstance(key, tuple) and key[0] == "process"):
                continue
            if isinstance(key, tuple):
                plane.name = self.process_names.get(key[1]) or plane.name
        self._describe(top, kineto)
        self._mark_blocking_copies()
        self._mark_first_launches()
        if kineto:
            self._mark_cpu_ops()
        self._link_kernels()
        info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
        rank = _int(info.get("rank"))
        hostname = trace_stem(path.name)
        if rank is not None and len(str(hostname)) > 40:
            hostname = f"rank{rank}"
        # Events are written out of time order (the first one read need not be the earliest): every time is made
        # relative to the earliest, whole ns, as xplanes' are to their line's timestamp.
        earliest = min((found for p in self.planes.values() if (found := p.earliest_ps()) is not None), default=0)
        earliest_ns = earliest // 1000
        base_ns = (self.base_us or 0) * 1000 + earliest_ns
        planes = sorted((p.plane(hostname, base_ns, -earliest_ns * 1000, self.thread_names)
                         for p in self.planes.values()), key=lambda p: p.id)
        warnings = [] if self.events else ["no complete events"]
        return HostProfile(hostname=hostname, path=path, size_bytes=path.stat().st_size, planes=planes, errors=[],
                           warnings=warnings)

    def _describe(self, top: dict[str, Any], kineto: bool) -> None:
        """The format, the rank and the devices' properties as plane stats, in the names XProf's planes use."""
        host = self.planes.get("host") or next((p for p in self.planes.values() if p.name == "/host:CPU"), None)
        if host is None:
            host = self._plane("host", "/host:CPU")
        host.stats[FORMAT_STAT] = KINETO if kineto else XPROF_CHROME
        info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
        for key in ("rank", "world_size"):
            if _int(info.get(key)) is not None:
                host.stats[f"distributed_{key}"] = _int(info[key])
        if isinstance(info.get("backend"), str):
            host.stats["distributed_backend"] = info["backend"]
        listed = top.get("deviceProperties") if isinstance(top.get("deviceProperties"), list) else []
        properties = {_int(p.get("id")): p for p in listed if isinstance(p, dict) and _int(p.get("id")) is not None}
        devices = {key: plane for key, plane in self.planes.items() if isinstance(key, tuple) and key[0] == "device"}
        for key, plane in devices.items():
            found = properties.get(key[1])
            if found is None and len(properties) == 1 and len(devices) == 1:
                found = next(iter(properties.values()))  # the one device described is the one used (renumbered)
            if found is None:
                continue
            name = str(found.get("name", ""))
            amd = "AMD" in name or "warpSize" in found and _int(found["warpSize"]) == 64
            plane.stats.update({
                "gpu_device_name": name, "device_vendor": "AMD" if amd else "Nvidia",
                "core_count": _int(found.get("numSms")), "memory_size": _int(found.get("totalGlobalMem")),
                "compute_cap_major": _int(found.get("computeMajor")), "compute_cap_minor": _int(found.get("computeMinor")),
            })
            plane.stats = {k: v for k, v in plane.stats.items() if v is not None}


def _number_or_text(value: Any) -> object:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (int, float)):
        return value
    text = str(value)
    if len(text) > _MAX_NUMBER_TEXT:
        return text
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes, inflated where it is gzip; a ProfileError where it is not a regular file one can read."""
    with open_regular(path) as raw:
        magic = raw.read(2)
        raw.seek(0)
        if magic != b"\x1f\x8b":
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as inflated:
            yield inflated


def _first_byte(path: Path) -> bytes:
    with _opened(path) as handle:
        try:
            head = handle.read(4096)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(f"{path.name}: not a readable gzip file ({exc})") from None
    stripped = head.lstrip()
    if stripped.startswith(b"\xef\xbb\xbf"):
        stripped = stripped[3:].lstrip()
    return stripped[:1]


def read_trace_host(path: Path) -> HostProfile:
    """Reads one Kineto or XProf Chrome trace file (plain or gzip) in one streamed pass; raises ProfileError with a
    one-line reason when it is neither (not JSON, or JSON without `traceEvents`), when it is malformed, or when it is
    past the reader's limits (TRACE_MAX_*: inflated size, events, texts, nesting, one string, number or event), which
    bound what reading it holds in memory whatever the file holds."""
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise ProfileError(f"{path.name}: empty file (0 bytes); the capture wrote nothing")
    first = _first_byte(path)
    if not first:
        raise ProfileError(f"{path.name}: empty trace (nothing but whitespace once decompressed)")
    if first not in (b"{", b"["):
        raise ProfileError(f"{path.name}: neither an XProf profile nor a Chrome/Kineto trace (it is not JSON: it "
                           f"starts with {first!r})")
    builder = _TraceBuilder()
    shape = JsonShape(path.name, top_is_array=first == b"[")
    events: list = ijson.sendable_list()
    events_parser = ijson.items_coro(events, "item" if first == b"[" else "traceEvents.item")
    top_values = {key: ijson.sendable_list() for key in (_TOP_KEYS if first == b"{" else ())}
    searching = {key: ijson.items_coro(values, key) for key, values in top_values.items()}
    count = 0
    deadline = read_deadline(path.stat().st_size)

    def add_events() -> None:
        nonlocal count
        for event in events:
            if count >= TRACE_MAX_EVENTS:
                raise ProfileError(f"{path.name}: more than {TRACE_MAX_EVENTS:,} events; not read (a trace is refused "
                                   "past the reader's limits)")
            if isinstance(event, dict):
                try:
                    builder.add(count, event)
                except ProfileError as exc:
                    raise ProfileError(f"{path.name}: {exc}") from None
            count += 1
        del events[:]

    try:
        with _opened(path) as handle:
            while chunk := handle.read(_CHUNK):
                if shape.offset + len(chunk) > TRACE_MAX_DECODED_BYTES:
                    raise ProfileError(f"{path.name}: more than {readable_size(TRACE_MAX_DECODED_BYTES)} once "
                                       "inflated; inflating stopped there")
                shape.feed(chunk)
                events_parser.send(chunk)
                for key in list(searching):
                    searching[key].send(chunk)
                    if top_values[key]:
                        del searching[key]  # a key appears once: its parser stops as soon as it has it
                add_events()
                check_deadline(deadline, path.name, shape.offset)
            for parser in (events_parser, *searching.values()):
                parser.close()
            add_events()
    except ijson.common.IncompleteJSONError as exc:
        reason = " ".join(str(exc).split())[:120]
        if "premature EOF" in reason:
            raise ProfileError(f"{path.name}: not a complete JSON trace ({reason}); the file may be truncated") from None
        raise ProfileError(f"{path.name}: not valid JSON ({reason})") from None
    except ijson.common.JSONError as exc:
        raise ProfileError(f"{path.name}: not valid JSON ({' '.join(str(exc).split())[:120]})") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise ProfileError(f"{path.name}: unreadable ({exc})") from None
    except (ValueError, ArithmeticError) as exc:  # ijson's numbers: past int's digit limit, past Decimal's exponent
        raise ProfileError(f"{path.name}: a number it cannot hold ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:120]})") from None
    top = {key: values[0] for key, values in top_values.items() if values}
    if first == b"{" and not builder.events and not builder.process_names:
        raise ProfileError(f"{path.name}: JSON without trace events (no 'traceEvents'): neither an XProf profile "
                           "nor a Chrome/Kineto trace")
    return builder.host(path, top)
