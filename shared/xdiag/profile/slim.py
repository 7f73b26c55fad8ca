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

The copy is made from the memory-mapped file: one compiled walk over each host line counts what stays (and, where
stat-less events may go, decodes the times of the others to check the nesting), a second copies it, so only the
host plane's and its lines' lengths are written anew. Every other byte (other planes, the host plane's metadata,
the other events, field order) is copied as it is. The lines are walked in up to four threads (the compiled code
releases the GIL), a few lines' bytes in memory at a time. 0.25 s for the 85 MiB profile with the Python events
alone, 0.45-0.5 s with the stat-less ones, on two cores.

`write_metadata_plane` writes a second, small copy: the metadata plane alone, which holds every HLO module and no
event. XProf extracts its `*.hlo_proto.pb` files (what its memory viewer reads) from it in milliseconds, where from
the whole file it parses every event again (0.4 s for the 85 MiB profile).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np

from xdiag.errors import ProfileError
from xdiag.profile import schema, wire
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


def _line_without(arr: np.ndarray, start: int, end: int, flags: np.ndarray, out: np.ndarray, name: str):
    kept, dropped, err, err_pos = wire.line_without_events(arr, start, end, flags, out)
    if err:
        raise ProfileError(f"{name}: the host line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")
    return kept, dropped


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


def _thinned(arr: np.ndarray, start: int, end: int, flags: np.ndarray, python_only: np.ndarray, async_stat: int,
             name: str) -> tuple[int, int, np.ndarray]:
    """(kept bytes, dropped events, the flags that give them) for one host line: every flag where leaving out its
    stat-less events is safe (`wire.thinned_line`), else the Python tracer's alone."""
    if flags is python_only:
        return (*_line_without(arr, start, end, flags, np.empty(0, np.uint8), name), flags)
    kept, dropped, kept_python, dropped_python, safe, err, err_pos = wire.thinned_line(
        arr, start, end, flags, async_stat)
    if err:
        raise ProfileError(f"{name}: the host line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")
    return (kept, dropped, flags) if safe else (kept_python, dropped_python, python_only)


def _metadata_flags(plane: schema.XPlane, unread_name: Callable[[str], bool] | None) -> np.ndarray:
    """`wire.line_without_events`'s flags, indexed by metadata id: DROP_EVENT for a Python function's events;
    DROP_WITHOUT_STATS where `unread_name` says XProf gives the name no meaning and the metadata carries nothing
    else (no stats, bytes or children) that XProf could read."""
    python = [key for key, meta in plane.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)]
    stat_less = [] if unread_name is None else [
        key for key, meta in plane.event_metadata.items()
        if not meta.name.startswith(PYTHON_EVENT_PREFIX) and not (meta.stats or meta.metadata or meta.child_id)
        and unread_name(meta.name)
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
    with source.open("rb") as handle, _mapped(handle) as buf:
        arr = np.frombuffer(buf, np.uint8)
        try:
            return _write(arr, buf, source.name, target, unread_name)
        finally:
            del arr  # the map cannot close while a view of it exists


def write_metadata_plane(source: Path, target: Path) -> bool:
    """Writes `source` to `target` with its metadata plane alone (and the XSpace's few other fields, the host
    names among them): the HLO modules, without a single event. False, writing nothing, where it has no
    metadata plane. Raises ProfileError where the file cannot be walked; a partial `target` is removed."""
    with source.open("rb") as handle, _mapped(handle) as buf:
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
        numbers, tags, starts, ends, wires = fields_of_plane
        metadata = plane_metadata(arr, start, fields_of_plane, name)
        flags = _metadata_flags(metadata, unread_name)
        if len(flags) == 0:
            return 0
        python_only = flags if not (flags == wire.DROP_WITHOUT_STATS).any() else np.where(
            flags == wire.DROP_EVENT, flags, 0).astype(np.uint8)
        async_stat = next((key for key, meta in metadata.stat_metadata.items() if meta.name == _ASYNC_STAT), -1)
        kept_lines: dict[int, tuple[int, np.ndarray]] = {}  # plane field -> (kept bytes, flags), lines that lose events
        dropped = 0
        lines = np.flatnonzero((numbers == _PLANE_LINES) & (wires == 2)).tolist()
        walked = _in_order(
            lambda i: _thinned(arr, int(starts[i]), int(ends[i]), flags, python_only, async_stat, name), lines)
        for i, (kept, line_dropped, line_flags) in zip(lines, walked):
            if line_dropped:
                kept_lines[i] = (kept, line_flags)
                dropped += line_dropped
        if dropped == 0:
            return 0
        plane_tag = fields[index - 1][2] if index else 0  # right after the field before it
        layout = (numbers, tags, starts, ends)
        _write_with_new_host_plane(arr, target, plane_tag, end, layout, kept_lines, name)
        return dropped
    return 0


def _write_with_new_host_plane(arr: np.ndarray, target: Path, plane_tag: int, plane_end: int, layout,
                               kept_lines: dict[int, tuple[int, np.ndarray]], name: str) -> None:
    """The file with the host plane's length and its thinned lines rewritten (keys stay: one byte each), all
    else copied; a few lines' bytes in memory at a time."""
    numbers, tags, starts, ends = layout

    def thinned_body(i: int) -> np.ndarray:
        kept, line_flags = kept_lines[i]
        body = np.empty(kept, np.uint8)
        if _line_without(arr, int(starts[i]), int(ends[i]), line_flags, body, name)[0] != len(body):
            raise ProfileError(f"{name}: the host line at byte {starts[i]} changed while it was copied")
        return body

    line_keys = {i: bytes([_ONE_BYTE_KEYS[_PLANE_LINES]]) + encode_varint(kept) for i, (kept, _) in kept_lines.items()}
    plane_bytes = sum(
        len(line_keys[i]) + kept_lines[i][0] if i in kept_lines else int(ends[i] - tags[i]) for i in range(len(numbers))
    )
    try:
        with target.open("wb") as out, contextlib.closing(_in_order(thinned_body, sorted(kept_lines))) as bodies:
            out.write(arr[:plane_tag])
            out.write(bytes([_ONE_BYTE_KEYS[1]]) + encode_varint(plane_bytes))
            for i in range(len(numbers)):
                if i not in kept_lines:
                    out.write(arr[tags[i] : ends[i]])
                    continue
                body = next(bodies)
                out.write(line_keys[i])
                out.write(body)
            out.write(arr[plane_end:])
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
