"""A copy of a profile without the host events XProf's converters make no use of, for those converters.

The JAX and TensorFlow profilers record every Python call while their Python tracer is on (jax.profiler's
default): host-plane events named `$file.py:line function`, with no stats. They are most of a host plane's
events (234,000 of 295,000 in tests/profiles/h200/recompilation) and most of its bytes. XProf's converters
that xdiag runs (op_stats and everything that reads it, memory_profile, smart_suggestion, utilization) parse and
group them only to leave them out of their answers. The op_stats conversion of the 85 MiB bench profile takes
1.9 s instead of 6.0 s without them. Given `unread_name` (xdiag.analysis.xprof.host_events, for the xprof version
whose names were read), the copy also leaves out the other host events XProf gives no meaning: those without stats
whose names it does not look up (XLA's compiler passes, the runtime's bookkeeping: half the other host events of a
JAX profile on a GPU), line by line, only where leaving them out changes no kept event's parent in XProf's event
grouping (`wire.thinned_line`). On the bench profile that is another 437,000 events, 35.0 MB down to 27.5 MB, and
20-25% less CPU in the op_stats and memory_profile conversions. On every real device profile here every view is the
same as from the whole file (tests/test_xprof_views.py compares them). XProf's trace viewer shows all events, so
the viewer keeps serving the originals.

The copy is made from the memory-mapped file in one compiled walk over each host line, which copies what stays
(`wire.thinned_line`: where stat-less events may go, it follows XProf's nesting as it copies; a line where leaving
them out is not safe is walked again for its Python events alone). Only the host plane's and its lines' lengths are
written anew; every other byte (other planes, the host plane's metadata, the other events, field order) is copied as
it is. The lines are walked in up to four threads where they come to 32 MiB or more (the compiled code releases the
GIL), a few lines' bytes in memory at a time; the new host plane goes through a scratch file, as its length comes before it. 0.2 s (0.33 s of CPU) for
the 85 MiB profile on two cores, where a count walk followed by a copy walk took 0.3 s (0.55 s of CPU).

Given `unread_device_lines` (`write_for_xprof`), the copy also leaves out whole lines of the TPU planes that XProf's
op_stats, its views and memory_profile never visit (`UNREAD_TPU_LINES`: the `Async XLA Ops` line, a third of the
87.6 MiB TPU v5e capture), each plane's other fields copied as they are: on that capture XProf's op_stats conversion
then peaks at 850 instead of 1,060 MiB, for the same views. Given `default_op_stats` too, it leaves out of the events of
their `XLA Ops` line the stats that hold the value XProf takes where they are absent (`DEFAULT_TPU_OP_STATS`: `Time
Scale Multiplier` at 1.0, a third of those events' stats), in one compiled walk of the line (`wire.line_without_stat`,
0.1 s of CPU for its 1.33M events): XProf's op_stats conversion then peaks at ~720 MiB, in ~0.3 s less CPU, and
XProf's converters give the same output.

`write_metadata_plane` writes a second, small copy: the metadata plane alone, which holds every HLO module and no
event. XProf extracts its `*.hlo_proto.pb` files (what its memory viewer reads) from it in milliseconds, where from
the whole file it parses every event again (0.4 s for the 85 MiB profile).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np

from xdiag.errors import ProfileError
from xdiag.profile import schema, wire
from xdiag.profile.locate import open_regular
from xdiag.profile.reader import _mapped, _top_level_fields, plane_fields, plane_metadata, plane_name

HOST_THREADS_PLANE = "/host:CPU"
"""XProf's host plane (kHostThreadsPlaneName): where the Python tracer's events are."""
METADATA_PLANE = "/host:metadata"
"""XProf's metadata plane (kMetadataPlaneName): where the profilers put each HLO module, and no events."""
TPU_PLANE_PREFIX = "/device:TPU:"
"""XProf's TPU planes (kTpuPlanePrefix): a TensorCore's or a SparseCore's."""
UNREAD_TPU_LINES = frozenset({"Async XLA Ops"})
"""Lines of a TPU plane that XProf's op_stats (xplane_to_op_stats.cc: the op lines, `XLA Ops` and `Sparse Core Ops`,
for op metrics and step events; `XLA Modules` and the op lines for the duty cycle; the `Steps` lines) and the
converters that read it never visit, nor memory_profile (the host plane alone). Its trace viewer does not show it
either. On the 87.6 MiB TPU v5e capture it is 28 of the 91 MB, 371,300 events."""
TPU_OP_LINE = "XLA Ops"
"""A TPU plane's line of XLA's ops (kXlaOpLineName): 1.33M of the 87.6 MiB TPU v5e capture's 1.7M events."""
DEFAULT_TPU_OP_STATS: Mapping[str, float] = {"Time Scale Multiplier": 1.0}
"""Stats of the events of a TPU plane's `XLA Ops` line that XProf's converters read as that value where an event has
none, each with the value. `Time Scale Multiplier` (kTimeScaleMultiplier) goes into an op's normalized time alone:
its time times the stat, times 1.0 where absent, in the op metrics of the TensorCore and SparseCore lines
(xplane_to_op_metrics_db.cc, xplane_to_flat_op_metrics_db.cc), from which op_profile and roofline_model read it. The
per-step metrics of op_stats' step_db leave an op's normalized time out where it is absent; no converter of the
audited xprof shows those (tests/test_xprof_views.py compares every converter's output, and sees the stat at 0.5).
JAX's TPU profiler writes it at 1.0 on every op event (every committed TPU v5e capture): left out where it holds
exactly that, the copy has a third fewer stats on its 1.33M op events, and on the 87.6 MiB capture XProf's op_stats
conversion peaks ~140 MiB lower, in ~0.3 s less CPU."""
PYTHON_EVENT_PREFIX = "$"
"""How the Python tracer names its events (`$file.py:line function`, `$builtins len`)."""
_THREADS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
"""Threads that walk the host lines at once."""
_THREADED_MIN_BYTES = 32 * 2**20
"""Host lines of fewer bytes, all together, are walked in the calling thread: on the 6.4 MiB H200 recompilation
profile threads saved 2 of 26 ms, while in XProf's detached converter (mimalloc 3, its default purge delay) a pool
started before the conversion left XProf's op_stats of the 87.6 MiB TPU v5e capture peaking ~80 MiB higher
(790-800 against 720-735 MiB; a pool of threads that allocate nothing did the same)."""
_T = TypeVar("_T")
_ASYNC_STAT = "_a"
"""The stat that marks an event asynchronous (XProf's kIsAsync): XProf leaves such events out of its nesting."""

