"""A copy of a profile without the Python tracer's events, for XProf's converters.

The JAX and TensorFlow profilers record every Python call while their Python tracer is on (jax.profiler's
default): host-plane events named `$file.py:line function`, with no stats. They are most of a host plane's
events (234,000 of 295,000 in tests/profiles/h200/recompilation) and most of its bytes. XProf's converters
that xdiag runs (op_stats and everything that reads it, memory_profile, smart_suggestion, utilization) parse and
group them only to leave them out of their answers: on every real device profile here, and on the 85 MiB bench
profile, every view is the same without them (tests/test_xprof_views.py compares them). The op_stats conversion
of that profile takes 1.9 s instead of 6.0 s. XProf's trace viewer shows them, so the viewer keeps serving the
originals.

The copy is made from the memory-mapped file, never parsing an event: one compiled pass over each host line
(`wire.line_without_events`) counts what stays, a second copies it, so only the host plane's and its lines'
lengths are written anew. Every other byte (other planes, the host plane's metadata, the other events, field
order) is copied as it is. An event is dropped only when its first field names Python metadata; anything else
is kept. 0.18 s for the 85 MiB profile.

`write_metadata_plane` writes a second, small copy: the metadata plane alone, which holds every HLO module and no
event. XProf extracts its `*.hlo_proto.pb` files (what its memory viewer reads) from it in milliseconds, where from
the whole file it parses every event again (0.4 s for the 85 MiB profile).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

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


def _line_without(arr: np.ndarray, start: int, end: int, python_metadata: np.ndarray, out: np.ndarray, name: str):
    kept, dropped, err, err_pos = wire.line_without_events(arr, start, end, python_metadata, out)
    if err:
        raise ProfileError(f"{name}: the host line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")
    return kept, dropped


def _python_metadata_flags(plane: schema.XPlane) -> np.ndarray:
    python = [key for key, meta in plane.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)]
    if not python or min(python) < 0 or max(python) >= _MAX_FLAGGED_ID:
        return np.zeros(0, np.uint8)  # ids beyond a small table (not written so by any profiler seen): keep all
    flags = np.zeros(max(python) + 1, np.uint8)  # indexed by metadata id: 1 for a Python function's
    flags[python] = 1
    return flags


def write_without_python_events(source: Path, target: Path) -> int:
    """Writes `source` to `target` without its host plane's Python-tracer events and returns how many it
    dropped. With none to drop it writes nothing and returns 0 (link the original instead). Raises
    ProfileError where the file cannot be walked (the reader says the same, precisely); a partial
    `target` is removed."""
    with source.open("rb") as handle, _mapped(handle) as buf:
        arr = np.frombuffer(buf, np.uint8)
        try:
            return _write(arr, buf, source.name, target)
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


def _write(arr: np.ndarray, buf, name: str, target: Path) -> int:
    fields = list(_top_level_fields(buf, len(buf), name))
    for index, (number, start, end) in enumerate(fields):
        if number != 1:
            continue
        if plane_name(buf, start, end) != HOST_THREADS_PLANE:
            continue
        fields_of_plane = plane_fields(arr, start, end, name)
        numbers, tags, starts, ends, wires = fields_of_plane
        python_metadata = _python_metadata_flags(plane_metadata(arr, start, fields_of_plane, name))
        if len(python_metadata) == 0:
            return 0
        nothing = np.empty(0, np.uint8)
        kept_bytes: dict[int, int] = {}  # plane field -> its line's kept bytes, for lines that lose events
        dropped = 0
        for i in np.flatnonzero((numbers == _PLANE_LINES) & (wires == 2)).tolist():
            kept, line_dropped = _line_without(arr, int(starts[i]), int(ends[i]), python_metadata, nothing, name)
            if line_dropped:
                kept_bytes[i] = kept
                dropped += line_dropped
        if dropped == 0:
            return 0
        plane_tag = fields[index - 1][2] if index else 0  # right after the field before it
        layout = (numbers, tags, starts, ends)
        _write_with_new_host_plane(arr, target, plane_tag, end, layout, kept_bytes, python_metadata, name)
        return dropped
    return 0


def _write_with_new_host_plane(arr: np.ndarray, target: Path, plane_tag: int, plane_end: int, layout,
                               kept_bytes: dict[int, int], python_metadata: np.ndarray, name: str) -> None:
    """The file with the host plane's length and its thinned lines rewritten (keys stay: one byte each), all
    else copied; one line's bytes in memory at a time."""
    numbers, tags, starts, ends = layout
    line_keys = {i: bytes([_ONE_BYTE_KEYS[_PLANE_LINES]]) + encode_varint(kept) for i, kept in kept_bytes.items()}
    plane_bytes = sum(
        len(line_keys[i]) + kept_bytes[i] if i in kept_bytes else int(ends[i] - tags[i]) for i in range(len(numbers))
    )
    try:
        with target.open("wb") as out:
            out.write(arr[:plane_tag])
            out.write(bytes([_ONE_BYTE_KEYS[1]]) + encode_varint(plane_bytes))
            for i in range(len(numbers)):
                if i not in kept_bytes:
                    out.write(arr[tags[i] : ends[i]])
                    continue
                body = np.empty(kept_bytes[i], np.uint8)
                if _line_without(arr, int(starts[i]), int(ends[i]), python_metadata, body, name)[0] != len(body):
                    raise ProfileError(f"{name}: the host line at byte {starts[i]} changed while it was copied")
                out.write(line_keys[i])
                out.write(body)
            out.write(arr[plane_end:])
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise
