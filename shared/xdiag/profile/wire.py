"""Protobuf wire-format decoding of XSpace's bulk data, compiled with numba.

The events of a profile are most of its bytes. Decoding them through protobuf objects
costs a Python object per event and a Python loop to turn them into columns; here the
events of one XLine go straight from the memory-mapped file into numpy columns. Only the
small parts (plane metadata, HLO protos) go through protobuf messages.

Every function returns an error code instead of raising (numba), with the byte position
where decoding failed; `reader.py` turns that into a ProfileError.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NO_VALUE = np.iinfo(np.int64).min

OK = 0
ERR_VARINT = 1  # a varint runs past the end or over 10 bytes
ERR_LENGTH = 2  # a length-delimited field runs past its parent's end
ERR_WIRE_TYPE = 3  # a wire type that protobuf does not have (groups included)

ERRORS = {
    ERR_VARINT: "malformed or truncated varint",
    ERR_LENGTH: "a field's length runs past the end of its message (truncated or corrupt)",
    ERR_WIRE_TYPE: "invalid wire type (not protobuf data)",
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
        return pos + length if length >= 0 and pos + length <= end else -2
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
def _count_events(buf, start, end):
    count = 0
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        if pos < 0:
            return -1, start
        if key >> 3 == 4 and key & 7 == 2:
            count += 1
        nxt = _skip(buf, pos, end, key & 7)
        if nxt < 0:
            return -1, pos
        pos = nxt
    return count, end


@njit(cache=True, nogil=True)
def _slot(sorted_ids, slots, stat_id):
    i = np.searchsorted(sorted_ids, stat_id)
    if i < len(sorted_ids) and sorted_ids[i] == stat_id:
        return slots[i]
    return -1


@njit(cache=True, nogil=True)
def decode_line(buf, start, end, numeric_ids, numeric_slots, n_numeric, string_ids, string_slots, n_string):
    """One XLine's header and its events as columns.

    numeric_ids/numeric_slots: sorted stat-metadata ids kept as int64 columns and their column index;
    string_ids/string_slots: the same for string stats, recorded as (ref id, -1) for ref_value or
    (byte offset, length) for str_value, resolved to text by the caller.
    header: [id, timestamp_ns, duration_ps, display_id, name_off, name_len, display_off, display_len]
    """
    header = np.full(8, -1, np.int64)
    header[0] = 0
    header[1] = 0
    header[2] = 0
    header[3] = 0
    count, err_pos = _count_events(buf, start, end)
    if count < 0:
        count = 0
        empty = np.empty(0, np.int64)
        return (header, empty, empty, empty, np.empty((0, n_numeric), np.int64),
                np.empty((0, n_string), np.int64), np.empty((0, n_string), np.int64), ERR_LENGTH, err_pos)
    metadata_id = np.zeros(count, np.int64)
    offset_ps = np.zeros(count, np.int64)
    duration_ps = np.zeros(count, np.int64)
    numeric = np.full((count, n_numeric), NO_VALUE, np.int64)
    string_a = np.full((count, n_string), -1, np.int64)
    string_b = np.full((count, n_string), -1, np.int64)
    pos = start
    e = 0
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number = key >> 3
        wire = key & 7
        if number == 4 and wire == 2:
            length, pos = _varint(buf, pos, end)
            event_end = pos + length
            while pos < event_end:
                ekey, pos = _varint(buf, pos, event_end)
                if pos < 0:
                    return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_VARINT, event_end
                enum = ekey >> 3
                ewire = ekey & 7
                if ewire == 0 and enum <= 3:
                    value, pos = _varint(buf, pos, event_end)
                    if enum == 1:
                        metadata_id[e] = value
                    elif enum == 2:
                        offset_ps[e] = value
                    else:
                        duration_ps[e] = value
                elif enum == 4 and ewire == 2:
                    slen, pos = _varint(buf, pos, event_end)
                    stat_end = pos + slen
                    if slen < 0 or stat_end > event_end:
                        return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_LENGTH, pos
                    stat_id = np.int64(-1)
                    kind = np.int64(0)
                    a = np.int64(0)
                    b = np.int64(-1)
                    while pos < stat_end:
                        skey, pos = _varint(buf, pos, stat_end)
                        if pos < 0:
                            return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_VARINT, stat_end
                        snum = skey >> 3
                        swire = skey & 7
                        if snum == 1 and swire == 0:
                            stat_id, pos = _varint(buf, pos, stat_end)
                        elif swire == 0 and (snum == 3 or snum == 4 or snum == 7):
                            a, pos = _varint(buf, pos, stat_end)
                            kind = snum
                        elif snum == 2 and swire == 1 and pos + 8 <= stat_end:
                            a = np.int64(buf[pos:pos + 8].copy().view(np.float64)[0])
                            kind = 2
                            pos += 8
                        elif snum == 5 and swire == 2:
                            b, pos = _varint(buf, pos, stat_end)
                            a = pos
                            kind = 5
                            pos += b
                        else:
                            pos = _skip(buf, pos, stat_end, swire)
                        if pos < 0:
                            return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_LENGTH, stat_end
                    if kind == 2 or kind == 3 or kind == 4:
                        slot = _slot(numeric_ids, numeric_slots, stat_id)
                        if slot >= 0:
                            numeric[e, slot] = a
                    elif kind == 5 or kind == 7:
                        slot = _slot(string_ids, string_slots, stat_id)
                        if slot >= 0:
                            string_a[e, slot] = a
                            string_b[e, slot] = b if kind == 5 else -1
                else:
                    pos = _skip(buf, pos, event_end, ewire)
                    if pos < 0:
                        return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_LENGTH, event_end
            e += 1
        elif wire == 0:
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
            length, pos = _varint(buf, pos, end)
            slot = 4 if number == 2 else 6
            header[slot] = pos
            header[slot + 1] = length
            pos += length
        else:
            pos = _skip(buf, pos, end, wire)
        if pos < 0:
            return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, ERR_LENGTH, start
    return header, metadata_id, offset_ps, duration_ps, numeric, string_a, string_b, OK, end