_PLANE_LINES = 3
_LINE_EVENTS = 4
_MAX_FLAGGED_ID = 2**24
"""Python metadata ids are flagged in a table indexed by id; the profilers number metadata from 1."""
_ONE_BYTE_KEYS = {1: 0x0A, 3: 0x1A}  # XSpace.planes and XPlane.lines, length-delimited


def encode_varint(value: int) -> bytes:
    """Protobuf's varint of an int (negative ones as their 64-bit two's complement, as int64 fields are)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _corrupt(name: str, start: int, err: int, err_pos: int) -> ProfileError:
    return ProfileError(f"{name}: the host line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")


def _in_order(function: Callable[[int], _T], items: list[int], threads: int = _THREADS) -> Iterator[_T]:
    """`function` of each item, in order, computed in up to `threads` threads (the compiled walks release the GIL)
    at most `threads` items ahead of the one consumed: the copy holds a few lines' bytes at a time."""
    threads = min(threads, len(items))
    if threads < 2:
        yield from map(function, items)
        return
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="xdiag-slim") as pool:
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _thinned(arr: np.ndarray, start: int, end: int, flags: np.ndarray, stat_less: bool, async_stat: int,
             name: str) -> tuple[int, np.ndarray]:
    """(dropped events, the kept bytes) of one host line: without its Python events and, where `stat_less` and
    `wire.thinned_line` finds it safe, its flagged stat-less events; else without its Python events alone."""
    out = np.empty(end - start, np.uint8)
    if stat_less:
        kept, dropped, safe, err, err_pos = wire.thinned_line(arr, start, end, flags, async_stat, out)
        if err:
            raise _corrupt(name, start, err, err_pos)
        if safe:
            return dropped, out[:kept]
    kept, dropped, err, err_pos = wire.line_without_events(arr, start, end, flags, out)
    if err:
        raise _corrupt(name, start, err, err_pos)
    return dropped, out[:kept]


def _metadata_flags(plane: schema.XPlane, unread_name: Callable[[str], bool] | None) -> np.ndarray:
    """The compiled walks' flags, indexed by metadata id: DROP_EVENT for a Python function's events;
    DROP_WITHOUT_STATS where `unread_name` says XProf gives the name no meaning and the metadata carries nothing
    else (no stats, bytes or children) that XProf could read."""
    names = {key: schema.text(meta.name) for key, meta in plane.event_metadata.items()}
    python = [key for key, name in names.items() if name.startswith(PYTHON_EVENT_PREFIX)]
    stat_less = [] if unread_name is None else [
        key for key, meta in plane.event_metadata.items()
        if not names[key].startswith(PYTHON_EVENT_PREFIX) and not (meta.stats or meta.metadata or meta.child_id)
        and unread_name(names[key])
    ]
    flagged = python + stat_less
    if not flagged or min(flagged) < 0 or max(flagged) >= _MAX_FLAGGED_ID:
        return np.zeros(0, np.uint8)  # ids beyond a small table (not written so by any profiler seen): keep all
    flags = np.zeros(max(flagged) + 1, np.uint8)
    flags[python] = wire.DROP_EVENT
    flags[stat_less] = wire.DROP_WITHOUT_STATS
    return flags


