"""Reads XSpace files (`*.xplane.pb`) into a `Session`, one plane at a time.

The file is memory-mapped and its top-level fields are walked by hand, so only one
decoded XPlane exists at any moment; each plane is turned into numpy columns and its
protobuf objects are dropped before the next is parsed. A plane's lines are decoded a few at a
time in parallel threads (the compiled decoder releases the GIL) and assembled in file order. Anything that is not a readable
XSpace is refused with a `ProfileError` that says what is wrong and where.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import gc
import mmap
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from xdiag.errors import ProfileError
from xdiag.sizes import readable_size
from xdiag.profile import schema, wire
from xdiag.profile.columns import unique_with_inverse
from xdiag.profile.hlo_module import hlo_module
from xdiag.profile.locate import is_trace_file, open_regular
from xdiag.profile.read_bounds import check_deadline, read_deadline
from xdiag.profile.trace_json import read_trace_host
from xdiag.profile.space import (
    NO_VALUE,
    NUMERIC_STATS,
    STRING_STATS,
    HloModule,
    HostProfile,
    Line,
    Plane,
    Session,
    StatColumns,
    TimeColumn,
)

DEFAULT_MAX_PROFILE_BYTES = 2 * 1024**3
"""Refuse larger sessions by default: the managed service's own capture limit."""
MIN_LINE_BYTES = 16
"""A plane's lines take at least this many bytes each on average, or the plane is refused before its lines are
decoded: each line costs the analysis a Python object and its columns however few bytes it takes (200,000 empty
lines, 2 bytes each, took 20 s and 379 MiB to read, over 30 s under `xdiag analyze`), and the committed profiles'
planes take 645 bytes a line or more."""

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5
_XSPACE_FIELDS = {1: "planes", 2: "errors", 3: "warnings", 4: "hostnames"}

Progress = Callable[[str, int, int], None]
"""progress(what, done_bytes, total_bytes)"""


GLIBC = "libc.so.6"
"""glibc's soname, loaded by name: ctypes.util.find_library("c") runs `ldconfig -p` in a child process each time it is
asked, 4-7 ms (`xdiag analyze` asked twice, three times where it waits for XProf's views, its converter twice)."""


def return_freed_memory_to_the_os() -> None:
    """glibc's malloc keeps freed memory for reuse; the read frees each line's int64 decoder output once it is
    packed, between the packed columns it keeps, so that memory would stay in the process for good (a third of
    the 200 MiB bench profile's memory after the read). malloc_trim hands its free pages back. Only where the C
    library is glibc."""
    try:
        trim = ctypes.CDLL(GLIBC).malloc_trim
    except (OSError, AttributeError):
        return
    trim(ctypes.c_size_t(0))


M_ARENA_MAX = -8
"""glibc's mallopt parameter: how many arenas malloc may make (malloc.h)."""


def one_malloc_arena() -> None:
    """Has glibc's malloc serve every thread of the process from one arena: by default each thread that allocates
    gets an arena of its own (the read's, its decoding threads', a follow-up tool's), and memory one arena frees
    the others do not reuse. `xdiag analyze` of the 19.3 MiB CPU bench capture peaked at 144-152 MiB, with one arena
    117-124 MiB, in the same CPU time (8 runs alternating). A setting of the whole process, for a process of
    xdiag's own; it holds for the threads started after it. Only where the C library is glibc."""
    try:
        mallopt = ctypes.CDLL(GLIBC).mallopt
    except (OSError, AttributeError):
        return
    mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(1))


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ProfileError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProfileError(f"malformed varint at byte {pos}")


def _top_level_fields(buf, size: int, name: str) -> Iterator[tuple[int, int, int]]:
    """Yields (field number, start, end) of each length-delimited XSpace field."""
    pos = 0
    while pos < size:
        tag_at = pos
        key, pos = _varint(buf, pos, size)
        number, wire = key >> 3, key & 7
        if number not in _XSPACE_FIELDS or wire != _WIRE_LEN:
            raise ProfileError(
                f"{name}: not an XSpace profile (unexpected field {number} with wire type {wire} at byte {tag_at}); "
                "the file may be corrupt, mangled by a text-mode transfer, or not an *.xplane.pb"
            )
        length, pos = _varint(buf, pos, size)
        if length > size - pos:
            raise ProfileError(
                f"{name}: truncated: field {_XSPACE_FIELDS[number]!r} at byte {tag_at} declares {length} bytes "
                f"but only {size - pos} remain"
            )
        yield number, pos, pos + length
        pos += length


def plane_names(path: Path) -> list[str]:
    """The names of a file's planes, read from each plane's first fields without decoding its lines
    (milliseconds on any size): enough to tell a device profile from a CPU one before the read."""
    with open_regular(path) as handle:
        buf = _BytesRead(handle)
        return [plane_name(buf, start, end) for number, start, end in _top_level_fields(buf, len(buf), path.name)
                if number == 1]


class _BytesRead:
    """A file's bytes, read a block at a time where indexed: walking its top-level fields' headers reads a few
    blocks, not the whole file (reading the 19.3 MiB CPU bench capture into memory took 27 ms)."""

    BLOCK = 4096

    def __init__(self, handle) -> None:
        self._handle = handle
        self._size = os.fstat(handle.fileno()).st_size
        self._blocks: dict[int, bytes] = {}

    def __len__(self) -> int:
        return self._size

    def _read(self, start: int, length: int) -> bytes:
        got = os.pread(self._handle.fileno(), length, start)
        if len(got) < length:
            raise ProfileError(_shrank(self._handle, self._size, start + len(got)))
        return got

    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self._size)
            return self._read(start, max(stop - start, 0))
        index, offset = divmod(key, self.BLOCK)
        if index not in self._blocks:
            self._blocks[index] = self._read(index * self.BLOCK, min(self.BLOCK, self._size - index * self.BLOCK))
        return self._blocks[index][offset]


def plane_name(buf, start: int, end: int) -> str:
    """The name of the plane at [start, end), from its first fields ("" where it has none)."""
    pos = start
    while pos < end:  # XPlane: id (1, varint), then name (2); serialised in field order
        key, pos = _varint(buf, pos, end)
        if key & 7 == _WIRE_VARINT:
            _, pos = _varint(buf, pos, end)
            continue
        if key & 7 != _WIRE_LEN:
            break
        length, pos = _varint(buf, pos, end)
        if length > end - pos:
            break
        if key >> 3 == 2:
            return bytes(buf[pos:pos + length]).decode("utf-8", "replace")
        pos += length
    return ""


def _stat_value(stat, stat_names: dict[int, str]) -> object:
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    value = getattr(stat, kind)
    return schema.text(value) if kind == "str_value" else value


def _stats_dict(stats, stat_names: dict[int, str]) -> dict[str, object]:
    return {stat_names.get(s.metadata_id, str(s.metadata_id)): _stat_value(s, stat_names) for s in stats}


_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
READ_THREADS = max(1, min(4, _CPUS))
"""Lines decoded at once: the compiled decoder releases the GIL, so lines decode in parallel threads."""


def read_threads(busy_processes: int = 0) -> int:
    """Lines to decode at once while `busy_processes` other processes (XProf's conversions, which the analysis waits
    for) use this process's cores: the cores they leave, at least one. On two cores with two conversions running, the
    85 MiB bench profile's whole analysis took 3.61 s with one thread instead of 3.78 s (medians of 10 alternating),
    its read being off the critical path and op_stats on it (bench/README.md, "Measured design choices")."""
    return max(1, min(READ_THREADS, _CPUS - busy_processes))


def _wire_lines(arr: np.ndarray, spans: list[tuple[int, int]], columns: "_StatColumns", threads: int,
                ) -> Iterator[tuple]:
    """`decode_line` of each (start, end), packed (_packed), in order; up to `threads` lines decode at once,
    a few lines ahead of the caller (so memory holds only those beyond the lines already taken)."""

    def decode(span: tuple[int, int]) -> tuple:
        return _packed(wire.decode_line(
            arr, span[0], span[1], columns.table, columns.far_ids, columns.far_codes))

    if not spans:
        return
    yield decode(spans[0])  # in this thread: numba compiles or loads its cache once, not in every pool thread
    if threads < 2 or len(spans) < 3:
        yield from map(decode, spans[1:])
        return
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="xdiag-read") as pool:
        ahead = collections.deque(pool.submit(decode, span) for span in spans[1 : 1 + 2 * threads])
        following = iter(spans[1 + 2 * threads :])
        try:
            while ahead:
                decoded = ahead.popleft().result()
                span = next(following, None)
                if span is not None:
                    ahead.append(pool.submit(decode, span))
                yield decoded
        finally:
            for future in ahead:
                future.cancel()


