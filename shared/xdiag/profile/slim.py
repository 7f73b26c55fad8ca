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
it is. The lines are walked in up to four threads (the compiled code releases the GIL), a few lines' bytes in memory
at a time; the new host plane goes through a scratch file, as its length comes before it. 0.2 s (0.33 s of CPU) for
the 85 MiB profile on two cores, where a count walk followed by a copy walk took 0.3 s (0.55 s of CPU).

`write_metadata_plane` writes a second, small copy: the metadata plane alone, which holds every HLO module and no
event. XProf extracts its `*.hlo_proto.pb` files (what its memory viewer reads) from it in milliseconds, where from
the whole file it parses every event again (0.4 s for the 85 MiB profile).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

from xdiag.errors import ProfileError
from xdiag.profile import schema, wire
from xdiag.profile.locate import open_regular
from xdiag.profile.reader import _mapped, _top_level_fields, plane_fields, plane_metadata, plane_name

HOST_THREADS_PLANE = "/host:CPU"
"""XProf's host plane (kHostThreadsPlaneName): where the Python tracer's events are."""
METADATA_PLANE = "/host:metadata"
"""XProf's metadata plane (kMetadataPlaneName): where the profilers put each HLO module, and no events."""
PYTHON_EVENT_PREFIX = "$"
"""How the Python tracer names its events (`$file.py:line function`, `$builtins len`)."""
_THREADS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
"""Threads that walk the host lines at once."""
_T = TypeVar("_T")
_ASYNC_STAT = "_a"
"""The stat that marks an event asynchronous (XProf's kIsAsync): XProf leaves such events out of its nesting."""

_PLANE_LINES = 3
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


def _in_order(function: Callable[[int], _T], items: list[int]) -> Iterator[_T]:
    """`function` of each item, in order, computed in up to `_THREADS` threads (the compiled walks release the GIL)
    at most `_THREADS` items ahead of the one consumed: the copy holds a few lines' bytes at a time."""
    threads = min(_THREADS, len(items))
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


def write_without_unused_events(source: Path, target: Path, unread_name: Callable[[str], bool] | None = None) -> int:
    """Writes `source` to `target` without the host-plane events XProf's converters make no use of and returns how
    many it dropped: the Python tracer's events and, where `unread_name` is given, the events without stats whose
    names it says XProf gives no meaning, on the lines where that keeps every other event's parent in XProf's
    grouping (`wire.thinned_line`). With none to drop it writes
    nothing and returns 0 (link the original instead). Raises ProfileError where the file cannot be walked (the
    reader says the same, precisely); a partial `target` is removed."""
    with open_regular(source) as handle, _mapped(handle) as buf:
        arr = np.frombuffer(buf, np.uint8)
        try:
            return _write(arr, buf, source.name, target, unread_name)
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


def _write(arr: np.ndarray, buf, name: str, target: Path, unread_name: Callable[[str], bool] | None) -> int:
    fields = list(_top_level_fields(buf, len(buf), name))
    for index, (number, start, end) in enumerate(fields):
        if number != 1:
            continue
        if plane_name(buf, start, end) != HOST_THREADS_PLANE:
            continue
        fields_of_plane = plane_fields(arr, start, end, name)
        metadata = plane_metadata(arr, start, fields_of_plane, name)
        flags = _metadata_flags(metadata, unread_name)
        if len(flags) == 0:
            return 0
        async_stat = next((key for key, meta in metadata.stat_metadata.items() if schema.text(meta.name) == _ASYNC_STAT), -1)
        plane_tag = fields[index - 1][2] if index else 0  # right after the field before it
        return _write_with_new_host_plane(arr, target, (plane_tag, end), fields_of_plane, flags, async_stat, name)
    return 0


def _write_with_new_host_plane(arr: np.ndarray, target: Path, plane_span: tuple[int, int], fields_of_plane,
                               flags: np.ndarray, async_stat: int, name: str) -> int:
    """Writes the file with the host plane's lines thinned and returns how many events went (0: nothing written).

    Each line is thinned in one walk, in threads, a few lines' bytes in memory at a time, into a scratch file
    beside `target`: the plane's length, written before it, is known only once every line is walked. Every other
    byte is copied as it is, the keys too (one byte each)."""
    plane_tag, plane_end = plane_span
    numbers, tags, starts, ends, wires = fields_of_plane
    stat_less = bool((flags == wire.DROP_WITHOUT_STATS).any())
    lines = np.flatnonzero((numbers == _PLANE_LINES) & (wires == 2)).tolist()
    dropped = 0
    with tempfile.TemporaryFile(dir=target.parent) as plane:
        with contextlib.closing(_in_order(
                lambda i: _thinned(arr, int(starts[i]), int(ends[i]), flags, stat_less, async_stat, name), lines)
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
        if dropped == 0:
            return 0
        plane_bytes = plane.tell()
        try:
            with target.open("wb", buffering=0) as out:
                _write_all(out, arr[:plane_tag])
                _write_all(out, bytes([_ONE_BYTE_KEYS[1]]) + encode_varint(plane_bytes))
                _append(plane, out, plane_bytes)
                _write_all(out, arr[plane_end:])
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(target)
            raise
    return dropped


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