class LeftOut(NamedTuple):
    """What a copy for XProf leaves out (`write_for_xprof`); all 0 where it wrote nothing."""

    host_events: int
    device_line_events: int
    """Events of the TPU planes' lines left out whole (`UNREAD_TPU_LINES`)."""
    default_stats: int
    """Stats left out of the TPU op events where they hold XProf's default (`DEFAULT_TPU_OP_STATS`)."""

    @property
    def events(self) -> int:
        return self.host_events + self.device_line_events


def write_without_unused_events(source: Path, target: Path, unread_name: Callable[[str], bool] | None = None,
                                unread_device_lines: frozenset[str] = frozenset()) -> int:
    """Writes `source` to `target` without the host-plane events XProf's converters make no use of and returns how
    many it dropped: the Python tracer's events and, where `unread_name` is given, the events without stats whose
    names it says XProf gives no meaning, on the lines where that keeps every other event's parent in XProf's
    grouping (`wire.thinned_line`). With none to drop it writes
    nothing and returns 0 (link the original instead). Raises ProfileError where the file cannot be walked (the
    reader says the same, precisely); a partial `target` is removed. `unread_device_lines`: see `write_for_xprof`,
    whose events count this returns."""
    return write_for_xprof(source, target, unread_name, unread_device_lines).host_events


def write_for_xprof(source: Path, target: Path, unread_name: Callable[[str], bool] | None = None,
                    unread_device_lines: frozenset[str] = frozenset(),
                    default_op_stats: Mapping[str, float] | None = None) -> LeftOut:
    """`write_without_unused_events`, also leaving out the lines of the TPU planes (`TPU_PLANE_PREFIX`) named in
    `unread_device_lines` (`UNREAD_TPU_LINES`) and, from the events of their `TPU_OP_LINE`, each stat named in
    `default_op_stats` (`DEFAULT_TPU_OP_STATS`) that holds exactly the value given there; writes nothing where it
    leaves nothing out."""
    with open_regular(source) as handle, _mapped(handle) as buf:
        arr = np.frombuffer(buf, np.uint8)
        try:
            return _write(arr, buf, source.name, target, unread_name, unread_device_lines, default_op_stats or {})
        finally:
            del arr  # the map cannot close while a view of it exists


def write_metadata_plane(source: Path, target: Path) -> bool:
    """Writes `source` to `target` with its metadata plane alone (and the XSpace's few other fields, the host
    names among them): the HLO modules, without a single event. False, writing nothing, where it has no
    metadata plane. Raises ProfileError where the file cannot be walked; a partial `target` is removed."""
    with open_regular(source) as handle, _mapped(handle) as buf:
        kept: list[tuple[int, int]] = []  # (tag, end) of each field to copy
        found = False
        tag = 0
        for number, start, end in _top_level_fields(buf, len(buf), source.name):
            is_metadata = number == 1 and plane_name(buf, start, end) == METADATA_PLANE
            if number != 1 or is_metadata:
                kept.append((tag, end))
            found |= is_metadata
            tag = end
        if not found:
            return False
        try:
            with target.open("wb") as out:
                for tag, end in kept:
                    out.write(buf[tag:end])
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
        return True