def _packed(decoded: tuple) -> tuple:
    """A decoded line with its event columns in their narrow forms: times as TimeColumns, event-name ids in the
    narrowest type that holds them, stat event indexes as int32. Runs in the thread that decoded the line (numpy
    releases the GIL), so the decoder's int64 columns live there only briefly."""
    header, metadata_id, offset_ps, duration_ps, stat_event, stat_slot, stat_a, stat_b, err, err_pos = decoded
    if err:
        return (*decoded, 0)
    count = len(metadata_id)
    negative = int(np.count_nonzero(duration_ps < 0)) if count else 0
    if negative:  # no time runs backwards: read as 0 ps, and said once per plane (`_decode_plane`)
        np.maximum(duration_ps, 0, out=duration_ps)
    if count and metadata_id.min() >= 0 and metadata_id.max() < 2**31:
        top = int(metadata_id.max())
        metadata_id = metadata_id.astype(np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.int32)
    if count < 2**31:
        stat_event = stat_event.astype(np.int32)
    # The stats come grouped by slot (decode_line), each slot's in event order: `_decode_line`, in the caller's
    # thread, takes each slot's stats as a slice.
    starts, durations = TimeColumn.pack(offset_ps), TimeColumn.pack(duration_ps)
    return header, metadata_id, starts, durations, stat_event, stat_slot, stat_a, stat_b, err, err_pos, negative


_FEW_INLINE_TEXTS = 64  # fewer in a slot: one at a time (the compiled pass's call would cost more)


def _inline_texts(arr: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, intern: Callable[[str], int],
                  ) -> np.ndarray:
    """`intern` of each inline string (its `lengths[i]` bytes at `offsets[i]`, "" where the offset is negative), as
    int32 indexes in the order given; each distinct string is interned in the order of its first occurrence.

    Each distinct byte string is decoded once: the compiled pass (wire.distinct_strings) finds them with a hash
    table. The 87.6 MiB TPU v5e capture's 371,300 inline strings (117 distinct, 1,460 bytes) took 0.22-0.38 s of
    CPU one at a time, 0.06-0.09 s grouped by length and made unique by numpy's sorts, 0.01 s so."""
    count = len(offsets)
    if count < _FEW_INLINE_TEXTS:
        return np.array([intern(bytes(arr[o : o + n]).decode("utf-8", "replace") if o >= 0 else "")
                         for o, n in zip(offsets.tolist(), lengths.tolist())], dtype=np.int32)
    codes, firsts = wire.distinct_strings(arr, np.ascontiguousarray(offsets, dtype=np.int64),
                                          np.ascontiguousarray(lengths, dtype=np.int64))
    indexes = np.array([intern(bytes(arr[o : o + n]).decode("utf-8", "replace") if o >= 0 else "")
                        for o, n in zip(offsets[firsts].tolist(), lengths[firsts].tolist())], dtype=np.int32)
    return indexes[codes]


