"""Protobuf wire-format decoding of XSpace's bulk data, compiled with numba.

The events of a profile are most of its bytes. Decoding them through protobuf objects
costs a Python object per event and a Python loop to turn them into columns; here the
events of one XLine go straight from the memory-mapped file into numpy columns. Only the
small parts (plane metadata, HLO protos) go through protobuf messages.

Every function returns an error code instead of raising (numba), with the byte position
where decoding failed; `reader.py` turns that into a ProfileError.

Compiled ahead of time where it can be: `python -m xdiag.profile.build_wire` (`make install` runs it)
writes `_wire_compiled*.so` next to this file, an extension module that needs neither numba nor
LLVM at run time (numba's import and first call cost ~0.6 s CPU and ~150 MB of memory per
process). Without it (no C compiler at install, `XDIAG_WIRE_JIT=1`), the same functions are
compiled by numba on first use and cached in `__pycache__`. Both release the GIL while they run,
so the reader decodes lines in parallel threads.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

SOURCE_STAMP = Path(__file__).with_name("_wire_compiled.source")
"""The sha256 of the wire.py and build_wire.py the ahead-of-time module was built from: a module built from
another version of either (other code, other compiler flags) is not used."""


def source_digest() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(Path(__file__).with_name("build_wire.py").read_bytes())
    return digest.hexdigest()


def _load_ahead_of_time():
    if os.environ.get("XDIAG_WIRE_JIT") == "1":
        return None
    try:
        from xdiag.profile import _wire_compiled
    except ImportError:
        return None
    try:
        built_from = SOURCE_STAMP.read_text().strip()
    except OSError:
        return None
    return _wire_compiled if built_from == source_digest() else None


_ahead_of_time = _load_ahead_of_time()


def njit(**options):
    """numba's njit where the ahead-of-time module is missing; otherwise the plain function (only the
    ahead-of-time build compiles it), so numba is never imported."""
    if _ahead_of_time is not None:
        return lambda function: function
    from numba import njit as numba_njit

    return numba_njit(**options)


NO_VALUE = np.iinfo(np.int64).min

OK = 0
ERR_VARINT = 1  # a varint runs past the end or over 10 bytes
ERR_LENGTH = 2  # a length-delimited field runs past its parent's end
ERR_WIRE_TYPE = 3  # a wire type that protobuf does not have (groups included)
ERR_EVENT_BUDGET = 4  # more events than the line's bytes hold at MIN_EVENT_BYTES each

MIN_EVENT_BYTES = 6
"""The bytes an XEvent takes at least, on average over its line: its key and length, a metadata id and an offset
take 6 (the committed profiles' lines take 16 or more an event). A line of more events than that decodes no further:
what the analysis holds grows with the events, whatever they carry (20 MB of empty events, 2 bytes each, peaked at
522 MiB in 25 s under `xdiag analyze`), so this bounds it by the file's size."""

ERRORS = {
    ERR_VARINT: "malformed or truncated varint",
    ERR_LENGTH: "a field's length runs past the end of its message (truncated or corrupt)",
    ERR_WIRE_TYPE: "invalid wire type (not protobuf data)",
    ERR_EVENT_BUDGET: f"more events than its bytes hold at {MIN_EVENT_BYTES} bytes an event (not a profiler's output)",
}


@njit(cache=True, nogil=True)
def _varint(buf, pos, end):
    """(value as int64, next position); next position -1 on error."""
    result = np.uint64(0)
    shift = np.uint64(0)
    while pos < end:
        byte = np.uint64(buf[pos])
        pos += 1
        result |= (byte & np.uint64(0x7F)) << shift
        if byte < np.uint64(0x80):
            return np.int64(result), pos
        shift += np.uint64(7)
        if shift > np.uint64(63):
            return np.int64(0), -1
    return np.int64(0), -1


@njit(cache=True, nogil=True)
def _skip(buf, pos, end, wire):
    """Position after a field's value of this wire type; -1 varint error, -2 length error, -3 bad type."""
    if wire == 0:
        _, pos = _varint(buf, pos, end)
        return pos
    if wire == 1:
        return pos + 8 if pos + 8 <= end else -2
    if wire == 2:
        length, pos = _varint(buf, pos, end)
        if pos < 0:
            return -1
        return pos + length if 0 <= length <= end - pos else -2
    if wire == 5:
        return pos + 4 if pos + 4 <= end else -2
    return -3


@njit(cache=True, nogil=True)
def scan_fields(buf, start, end):
    """The top-level fields of one message: (numbers, tag starts, value starts, value ends, wires, err, err_pos).

    For length-delimited fields the value range excludes the length prefix."""
    count = 0
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            break
        pos = _skip(buf, pos, end, key & 7)
        if pos < 0:
            break
        count += 1
    numbers = np.empty(count, np.int64)
    tags = np.empty(count, np.int64)
    starts = np.empty(count, np.int64)
    ends = np.empty(count, np.int64)
    wires = np.empty(count, np.int64)
    pos = start
    for i in range(count):
        tags[i] = pos
        key, pos = _varint(buf, pos, end)
        wire = key & 7
        numbers[i] = key >> 3
        wires[i] = wire
        if wire == 2:
            length, pos = _varint(buf, pos, end)
            starts[i] = pos
            ends[i] = pos + length
            pos = pos + length
        else:
            starts[i] = pos
            pos = _skip(buf, pos, end, wire)
            ends[i] = pos
    if pos == end:
        return numbers, tags, starts, ends, wires, OK, end
    # Find why we stopped, for the error message.
    key, after = _varint(buf, pos, end)
    if after < 0:
        return numbers, tags, starts, ends, wires, ERR_VARINT, pos
    nxt = _skip(buf, after, end, key & 7)
    return numbers, tags, starts, ends, wires, (ERR_WIRE_TYPE if nxt == -3 else ERR_LENGTH if nxt == -2 else ERR_VARINT), pos


@njit(cache=True, nogil=True)
def _slot(sorted_ids, slots, stat_id):
    """The slot of `stat_id` among the sorted ids, -1 where it has none."""
    low = 0
    high = len(sorted_ids)
    while low < high:
        middle = (low + high) >> 1
        if sorted_ids[middle] < stat_id:
            low = middle + 1
        else:
            high = middle
    if low < len(sorted_ids) and sorted_ids[low] == stat_id:
        return slots[low]
    return -1


NO_ROOM = -1
"""`_decode_events`' answer where an event or its stats do not fit the columns given: grow them and go on."""


@njit(cache=True, nogil=True)
def _decode_events(buf, line_start, pos, end, table, far_ids, far_codes, e, k,
                   metadata_id, offset_ps, duration_ps, stat_event, stat_slot, stat_a, stat_b, header, scratch,
                   scratch_double):
    """Decodes a line's fields from `pos` on into the columns, from event `e` and kept stat `k` on.

    Kept stats are recorded sparsely as (event, slot, a, b): numeric slots are >= 0 with the value in a;
    string slots are encoded as -2 - slot with (ref id, -1) or (byte offset, length) in (a, b).
    Returns (pos, events, kept stats, code, error position): code OK at the end of the line; NO_ROOM where an
    event or its stats did not fit, with pos, events and kept stats as they were before that event; else an
    error code. The columns are parameters, never reassigned here: numba compiled a loop that grew them itself
    4x slower (4.3 against 1.0 s for the 200 MiB bench profile's lines). A varint of one byte (keys, ids, most
    lengths) is read here rather than by a call to `_varint` (the 87.6 MiB TPU capture's lines: 0.77 against 1.0 s),
    and a double into a scratch word rather than a copy of its 8 bytes (an allocation a stat); the longer varints
    of the events' times and the stats' values by `_varint`'s loop written out (0.225-0.235 against 0.239-0.255 s,
    3 rounds alternating)."""
    while pos < end:
        field_start = pos
        if pos < end and buf[pos] < 128:
            key = np.int64(buf[pos])
            pos += 1
        else:
            key, pos = _varint(buf, pos, end)
        if pos < 0:
            return field_start, e, k, ERR_VARINT, field_start
        number = key >> 3
        wire = key & 7
        if number == 4 and wire == 2:
            if pos < end and buf[pos] < 128:
                length = np.int64(buf[pos])
                pos += 1
            else:
                length, pos = _varint(buf, pos, end)
            if pos < 0:
                return field_start, e, k, ERR_VARINT, field_start
            if length < 0 or length > end - pos:  # before any sum: a length near 2^63 wraps pos + length
                return field_start, e, k, ERR_LENGTH, field_start
            event_end = pos + length
            if e == len(metadata_id):
                return field_start, e, k, NO_ROOM, 0
            k_before = k
            metadata_id[e] = 0
            offset_ps[e] = 0
            duration_ps[e] = 0
            while pos < event_end:
                if pos < event_end and buf[pos] < 128:
                    ekey = np.int64(buf[pos])
                    pos += 1
                else:
                    ekey, pos = _varint(buf, pos, event_end)
                if pos < 0:
                    return field_start, e, k, ERR_VARINT, event_end
                enum = ekey >> 3
                ewire = ekey & 7
                if ewire == 0 and enum <= 3:
                    if pos < event_end and buf[pos] < 128:
                        value = np.int64(buf[pos])
                        pos += 1
                    else:
                        result = np.uint64(0)
                        shift = np.uint64(0)
                        done = False
                        while pos < event_end and shift <= np.uint64(63):
                            byte = np.uint64(buf[pos])
                            pos += 1
                            result |= (byte & np.uint64(0x7F)) << shift
                            if byte < np.uint64(0x80):
                                done = True
                                break
                            shift += np.uint64(7)
                        value = np.int64(result)
                        if not done:
                            pos = -1
                    if pos < 0:
                        return field_start, e, k, ERR_VARINT, event_end
                    if enum == 1:
                        metadata_id[e] = value
                    elif enum == 2:
                        offset_ps[e] = value
                    else:
                        duration_ps[e] = value
                elif enum == 4 and ewire == 2:
                    stat_start = pos
                    if pos < event_end and buf[pos] < 128:
                        slen = np.int64(buf[pos])
                        pos += 1
                    else:
                        slen, pos = _varint(buf, pos, event_end)
                    if pos < 0 or slen < 0 or slen > event_end - pos:
                        return field_start, e, k, ERR_LENGTH, stat_start
                    stat_end = pos + slen
                    stat_id = np.int64(-1)
                    kind = np.int64(0)
                    a = np.int64(0)
                    b = np.int64(-1)
                    while pos < stat_end:
                        if pos < stat_end and buf[pos] < 128:
                            skey = np.int64(buf[pos])
                            pos += 1
                        else:
                            skey, pos = _varint(buf, pos, stat_end)
                        if pos < 0:
                            return field_start, e, k, ERR_VARINT, stat_end
                        snum = skey >> 3
                        swire = skey & 7
                        if snum == 1 and swire == 0:
                            if pos < stat_end and buf[pos] < 128:
                                stat_id = np.int64(buf[pos])
                                pos += 1
                            else:
                                stat_id, pos = _varint(buf, pos, stat_end)
                        elif swire == 0 and (snum == 3 or snum == 4 or snum == 7):
                            if pos < stat_end and buf[pos] < 128:
                                a = np.int64(buf[pos])
                                pos += 1
                            else:
                                result = np.uint64(0)
                                shift = np.uint64(0)
                                done = False
                                while pos < stat_end and shift <= np.uint64(63):
                                    byte = np.uint64(buf[pos])
                                    pos += 1
                                    result |= (byte & np.uint64(0x7F)) << shift
                                    if byte < np.uint64(0x80):
                                        done = True
                                        break
                                    shift += np.uint64(7)
                                a = np.int64(result)
                                if not done:
                                    pos = -1
                            kind = snum
                        elif snum == 2 and swire == 1 and pos + 8 <= stat_end:
                            for byte in range(8):  # into a scratch word: a copy of the slice allocated each time
                                scratch[byte] = buf[pos + byte]
                            a = np.int64(scratch_double[0])
                            kind = 2
                            pos += 8
                        elif snum == 5 and swire == 2:
                            if pos < stat_end and buf[pos] < 128:
                                b = np.int64(buf[pos])
                                pos += 1
                            else:
                                b, pos = _varint(buf, pos, stat_end)
                            if pos < 0 or b < 0 or b > stat_end - pos:  # a negative one would walk back forever
                                return field_start, e, k, ERR_LENGTH, stat_start
                            a = pos
                            kind = 5
                            pos += b
                        else:
                            pos = _skip(buf, pos, stat_end, swire)
                        if pos < 0 or pos > stat_end:
                            return field_start, e, k, ERR_LENGTH, stat_start
                    code = np.int64(-1)  # the stat's column: a slot >= 0 numeric, -2 - slot a string, -1 none
                    if 0 <= stat_id < len(table):
                        code = table[stat_id]
                    elif len(far_ids):
                        code = _slot(far_ids, far_codes, stat_id)
                    slot = -1
                    if kind == 2 or kind == 3 or kind == 4:
                        if code >= 0:
                            slot = code
                        b = -1
                    elif kind == 5 or kind == 7:
                        if code <= -2:
                            slot = code
                            if kind == 7:
                                b = -1
                    if slot != -1:
                        if k == len(stat_event):
                            return field_start, e, k_before, NO_ROOM, 0
                        stat_event[k] = e
                        stat_slot[k] = slot
                        stat_a[k] = a
                        stat_b[k] = b
                        k += 1
                else:
                    pos = _skip(buf, pos, event_end, ewire)
                    if pos < 0:
                        return field_start, e, k, ERR_LENGTH, field_start
            e += 1
        elif wire == 0:
            if pos < end and buf[pos] < 128:
                value = np.int64(buf[pos])
                pos += 1
            else:
                value, pos = _varint(buf, pos, end)
            if number == 1:
                header[0] = value
            elif number == 3:
                header[1] = value
            elif number == 9:
                header[2] = value
            elif number == 10:
                header[3] = value
        elif wire == 2 and (number == 2 or number == 11):
            if pos < end and buf[pos] < 128:
                length = np.int64(buf[pos])
                pos += 1
            else:
                length, pos = _varint(buf, pos, end)
            if pos < 0 or length < 0 or length > end - pos:  # a negative one would walk back forever
                return field_start, e, k, ERR_LENGTH, field_start
            slot = 4 if number == 2 else 6
            header[slot] = pos
            header[slot + 1] = length
            pos += length
        else:
            pos = _skip(buf, pos, end, wire)
        if pos < 0 or pos > end:
            return field_start, e, k, ERR_LENGTH, field_start
    return pos, e, k, OK, end


TABLE_IDS = 1 << 12
"""Stat-metadata ids below this are looked up in `decode_line`'s table (the profilers number them from 1, a few
dozen a plane: the table is as long as the largest kept one, 32 KiB at most a plane); any others (a hostile file's)
by a search among `far_ids`."""


def stat_codes(codes: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`decode_line`'s (table, far_ids, far_codes) for the kept stats' codes by stat-metadata id."""
    near = {key: code for key, code in codes.items() if 0 <= key < TABLE_IDS}
    table = np.full(max(near, default=-1) + 1, -1, dtype=np.int64)
    for key, code in near.items():
        table[key] = code
    far = sorted((key, code) for key, code in codes.items() if key not in near)
    return (table, np.array([key for key, _ in far], dtype=np.int64),
            np.array([code for _, code in far], dtype=np.int64))


@njit(cache=True, nogil=True)
def _resized(column, used, size):
    """A column of `size`, the first `used` of `column` kept."""
    bigger = np.empty(size, np.int64)
    bigger[:used] = column[:used]
    return bigger


@njit(cache=True, nogil=True)
def _grown(column, used):
    """A column twice the size of `column` (growing costs time linear in the final size), its first `used` kept."""
    return _resized(column, used, max(64, 2 * len(column)))


GUESS_EVENT_BYTES = 32
"""`decode_line` first makes room for an event per this many bytes of its line, and for a kept stat per
GUESS_STAT_BYTES (the committed TPU captures take 50-60 bytes an event and 24 a kept stat): room not written to
costs no memory (its pages are never touched), while each time the columns grow they are copied."""
GUESS_STAT_BYTES = 16


@njit(cache=True, nogil=True)
def _by_slot(used, stat_event, stat_slot, stat_a, stat_b):
    """The first `used` kept stats grouped by slot, the slots in ascending order and each slot's stats in event
    order (a counting sort: the slots are a few dozen), as four new columns of their exact size."""
    low = np.int64(0)
    high = np.int64(-1)
    for i in range(used):
        if i == 0 or stat_slot[i] < low:
            low = stat_slot[i]
        if i == 0 or stat_slot[i] > high:
            high = stat_slot[i]
    starts = np.zeros(high - low + 2, np.int64)
    for i in range(used):
        starts[stat_slot[i] - low + 1] += 1
    for j in range(1, len(starts)):
        starts[j] += starts[j - 1]
    events = np.empty(used, np.int64)
    slots = np.empty(used, np.int64)
    a = np.empty(used, np.int64)
    b = np.empty(used, np.int64)
    for i in range(used):
        j = starts[stat_slot[i] - low]
        starts[stat_slot[i] - low] = j + 1
        events[j] = stat_event[i]
        slots[j] = stat_slot[i]
        a[j] = stat_a[i]
        b[j] = stat_b[i]
    return events, slots, a, b


@njit(cache=True, nogil=True)
def decode_line(buf, start, end, table, far_ids, far_codes):
    """One XLine's header, its events as columns, and its kept stats as sparse rows, in one pass over its bytes.

    Which stats are kept, by stat-metadata id: `table[id]` for the ids it covers (0 <= id < len(table)), else the
    code of `id` among the sorted `far_ids` (`far_codes`); a code is the column's slot (>= 0) for a numeric stat,
    -2 - slot for a string stat, -1 for a stat not kept (`stat_codes` builds them). A table, not a search per stat:
    numba's np.searchsorted took a reference on both arrays each call (atomic: ~25% of the decoder's time). Returns
    (header, metadata_id, offset_ps, duration_ps, stat_event, stat_slot, stat_a, stat_b, err, err_pos); see
    _decode_events for the stats, which come grouped by slot in ascending order, each slot's in event order.
    header: [id, timestamp_ns, duration_ps, display_id, name_off, name_len, display_off, display_len]
    The columns start at a guess from the line's size and double when full, so every byte is parsed once (the
    decoder used to count a line's events and stats first and fill the columns in a second pass: 1.6 against
    1.0 s for the 200 MiB bench profile's lines). They are returned at their exact size, the stats grouped into
    new columns: views of the columns' first items held the 2 GB bench host's read at 2.07-2.08 GiB peak RSS
    against 1.88-1.89 with the copies, for no CPU time measured.
    """
    header = np.zeros(8, np.int64)
    header[4:] = -1
    events = [np.empty(max(64, (end - start) // GUESS_EVENT_BYTES), np.int64) for _ in range(3)]
    stats = [np.empty(max(64, (end - start) // GUESS_STAT_BYTES), np.int64) for _ in range(4)]
    scratch = np.empty(8, np.uint8)
    scratch_double = scratch.view(np.float64)
    pos, e, k = start, 0, 0
    while True:
        pos, e, k, err, err_pos = _decode_events(
            buf, start, pos, end, table, far_ids, far_codes, e, k,
            events[0], events[1], events[2], stats[0], stats[1], stats[2], stats[3], header, scratch,
            scratch_double)
        if err != NO_ROOM:
            break
        if e == len(events[0]):
            most = (end - start) // MIN_EVENT_BYTES + 1  # one past the budget: room to find it is exceeded
            if e >= most:
                err, err_pos = ERR_EVENT_BUDGET, pos
                break
            events = [_resized(column, e, min(max(64, 2 * e), most)) for column in events]
        else:
            stats = [_grown(column, k) for column in stats]
    if err == OK and e * MIN_EVENT_BYTES > end - start:
        err, err_pos = ERR_EVENT_BUDGET, start
    if err:
        empty = np.empty(0, np.int64)
        return header, empty, empty, empty, empty, empty, empty, empty, err, err_pos
    stat_event, stat_slot, stat_a, stat_b = _by_slot(k, stats[0], stats[1], stats[2], stats[3])
    return (header, events[0][:e].copy(), events[1][:e].copy(), events[2][:e].copy(), stat_event, stat_slot, stat_a,
            stat_b, OK, end)


@njit(cache=True, nogil=True)
def _same_bytes(buf, first, second, length):
    for i in range(length):
        if buf[first + i] != buf[second + i]:
            return False
    return True


@njit(cache=True, nogil=True)
def distinct_strings(buf, offsets, lengths):
    """The distinct byte strings among `lengths[i]` bytes at `offsets[i]` (none where the offset is negative), in the
    order of their first occurrence: (each string's distinct index, each distinct string's first position). One
    pass with a hash table (FNV-1a of the bytes, equal bytes checked), so a line's inline strings cost no Python
    object but one per distinct string."""
    count = len(offsets)
    size = 16
    while size < 2 * count:
        size *= 2
    table = np.full(size, -1, np.int64)  # a distinct string's index, by its hash's slot
    hashes = np.empty(count, np.uint64)
    codes = np.empty(count, np.int64)
    firsts = np.empty(count, np.int64)
    distinct = 0
    for i in range(count):
        offset = offsets[i]
        length = lengths[i] if offset >= 0 else 0
        value = np.uint64(14695981039346656037)
        for j in range(length):
            value = (value ^ np.uint64(buf[offset + j])) * np.uint64(1099511628211)
        slot = np.int64(value & np.uint64(size - 1))
        while True:
            found = table[slot]
            if found < 0:
                table[slot] = distinct
                hashes[distinct] = value
                firsts[distinct] = i
                codes[i] = distinct
                distinct += 1
                break
            first = firsts[found]
            first_length = lengths[first] if offsets[first] >= 0 else 0
            if hashes[found] == value and first_length == length and _same_bytes(buf, offsets[first], offset, length):
                codes[i] = found
                break
            slot = (slot + 1) & (size - 1)
    return codes, firsts[:distinct].copy()


DROP_EVENT = 1
"""`line_without_events` flag: every event of this metadata id goes."""
DROP_WITHOUT_STATS = 2
"""`line_without_events` flag: an event of this metadata id goes where it carries no stats of its own."""
_EVENT_FIELD_OFFSET = 2
_EVENT_FIELD_DURATION = 3
_EVENT_FIELD_STATS = 4


@njit(cache=True, nogil=True)
def _field_value(buf, pos, end, number):
    """Where the value of the first field with this number in the message buf[pos:end] starts (after its key); -1
    where it has none, -2 where the message cannot be walked."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            return -2
        if key >> 3 == number:
            return pos
        pos = _skip(buf, pos, end, key & 7)
        if pos < 0:
            return -2
    return -1


@njit(cache=True, nogil=True)
def _stat_has_metadata(buf, pos, end, metadata_id):
    """Whether the XStat in buf[pos:end] names this stat metadata id (XStat field 1); unreadable counts as yes."""
    value_at = _field_value(buf, pos, end, 1)
    if value_at == -1:
        return False
    if value_at < 0:
        return True
    value, after = _varint(buf, value_at, end)
    return after < 0 or value == metadata_id


@njit(cache=True, nogil=True)
def _flag_of(buf, pos, end, dropped_metadata):
    """The `dropped_metadata` flag of the XEvent in buf[pos:end] (from its leading metadata_id), 0 for none."""
    if end - pos > 1 and buf[pos] == 0x08:  # XEvent field 1 (metadata_id), serialised first
        metadata_id, after = _varint(buf, pos + 1, end)
        if after > 0 and 0 <= metadata_id < len(dropped_metadata):
            return dropped_metadata[metadata_id]
    return 0


@njit(cache=True, nogil=True)
def thinned_line(buf, start, end, dropped_metadata, async_stat_id, out):
    """`line_without_events` with every flag of `dropped_metadata`, where that is safe: copies into `out` (with an
    empty `out` it only counts) every field of one XLine but the DROP_EVENT events and the DROP_WITHOUT_STATS ones
    without stats of their own, checking as it goes that leaving the latter out is safe. Returns (kept bytes,
    dropped events, safe, err, err_pos); where not safe it stops there (kept and dropped then count only what it
    walked), and the line is to lose its DROP_EVENT events alone.

    Safe means leaving out the DROP_WITHOUT_STATS events changes no kept event's enclosing events but by them: every
    kept event's parent (as XProf's event grouping finds it, on the line less its DROP_EVENT events) is, once they
    are gone, its nearest ancestor that stays. XProf passes step groups from parent to child, so the kept events'
    groups stay as they were. Only where the events are stored in XProf's order (by start, the longer first among
    equal starts; two with the same start and duration are not) and none is asynchronous (it carries the
    `async_stat_id` stat; XProf leaves those out of its nesting). A line with no such event to leave out is safe.

    XProf's nesting (EventForest::ConnectIntraThread: each event's parent is the innermost earlier event still open
    that includes it) is simulated both ways in the one walk, each with a stack of the open events: the line as it
    is, where each open event also carries its nearest ancestor that stays, and the line without the events left
    out."""
    fill = len(out) > 0
    open_begins = np.empty(64, np.int64)  # the line less its DROP_EVENT events: open events, innermost last
    open_ends = np.empty(64, np.int64)
    open_kept = np.empty(64, np.int64)  # the nearest of them (or itself) that stays: its ordinal, -1 for none
    depth = 0
    kept_begins = np.empty(64, np.int64)  # the line without the events left out: open events
    kept_ends = np.empty(64, np.int64)
    kept_ids = np.empty(64, np.int64)
    kept_depth = 0
    ordinal = 0
    checking = True  # the line so far is in XProf's order, every event timed and none asynchronous
    last_begin = np.int64(0)
    last_end = np.int64(0)
    stat_less_dropped = 0
    kept = 0
    dropped = 0
    pos = start
    while pos < end:  # the line's fields walked here as in line_without_events: through a shared helper returning each
        field_start = pos  # field's bounds, this walk took ~45% longer (the ahead-of-time build, 0.36 against 0.25 s)
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            return kept, dropped, False, ERR_VARINT, field_start
        if key >> 3 != 4 or key & 7 != 2:
            pos = _skip(buf, pos, end, key & 7)
            if pos < 0:
                err = ERR_WIRE_TYPE if pos == -3 else ERR_LENGTH if pos == -2 else ERR_VARINT
                return kept, dropped, False, err, field_start
        else:
            length, pos = _varint(buf, pos, end)
            if pos < 0:
                return kept, dropped, False, ERR_VARINT, field_start
            if length < 0 or length > end - pos:  # before any sum: a length near 2^63 wraps pos + length
                return kept, dropped, False, ERR_LENGTH, field_start
            event_end = pos + length
            flag = _flag_of(buf, pos, event_end, dropped_metadata)
            if flag == DROP_EVENT:
                dropped += 1
                pos = event_end
                continue
            has_offset = False
            has_stats = False
            asynchronous = False
            begin = np.int64(0)
            duration = np.int64(0)
            field = pos
            while 0 <= field < event_end:
                field_key, field = _varint(buf, field, event_end)
                if field < 0:
                    break
                if field_key == _EVENT_FIELD_OFFSET << 3:
                    begin, field = _varint(buf, field, event_end)
                    has_offset = True
                elif field_key == _EVENT_FIELD_DURATION << 3:
                    duration, field = _varint(buf, field, event_end)
                elif field_key == (_EVENT_FIELD_STATS << 3) | 2:
                    has_stats = True
                    stat_length, field = _varint(buf, field, event_end)
                    if field < 0 or stat_length < 0 or stat_length > event_end - field:
                        field = -1
                        break
                    if async_stat_id >= 0 and _stat_has_metadata(buf, field, field + stat_length, async_stat_id):
                        asynchronous = True
                    field += stat_length
                else:
                    has_stats |= field_key >> 3 == _EVENT_FIELD_STATS  # stats of another wire type: kept
                    field = _skip(buf, field, event_end, field_key & 7)
            has_stats |= field < 0  # an unreadable event is kept
            drop = flag == DROP_WITHOUT_STATS and not has_stats
            if checking and (field < 0 or not has_offset or duration < 0 or asynchronous or (
                    ordinal > 0 and (begin < last_begin or (begin == last_begin and begin + duration >= last_end)))):
                checking = False  # unreadable, untimed, asynchronous or out of order: XProf's nesting is not followed
                if stat_less_dropped:
                    return kept, dropped, False, OK, field_start
            if drop and not checking:
                return kept, dropped, False, OK, field_start
            if checking:  # the two stacks inline: as helpers returning the grown arrays, the walk took ~10% longer
                last_begin = begin
                last_end = begin + duration
                while depth > 0 and not (open_begins[depth - 1] <= begin and last_end <= open_ends[depth - 1]):
                    depth -= 1
                nearest_kept = open_kept[depth - 1] if depth > 0 else -1
                if depth == len(open_begins):
                    open_begins = _grown(open_begins, depth)
                    open_ends = _grown(open_ends, depth)
                    open_kept = _grown(open_kept, depth)
                open_begins[depth] = begin
                open_ends[depth] = last_end
                open_kept[depth] = nearest_kept if drop else ordinal
                depth += 1
                if not drop:
                    while kept_depth > 0 and not (kept_begins[kept_depth - 1] <= begin
                                                  and last_end <= kept_ends[kept_depth - 1]):
                        kept_depth -= 1
                    if (kept_ids[kept_depth - 1] if kept_depth > 0 else -1) != nearest_kept:
                        return kept, dropped, False, OK, field_start
                    if kept_depth == len(kept_begins):
                        kept_begins = _grown(kept_begins, kept_depth)
                        kept_ends = _grown(kept_ends, kept_depth)
                        kept_ids = _grown(kept_ids, kept_depth)
                    kept_begins[kept_depth] = begin
                    kept_ends[kept_depth] = last_end
                    kept_ids[kept_depth] = ordinal
                    kept_depth += 1
                ordinal += 1
            pos = event_end
            if drop:
                dropped += 1
                stat_less_dropped += 1
                continue
        if fill:
            if kept + pos - field_start > len(out):
                return kept, dropped, False, ERR_LENGTH, field_start
            out[kept:kept + pos - field_start] = buf[field_start:pos]
        kept += pos - field_start
    return kept, dropped, True, OK, end


@njit(cache=True, nogil=True)
def line_without_events(buf, start, end, dropped_metadata, out):
    """One XLine's fields less the events whose leading field is a metadata_id flagged DROP_EVENT in
    `dropped_metadata` (`thinned_line` also drops the DROP_WITHOUT_STATS ones, where that is safe). With an empty
    `out` it only counts; otherwise it copies the kept fields into `out`, stopping with ERR_LENGTH rather than
    writing past its end. Every other byte is kept as it is. Returns (kept bytes, dropped events, err, err_pos)."""
    fill = len(out) > 0
    kept = 0
    dropped = 0
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            return kept, dropped, ERR_VARINT, field_start
        drop = False
        if key >> 3 == 4 and key & 7 == 2:
            length, pos = _varint(buf, pos, end)
            if pos < 0:
                return kept, dropped, ERR_VARINT, field_start
            if length < 0 or length > end - pos:
                return kept, dropped, ERR_LENGTH, field_start
            drop = _flag_of(buf, pos, pos + length, dropped_metadata) == DROP_EVENT
            pos += length
        else:
            pos = _skip(buf, pos, end, key & 7)
            if pos < 0:
                err = ERR_WIRE_TYPE if pos == -3 else ERR_LENGTH if pos == -2 else ERR_VARINT
                return kept, dropped, err, field_start
        if drop:
            dropped += 1
        else:
            if fill:
                if kept + pos - field_start > len(out):
                    return kept, dropped, ERR_LENGTH, field_start
                out[kept:kept + pos - field_start] = buf[field_start:pos]
            kept += pos - field_start
    return kept, dropped, OK, end


@njit(cache=True, nogil=True)
def _put_varint(out, at, value):
    """Writes the varint of `value` (>= 0) into out[at:]; returns the position after it, -1 where out ends first."""
    while True:
        if at >= len(out):
            return -1
        if value < 0x80:
            out[at] = value
            return at + 1
        out[at] = (value & 0x7F) | 0x80
        value >>= 7
        at += 1


@njit(cache=True, nogil=True)
def _put_bytes(out, at, buf, start, stop):
    """Copies buf[start:stop] into out[at:]; returns the position after it, -1 where out ends first. A loop: for the
    few bytes of a field it is quicker than a slice assignment's views."""
    if at + stop - start > len(out):
        return -1
    for i in range(stop - start):
        out[at + i] = buf[start + i]
    return at + stop - start


@njit(cache=True, nogil=True)
def _same(buf, at, expected):
    """Whether buf holds the bytes `expected` at `at`."""
    for i in range(len(expected)):
        if buf[at + i] != expected[i]:
            return False
    return True


_MAX_LEFT_OUT = 8
"""The most stats `line_without_stat` leaves out of one event (an event with more keeps the rest)."""


@njit(cache=True, nogil=True)
def line_without_stat(buf, start, end, stat, out):
    """One XLine's fields with, in each of its events, the stats whose bytes are `stat` (an XStat as protobuf
    serialises it) left out; each such event's length is written anew, every other byte is copied as it is. `out`
    must hold the line's bytes (the copy is never longer); it stops with ERR_LENGTH rather than write past its end.
    Returns (kept bytes, stats left out, err, err_pos)."""
    begins = np.empty(_MAX_LEFT_OUT, np.int64)  # this event's stats left out: their fields' bounds
    ends = np.empty(_MAX_LEFT_OUT, np.int64)
    kept = 0
    dropped = 0
    run = start  # the bytes from here to pos are copied as they are, in one go, before the next changed event
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            return kept, dropped, ERR_VARINT, field_start
        if key >> 3 != 4 or key & 7 != 2:
            pos = _skip(buf, pos, end, key & 7)
            if pos < 0:
                err = ERR_WIRE_TYPE if pos == -3 else ERR_LENGTH if pos == -2 else ERR_VARINT
                return kept, dropped, err, field_start
            continue
        length, pos = _varint(buf, pos, end)
        if pos < 0:
            return kept, dropped, ERR_VARINT, field_start
        if length < 0 or length > end - pos:
            return kept, dropped, ERR_LENGTH, field_start
        event_start = pos
        event_end = pos + length
        count = 0
        left_out = 0
        field = event_start
        while field < event_end:  # the event's fields: one-byte keys and varints walked inline (a third quicker)
            field_begin = field
            field_key = np.int64(buf[field])
            field += 1
            if field_key >= 0x80:
                field_key, field = _varint(buf, field_begin, event_end)
                if field < 0:
                    return kept, dropped, ERR_VARINT, field_begin
            if field_key == (_EVENT_FIELD_STATS << 3) | 2:
                stat_length, field = _varint(buf, field, event_end)
                if field < 0 or stat_length < 0 or stat_length > event_end - field:
                    return kept, dropped, ERR_LENGTH, field_begin
                field += stat_length
                if count < _MAX_LEFT_OUT and stat_length == len(stat) and _same(buf, field - stat_length, stat):
                    begins[count] = field_begin
                    ends[count] = field
                    left_out += field - field_begin
                    count += 1
            elif field_key & 7 == 0:
                while field < event_end and buf[field] >= 0x80:
                    field += 1
                field += 1
                if field > event_end:
                    return kept, dropped, ERR_VARINT, field_begin
            else:
                field = _skip(buf, field, event_end, field_key & 7)
                if field < 0:
                    err = ERR_WIRE_TYPE if field == -3 else ERR_LENGTH if field == -2 else ERR_VARINT
                    return kept, dropped, err, field_begin
        pos = event_end
        if count == 0:
            continue
        at = _put_bytes(out, kept, buf, run, field_start)
        at = _put_varint(out, at, key) if at >= 0 else -1
        at = _put_varint(out, at, length - left_out) if at >= 0 else -1
        piece = event_start
        for i in range(count):
            at = _put_bytes(out, at, buf, piece, begins[i]) if at >= 0 else -1
            piece = ends[i]
        at = _put_bytes(out, at, buf, piece, event_end) if at >= 0 else -1
        if at < 0:
            return kept, dropped, ERR_LENGTH, field_start
        kept = at
        dropped += count
        run = event_end
    if kept + end - run > len(out):
        return kept, dropped, ERR_LENGTH, run
    out[kept:kept + end - run] = buf[run:end]
    return kept + end - run, dropped, OK, end


_compiled_now = [False]


def compile_now() -> None:
    """Where numba compiles the reader's functions (no ahead-of-time module), compiles them now (or loads them from
    numba's cache), once per process: a read's time bound (read_bounds) then counts the read alone, not seconds of
    compiling on a busy machine."""
    if _ahead_of_time is not None or _compiled_now[0]:
        return
    buf = np.frombuffer(b"\x08\x01", np.uint8)  # read-only, as the mapped file's view is
    ids = np.zeros(0, np.int64)
    scan_fields(buf, 0, len(buf))
    decode_line(buf, 0, len(buf), ids, ids, ids)
    distinct_strings(buf, ids, ids)
    _compiled_now[0] = True


if _ahead_of_time is not None:
    scan_fields = _ahead_of_time.scan_fields  # noqa: F811 (the ahead-of-time build of the functions above)
    decode_line = _ahead_of_time.decode_line  # noqa: F811
    distinct_strings = _ahead_of_time.distinct_strings  # noqa: F811
    line_without_events = _ahead_of_time.line_without_events  # noqa: F811
    thinned_line = _ahead_of_time.thinned_line  # noqa: F811
    line_without_stat = _ahead_of_time.line_without_stat  # noqa: F811