def _write(arr: np.ndarray, buf, name: str, target: Path, unread_name: Callable[[str], bool] | None,
           unread_device_lines: frozenset[str], default_op_stats: Mapping[str, float]) -> LeftOut:
    fields = list(_top_level_fields(buf, len(buf), name))
    host: tuple[int, tuple, np.ndarray, int] | None = None  # (index, plane fields, flags, async stat)
    device: dict[int, _DevicePlane] = {}  # index -> what of the plane is left out
    for index, (number, start, end) in enumerate(fields):
        if number != 1:
            continue
        plane = plane_name(buf, start, end)
        if plane == HOST_THREADS_PLANE and host is None:
            fields_of_plane = plane_fields(arr, start, end, name)
            metadata = plane_metadata(arr, start, fields_of_plane, name)
            flags = _metadata_flags(metadata, unread_name)
            if len(flags):
                async_stat = next((key for key, meta in metadata.stat_metadata.items()
                                   if schema.text(meta.name) == _ASYNC_STAT), -1)
                host = (index, fields_of_plane, flags, async_stat)
        elif (unread_device_lines or default_op_stats) and plane.startswith(TPU_PLANE_PREFIX):
            thinned = _device_plane(arr, buf, start, end, name, unread_device_lines, default_op_stats)
            if thinned.dropped_lines or thinned.rewritten:
                device[index] = thinned
    if host is None and not device:
        return LeftOut(0, 0, 0)
    with contextlib.ExitStack() as stack:
        host_plane: tuple[int, object, int] | None = None  # (events dropped, scratch file, its bytes)
        if host is not None:
            scratch = stack.enter_context(tempfile.TemporaryFile(dir=target.parent))
            dropped, size = _thinned_host_plane(arr, scratch, host[1], host[2], host[3], name)
            if dropped:
                host_plane = (dropped, scratch, size)
        if host_plane is None and not device:
            return LeftOut(0, 0, 0)
        device_events = sum(plane.dropped_events for plane in device.values())
        try:
            with target.open("wb", buffering=0) as out:
                for index, (number, start, end) in enumerate(fields):
                    tag = fields[index - 1][2] if index else 0  # right after the field before it
                    if host_plane is not None and host is not None and index == host[0]:
                        _write_all(out, bytes([_ONE_BYTE_KEYS[1]]) + encode_varint(host_plane[2]))
                        _append(host_plane[1], out, host_plane[2])
                    elif index in device:
                        _write_device_plane(out, arr, device[index])
                    else:
                        _write_all(out, arr[tag:end])
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
    return LeftOut(host_plane[0] if host_plane else 0, device_events,
                   sum(plane.default_stats for plane in device.values()))


class _DevicePlane(NamedTuple):
    """A TPU plane as the copy writes it: its fields, those of the lines left out, and the lines written anew."""

    fields: tuple
    dropped_lines: set[int]
    dropped_events: int
    rewritten: dict[int, np.ndarray]
    """Plane field index -> the line's new bytes (without its key and length)."""
    default_stats: int


def _device_plane(arr: np.ndarray, buf, start: int, end: int, name: str, unread_lines: frozenset[str],
                  default_op_stats: Mapping[str, float]) -> _DevicePlane:
    """What of the TPU plane at [start, end) the copy leaves out: its lines named in `unread_lines`, and, from its
    `TPU_OP_LINE`'s events, the stats of `default_op_stats` holding their default (`wire.line_without_stat`)."""
    fields_of_plane = plane_fields(arr, start, end, name)
    numbers, _, starts, ends, wires = fields_of_plane
    lines = {i: plane_name(buf, int(starts[i]), int(ends[i]))  # XLine.name: field 2, as XPlane's
             for i in np.flatnonzero((numbers == _PLANE_LINES) & (wires == 2)).tolist()}
    dropped = {i for i, line in lines.items() if line in unread_lines}
    rewritten: dict[int, np.ndarray] = {}
    stats_left_out = 0
    op_lines = [i for i, line in lines.items() if line == TPU_OP_LINE and i not in dropped]
    if op_lines and default_op_stats:
        stat_ids = {schema.text(meta.name): key for key, meta in
                    plane_metadata(arr, start, fields_of_plane, name).stat_metadata.items()}
        for stat, value in default_op_stats.items():
            if stat not in stat_ids:
                continue
            stat_bytes = np.frombuffer(schema.XStat(metadata_id=stat_ids[stat], double_value=value)
                                       .SerializeToString(), np.uint8).copy()
            for i in op_lines:
                line = rewritten.get(i)
                source, begin, finish = (arr, int(starts[i]), int(ends[i])) if line is None else (line, 0, len(line))
                out = _unmapped_when_gone(finish - begin)
                kept, left_out, err, err_pos = wire.line_without_stat(source, begin, finish, stat_bytes, out)
                if err:
                    raise ProfileError(f"{name}: the device line at byte {int(starts[i])} is corrupt: "
                                       f"{wire.ERRORS[err]} near byte {err_pos}")
                if left_out:
                    rewritten[i] = out[:kept]
                    rewritten[i].flags.writeable = False  # as the mapped file's bytes are, for the next stat's walk
                    stats_left_out += left_out
    events = sum(_event_count(arr, int(starts[i]), int(ends[i])) for i in dropped)
    return _DevicePlane(fields_of_plane, dropped, events, rewritten, stats_left_out)