def _decode_line(
    arr: np.ndarray, start: int, decoded: tuple, stat_names: dict[int, str], columns: "_StatColumns",
    intern: Callable[[str], int], where: str,
) -> Line:
    header, metadata_id, starts, durations, stat_event, stat_slot, stat_a, stat_b, err, err_pos, _ = decoded
    if err:
        raise ProfileError(f"{where}: a line at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")

    def text(offset: int, length: int) -> str:
        return bytes(arr[offset : offset + length]).decode("utf-8", "replace") if offset >= 0 else ""

    count = len(metadata_id)
    numeric_columns = StatColumns(count, NO_VALUE, np.int64)
    string_columns = StatColumns(count, -1, np.int32)
    bounds = [0, *(np.flatnonzero(stat_slot[1:] != stat_slot[:-1]) + 1).tolist(), len(stat_slot)]
    for low, high in zip(bounds[:-1], bounds[1:]):  # the slots in ascending order (`_packed` sorted them)
        if low == high:
            continue
        slot = int(stat_slot[low])
        events, a, b = stat_event[low:high], stat_a[low:high], stat_b[low:high]
        if slot >= 0:
            numeric_columns.put(columns.numeric_names[slot], events, a.copy())  # not a view keeping every slot's
            continue
        values = np.empty(len(events), dtype=np.int32)
        is_ref = b < 0
        # Resolve each distinct reference once, each inline string (its own bytes in the file) in file order.
        refs, ref_inverse = unique_with_inverse(a[is_ref])
        values[is_ref] = np.array([intern(stat_names.get(int(r), "")) for r in refs], dtype=np.int32)[ref_inverse]
        if (~is_ref).any():
            values[~is_ref] = _inline_texts(arr, a[~is_ref], b[~is_ref], intern)
        string_columns.put(columns.string_names[-2 - slot], events, values)
    name = text(int(header[4]), int(header[5]))
    return Line(
        id=int(header[0]),
        name=name,
        display_name=text(int(header[6]), int(header[7])) or name,
        timestamp_ns=int(header[1]),
        metadata_id=metadata_id,
        starts=starts,
        durations=durations,
        numeric=numeric_columns,
        strings=string_columns,
    )


class _StatColumns:
    """Which stat-metadata ids of a plane become which event columns."""

    def __init__(self, stat_names: dict[int, str]):
        numeric = sorted((k, n) for k, n in stat_names.items() if n in NUMERIC_STATS)
        strings = sorted((k, n) for k, n in stat_names.items() if n in STRING_STATS)
        self.numeric_names = sorted({n for _, n in numeric})
        self.string_names = sorted({n for _, n in strings})
        codes = {k: self.numeric_names.index(n) for k, n in numeric}
        codes.update((k, -2 - self.string_names.index(n)) for k, n in strings)
        self.table, self.far_ids, self.far_codes = wire.stat_codes(codes)


_PLANE_METADATA_FIELDS = (1, 2, 4, 5, 6)  # id, name, event_metadata, stat_metadata, stats: all but the lines


def plane_fields(arr: np.ndarray, start: int, end: int, name: str) -> tuple[np.ndarray, ...]:
    """The fields of the plane at [start, end): (numbers, tag starts, value starts, value ends, wire types)."""
    numbers, tags, starts, ends, wires, err, err_pos = wire.scan_fields(arr, start, end)
    if err:
        raise ProfileError(f"{name}: the plane at byte {start} is corrupt: {wire.ERRORS[err]} near byte {err_pos}")
    return numbers, tags, starts, ends, wires


def plane_metadata(arr: np.ndarray, start: int, fields: tuple[np.ndarray, ...], name: str) -> schema.XPlane:
    """Everything of a plane but its lines (small), parsed as a protobuf message of its own."""
    numbers, tags, _, ends, _ = fields
    metadata = b"".join(bytes(arr[tags[i] : ends[i]]) for i in np.flatnonzero(np.isin(numbers, _PLANE_METADATA_FIELDS)))
    try:
        return schema.XPlane.FromString(metadata)
    except DecodeError as exc:
        raise ProfileError(f"{name}: the plane at byte {start} has corrupt metadata ({exc})") from None


def _decode_plane(
    arr: np.ndarray, start: int, end: int, host: str, modules: list[HloModule], name: str,
    release: Callable[[int, int], None], threads: int, deadline: float, notes: list[str] | None = None,
) -> Plane:
    fields = plane_fields(arr, start, end, name)
    numbers, _, starts, ends, _ = fields
    line_count = int((numbers == 3).sum())
    if line_count * MIN_LINE_BYTES > end - start:
        raise ProfileError(f"{name}: the plane at byte {start} holds {line_count:,} lines in {end - start:,} bytes "
                           f"(fewer than {MIN_LINE_BYTES} bytes a line): not a profiler's output; not read")
    proto = plane_metadata(arr, start, fields, name)
    stat_names = {key: schema.text(meta.name) for key, meta in proto.stat_metadata.items()}
    strings: list[str] = []
    string_index: dict[str, int] = {}

    def intern(value: str) -> int:
        index = string_index.get(value)
        if index is None:
            index = string_index[value] = len(strings)
            strings.append(value)
        return index

    event_names: dict[int, str] = {}
    display_names: dict[int, str] = {}
    metadata_stats: dict[int, dict[str, object]] = {}
    for key, meta in proto.event_metadata.items():
        event_names[key] = schema.text(meta.name)
        if meta.display_name:
            display_names[key] = schema.text(meta.display_name)
        if meta.stats:
            stats = {}
            for stat in meta.stats:
                stat_name = stat_names.get(stat.metadata_id, str(stat.metadata_id))
                if stat_name in ("Hlo Proto", "hlo_proto"):
                    module = hlo_module(stat.bytes_value, host, key, notes)
                    if module is not None:
                        modules.append(module)
                    continue
                value = _stat_value(stat, stat_names)
                if not isinstance(value, bytes):  # as the plane's stats: a session is stored as JSON (compact)
                    stats[stat_name] = value
            metadata_stats[key] = stats
    columns = _StatColumns(stat_names)
    lines = []
    spans = list(zip(starts[numbers == 3].tolist(), ends[numbers == 3].tolist()))
    decoded_lines = _wire_lines(arr, spans, columns, threads)
    negative = 0
    try:
        for (line_start, line_end), decoded in zip(spans, decoded_lines):
            negative += decoded[-1]
            lines.append(_decode_line(arr, line_start, decoded, stat_names, columns, intern, name))
            release(line_start, line_end)
            check_deadline(deadline, name, line_end)
    finally:
        decoded_lines.close()  # waits for the lines still decoding before the file can close
    if negative and notes is not None:
        notes.append(f"{name}: {negative:,} events of plane {schema.text(proto.name)} have a negative duration, "
                     f"read as 0 ps")
    return Plane(
        id=proto.id,
        name=schema.text(proto.name),
        host=host,
        event_names=event_names,
        event_display_names=display_names,
        event_metadata_stats=metadata_stats,
        stats={k: v for k, v in _stats_dict(proto.stats, stat_names).items() if not isinstance(v, bytes)},
        strings=strings,
        lines=lines,
    )