def _unmapped_when_gone(size: int) -> np.ndarray:
    """A writable array of `size` bytes in an anonymous mapping of its own, unmapped when the last array on it goes:
    a rewritten line is tens of MB (45 MB on the 87.6 MiB TPU v5e capture) that the process's malloc would keep once
    freed (mimalloc in XProf's converter kept 60 MiB of it beside the conversion after the copy)."""
    return np.frombuffer(mmap.mmap(-1, max(size, 1)), np.uint8)[:size]


def _write_device_plane(out, arr: np.ndarray, plane: _DevicePlane) -> None:
    """Writes the plane without its dropped lines and with its rewritten ones (every other byte as it is, in
    runs)."""
    numbers, tags, _, ends, _ = plane.fields
    kept = [i for i in range(len(numbers)) if i not in plane.dropped_lines]
    heads = {i: bytes([_ONE_BYTE_KEYS[_PLANE_LINES]]) + encode_varint(len(body)) for i, body in plane.rewritten.items()}
    size = sum(len(heads[i]) + len(plane.rewritten[i]) if i in plane.rewritten else int(ends[i]) - int(tags[i])
               for i in kept)
    _write_all(out, bytes([_ONE_BYTE_KEYS[1]]) + encode_varint(size))
    run_start = run_end = -1
    for i in kept:
        if i in plane.rewritten or int(tags[i]) != run_end:
            if run_end > run_start:
                _write_all(out, arr[run_start:run_end])
            run_start = run_end = -1
        if i in plane.rewritten:
            _write_all(out, heads[i])
            _write_all(out, plane.rewritten[i])
            continue
        if run_start < 0:
            run_start = int(tags[i])
        run_end = int(ends[i])
    if run_end > run_start:
        _write_all(out, arr[run_start:run_end])


def _event_count(arr: np.ndarray, start: int, end: int) -> int:
    """How many events (XLine field 4) the line at [start, end) holds."""
    numbers, *_, err, err_pos = wire.scan_fields(arr, start, end)
    if err:
        raise ProfileError(f"the device line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")
    return int(np.count_nonzero(numbers == _LINE_EVENTS))


def _thinned_host_plane(arr: np.ndarray, plane, fields_of_plane, flags: np.ndarray, async_stat: int,
                        name: str) -> tuple[int, int]:
    """Writes the host plane's fields, its lines thinned, into the scratch file `plane`; returns (events dropped,
    bytes written).

    Each line is thinned in one walk, in threads where they are many (`_THREADED_MIN_BYTES`), a few lines' bytes in
    memory at a time, into a scratch file
    beside the target: the plane's length, written before it, is known only once every line is walked. Every other
    byte is copied as it is, the keys too (one byte each)."""
    numbers, tags, starts, ends, wires = fields_of_plane
    stat_less = bool((flags == wire.DROP_WITHOUT_STATS).any())
    lines = np.flatnonzero((numbers == _PLANE_LINES) & (wires == 2)).tolist()
    threads = _THREADS if int((ends[lines] - starts[lines]).sum()) >= _THREADED_MIN_BYTES else 1
    dropped = 0
    with contextlib.closing(_in_order(
            lambda i: _thinned(arr, int(starts[i]), int(ends[i]), flags, stat_less, async_stat, name), lines, threads)
    ) as walked:
        thinned = iter(zip(lines, walked))
        next_line, (line_dropped, body) = next(thinned, (-1, (0, None)))
        for i in range(len(numbers)):
            if i != next_line or not line_dropped:
                plane.write(arr[tags[i]:ends[i]])
            else:
                plane.write(bytes([_ONE_BYTE_KEYS[_PLANE_LINES]]) + encode_varint(len(body)))
                plane.write(body)
                dropped += line_dropped
            if i == next_line:
                next_line, (line_dropped, body) = next(thinned, (-1, (0, None)))
    return dropped, plane.tell()


def _write_all(out, data) -> None:
    """`data` written to the unbuffered file `out`, however many calls it takes (one write(2) stops short of 2 GiB)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view):]


def _append(source, out, size: int) -> None:
    """The first `size` bytes of the file `source` written to `out` (unbuffered) at its position, in the kernel
    where it can (copy_file_range)."""
    source.flush()
    copied = 0
    with contextlib.suppress(AttributeError, OSError):  # no copy_file_range here, or not between these files
        while copied < size:
            step = os.copy_file_range(source.fileno(), out.fileno(), size - copied, copied)
            if step <= 0:
                break
            copied += step
    source.seek(copied)
    while copied < size:
        chunk = source.read(min(size - copied, 2**24))
        if not chunk:
            raise OSError(f"the scratch copy of the host plane ends at byte {copied} of {size}")
        _write_all(out, chunk)
        copied += len(chunk)