def _release(buf: mmap.mmap, start: int, end: int) -> None:
    """Drops a decoded line's file pages from memory: they are clean and never read again.

    Only whole pages inside [start, end) go, so a neighbour's bytes on a shared page stay."""
    page = mmap.PAGESIZE
    first = -(-start // page) * page
    last = end - end % page
    if hasattr(buf, "madvise") and last > first:
        buf.madvise(mmap.MADV_DONTNEED, first, last - first)


def _mangling_hint(buf, size: int) -> str:
    """Names the usual cause of a corrupt profile: a text-mode copy that replaced invalid UTF-8."""
    replaced = bytes(buf[: min(size, 1 << 20)]).count(b"\xef\xbf\xbd")
    if replaced < 16:
        return ""
    return (
        f"; it holds {replaced} copies of the bytes EF BF BD (U+FFFD) in its first MiB: it was mangled by a "
        "text-mode transfer that replaced invalid UTF-8; copy the original again as binary"
    )


READ_INTO_MEMORY_BYTES = 64 * 2**20
"""Files up to this size are read into memory rather than mapped: a mapped file that another process truncates
while it is read ends the process with SIGBUS on its next page (no Python exception can catch it). Larger files stay
mapped, their pages dropped as their lines are decoded (`_release`), and their size is checked again before each
plane (`check_size`): a shrink between that check and the plane's pages is the window left."""


def _shrank(handle, size: int, now: int) -> str:
    return (f"{Path(handle.name).name}: the file shrank from {size:,} to {now:,} bytes while it was read (another "
            f"process truncated or rewrote it); not read")


def check_size(handle, size: int) -> None:
    """A ProfileError where the open file is now shorter than the `size` it was mapped with."""
    now = os.fstat(handle.fileno()).st_size
    if now < size:
        raise ProfileError(_shrank(handle, size, now))


@contextlib.contextmanager
def _mapped(handle) -> Iterator[mmap.mmap]:
    """The file's bytes: read into memory up to READ_INTO_MEMORY_BYTES, else mapped read-only; unmapped on exit once no numpy view of it is left. The first call of
    the compiled decoder in a process (numba compiling or loading it) leaves the arguments in reference
    cycles of its internal exceptions, so a collection runs before the mapping is closed again; where a view
    still lives after that (an error's frames in a thread that walked it), the mapping is left to go with the
    last view rather than raise a BufferError over the error being reported. An empty file is a ProfileError."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        raise ProfileError(f"{Path(handle.name).name}: empty file (0 bytes); the capture wrote nothing")
    if size <= READ_INTO_MEMORY_BYTES:
        copy = bytearray(size)
        got = handle.readinto(copy)
        if got != size:
            raise ProfileError(_shrank(handle, size, got))
        yield copy
        return
    buf = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield buf
    except BaseException as exc:
        # The frames the error came through hold views of the map for as long as the error lives: without their
        # locals the map can close, and the caller gets the error (a corrupt line's ProfileError), not a BufferError.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        try:
            buf.close()
        except BufferError:
            gc.collect()
            with contextlib.suppress(BufferError):
                buf.close()


def read_host(path: Path, progress: Progress | None = None, threads: int = READ_THREADS,
              ) -> tuple[HostProfile, list[HloModule]]:
    """Reads one `*.xplane.pb`, decoding up to `threads` lines at once; raises ProfileError with a precise reason
    when it can't."""
    name = path.name
    if not path.exists():
        raise ProfileError(f"{path}: no such file")
    planes: list[Plane] = []
    modules: list[HloModule] = []
    texts: dict[str, list[str]] = {"errors": [], "warnings": [], "hostnames": []}
    wire.compile_now()
    with open_regular(path) as handle, _mapped(handle) as buf:
        size = len(buf)
        deadline = read_deadline(size)
        try:
            fields = list(_top_level_fields(buf, size, name))
        except ProfileError as exc:
            raise ProfileError(str(exc) + _mangling_hint(buf, size)) from None
        host = path.name.removesuffix(".xplane.pb")
        for number, start, end in fields:
            if number != 1:
                texts[_XSPACE_FIELDS[number]].append(bytes(buf[start:end]).decode("utf-8", "replace"))
        if texts["hostnames"]:
            host = texts["hostnames"][0]
        arr = np.frombuffer(buf, dtype=np.uint8)
        try:
            for number, start, end in fields:
                if number == 1:
                    if isinstance(buf, mmap.mmap):  # a copy in memory holds the bytes as they were
                        check_size(handle, size)
                    planes.append(_decode_plane(arr, start, end, host, modules, name, lambda a, b: _release(buf, a, b),
                                                threads, deadline, texts["warnings"]))
                    check_deadline(deadline, name, end)  # per plane too: 3M planes of no lines ran past 120 s
                    if progress:
                        progress(f"read {name}", end, size)
        finally:
            del arr  # the mmap cannot close while a numpy view of it exists
    known = [p for p in planes if p.name.startswith(("/host:", "/device:"))]
    if not known:
        raise ProfileError(f"{name}: no profile planes (/host:* or /device:*) found; not an XProf profile")
    return (
        HostProfile(
            hostname=host, path=path, size_bytes=size, planes=planes, errors=texts["errors"], warnings=texts["warnings"]
        ),
        modules,
    )


def _distinct_host_names(read: list[tuple[HostProfile, list[HloModule]]]) -> None:
    """Hosts that recorded the same hostname (containers, a default 'localhost') are told apart by file."""
    counts: dict[str, int] = {}
    for host, _ in read:
        counts[host.hostname] = counts.get(host.hostname, 0) + 1
    for host, host_modules in read:
        if counts[host.hostname] > 1:
            name = f"{host.hostname}:{host.path.name.removesuffix('.xplane.pb')}"
            for item in (*host.planes, *host_modules):
                item.host = name
            host.hostname = name


def read_session_in_process(paths: list[Path], name: str | None = None, max_bytes: int = DEFAULT_MAX_PROFILE_BYTES,
                            progress: Progress | None = None, threads: int = READ_THREADS) -> Session:
    """Every host file of one capture read into a Session in this process, every host's columns at once (see
    xdiag.profile.session.read_session, which reads a session of several hosts host by host instead), decoding up
    to `threads` lines at once."""
    session_bytes(paths, max_bytes)
    read = [(read_trace_host(path), []) if is_trace_file(path) else read_host(path, progress, threads)
            for path in sorted(paths)]
    session = assemble_session(read, name or paths[0].parent.name)
    return_freed_memory_to_the_os()
    return session


def session_bytes(paths: list[Path], max_bytes: int) -> int:
    """The session's size, all its files together; a ProfileError where it has none or is over `max_bytes`."""
    if not paths:
        raise ProfileError("no *.xplane.pb files in the session")
    total = sum(p.stat().st_size for p in paths if p.exists())
    if total > max_bytes:
        raise ProfileError(
            f"profile is {readable_size(total)}, over the {readable_size(max_bytes)} limit; "
            "capture a shorter window or raise --max-profile-gib"
        )
    return total


MAX_SHIFT_PS = 2**62
"""The furthest any time of a session may lie from its first line, in ps (about 53 days), a line's start and its
events' offsets and durations added: times are int64 ps, and a sum past 2^63 would wrap without a word."""


def shift_line(line: Line, shift_ps: int, file: str, plane: str) -> None:
    """`line`'s times moved by `shift_ps` (from its own timestamp to the session's first line); ProfileError where
    one of them would then lie past MAX_SHIFT_PS either way: the shift alone, or with an event's offset or length."""
    if shift_ps > MAX_SHIFT_PS:
        raise ProfileError(
            f"{file}: line {line.name!r} of {plane} starts {shift_ps // 1000:,} ns ({shift_ps / 8.64e16:,.0f} days) "
            f"after the session's first line, past the {MAX_SHIFT_PS // 1000:,} ns a time in ps is read with; its "
            "clocks do not agree")
    earliest = line.starts.least() + shift_ps
    latest = line.starts.most() + line.durations.most() + shift_ps  # no event ends later
    if earliest < -MAX_SHIFT_PS or latest > MAX_SHIFT_PS:
        raise ProfileError(
            f"{file}: line {line.name!r} of {plane} holds events {max(-earliest, latest) // 1000:,} ns from the "
            f"session's first line (their offsets and lengths added), past the {MAX_SHIFT_PS // 1000:,} ns a time in "
            "ps is read with; not a profiler's times")
    line.starts.shift(shift_ps)


def assemble_session(read: list[tuple[HostProfile, list[HloModule]]], name: str) -> Session:
    """The session of its hosts as read (in the session's file order): hosts of one hostname told apart, every
    line's times from the session's earliest line, each HLO module once."""
    _distinct_host_names(read)
    hosts = [host for host, _ in read]
    modules = [module for _, host_modules in read for module in host_modules]
    timestamps = [line.timestamp_ns for h in hosts for p in h.planes for line in p.lines if len(line)]
    origin = min(timestamps) if timestamps else 0
    for host in hosts:
        for plane in host.planes:
            for line in plane.lines:
                if not len(line):
                    continue
                shift_line(line, (line.timestamp_ns - origin) * 1000, host.path.name, plane.name)
    unique: dict[tuple[str, int], HloModule] = {}
    for module in modules:
        unique.setdefault((module.name, module.program_id), module)
    return Session(name=name, hosts=hosts, hlo_modules=list(unique.values()), origin_ns=origin)


def warm_up() -> None:
    """Reads a two-event profile, so numba compiles the wire decoder into its cache (next to wire.py)
    now rather than on the first analysis (`make install` runs this; a fresh checkout compiles once)."""
    import tempfile

    space = schema.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    for stat_id, stat_name in ((1, "step_num"), (2, "hlo_op")):
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = stat_name
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "step"
    line = plane.lines.add(id=1, name="warm-up", timestamp_ns=1)
    for offset in (0, 10):
        event = line.events.add(metadata_id=1, offset_ps=offset, duration_ps=5)
        event.stats.add(metadata_id=1, int64_value=offset)
        event.stats.add(metadata_id=2, str_value="op")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "warm-up.xplane.pb"
        path.write_bytes(space.SerializeToString())
        read_session_in_process([path])


if __name__ == "__main__":
    warm_up()
