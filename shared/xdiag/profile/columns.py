"""Factorising columns: `np.unique(values, return_inverse=True)` in linear time, the distinct rows of
several columns without a Python object per row, and `np.isin` of small integer ids by a look-up table.

numpy sorts: for small integer ranges (stat slots, stat-name ids) a count per value does the same
work without the sort, and for object arrays of strings (per-op keys, millions of rows on large
profiles) sorting compares Python strings n·log n times where hashing each once and sorting only
the distinct keys gives the same answer. Results are exactly numpy's: the distinct values sorted,
and for each row the index of its value among them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def unique_with_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, index of each row's value among them), as np.unique gives them."""
    if values.dtype == object:
        return _unique_objects(values)
    if np.issubdtype(values.dtype, np.integer):
        return _unique_small_ints(values)
    return np.unique(values, return_inverse=True)


def isin_ids(values: np.ndarray, members: np.ndarray) -> np.ndarray:
    """`np.isin(values, members)` for integer ids of a small range (a line's event metadata ids: the profilers number
    them from 1): a table indexed by id, one gather per row, about 10x faster than isin's sort on lines of 10^5
    events with tens of members. isin itself where the ids are negative or spread wide."""
    if not len(values) or not len(members):
        return np.zeros(len(values), dtype=bool)
    low = min(int(values.min()), int(members.min()))
    high = max(int(values.max()), int(members.max()))
    if low < 0 or high > 4 * len(values) + 65536:
        return np.isin(values, members)
    table = np.zeros(high + 1, dtype=bool)
    table[members] = True
    return np.take(table, values)  # the gather table[values] does, 2.3x quicker (830K uint8 ids: 1.0 ms, not 2.3)


def _unique_small_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(values):
        return values[:0], np.zeros(0, dtype=np.intp)
    low, high = int(values.min()), int(values.max())
    if high - low > 4 * len(values) + 65536:  # a wide range: numpy's sort is the cheaper way
        return np.unique(values, return_inverse=True)
    present = np.bincount(values - low, minlength=high - low + 1) > 0
    position = np.cumsum(present) - 1
    return (np.flatnonzero(present) + low).astype(values.dtype, copy=False), position[values - low].astype(np.intp)


def _unique_objects(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes: dict[object, int] = {}
    first_seen = np.fromiter((codes.setdefault(v, len(codes)) for v in values), dtype=np.intp, count=len(values))
    distinct = np.empty(len(codes), dtype=object)
    distinct[:] = list(codes)
    order = np.argsort(distinct)  # distinct keys only; they compare as np.unique compares them
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return distinct[order], rank[first_seen]


def factorize_rows(*columns: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """The distinct rows of equal-length columns, in first-seen order, and the index of each row's among them.

    Integer columns (codes of text, ids) are combined into one integer key per row, a chunk of rows at a time: no
    Python object per row and no working array the size of the table, which on a TPU host's tens of millions of op
    executions is seconds and GiB; the index is then int32. With an object column, rows are hashed one at a time as
    tuples, so no key is kept per row (a string key per row costs ~100 bytes); integer columns take part as codes of
    their distinct values.
    """
    if all(column.dtype != object for column in columns):
        return _factorize_integer_rows(columns)
    parts, decoded = [], []
    for column in columns:
        if column.dtype == object:
            parts.append(column)
            decoded.append(None)
        else:
            values, codes = unique_with_inverse(column)
            parts.append(codes.tolist())
            decoded.append(values.tolist())
    # Two passes that run in C (dict.fromkeys, map), not a Python step per row.
    index = {row: position for position, row in enumerate(dict.fromkeys(zip(*parts)))}
    inverse = np.fromiter(map(index.__getitem__, zip(*parts)), dtype=np.intp, count=len(columns[0]))
    rows = [tuple(value if values is None else values[value] for value, values in zip(row, decoded)) for row in index]
    return rows, inverse


CHUNK_ROWS = 1 << 20
"""Long columns are worked this many rows at a time where a pass needs working arrays: they stay a few MiB
whatever the rows."""


def _factorize_integer_rows(columns: tuple[np.ndarray, ...]) -> tuple[list[tuple], np.ndarray]:
    size = len(columns[0])
    distinct = [distinct_values(column) for column in columns]
    radices = [max(len(values), 1) for values in distinct]
    if np.prod(radices, dtype=float) >= 2**62:  # one integer key per row would overflow: hash tuples instead
        return factorize_rows(*columns[:-1], columns[-1].astype(object))
    # A column of one value adds nothing to the key; the others are coded by their value's index among the distinct.
    coders = [(_coder(values), column, radix) for column, values, radix in zip(columns, distinct, radices) if radix > 1]
    index: dict[int, int] = {}  # a row's key -> its position among the distinct rows, in first-seen order
    inverse = np.empty(size, dtype=np.int32 if size < 2**31 else np.intp)
    for start in range(0, size, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, size)
        key = np.zeros(stop - start, dtype=np.int64)
        for code, column, radix in coders:
            key *= radix
            key += code(column[start:stop])
        keys, local = unique_with_inverse(key)
        keys = keys.tolist()
        fresh = [j for j, k in enumerate(keys) if k not in index]
        if fresh:
            first = _first_positions(local, len(keys))  # where each of the chunk's keys first appears
            for j in sorted(fresh, key=first.__getitem__):
                index[keys[j]] = len(index)
        inverse[start:stop] = np.array([index[k] for k in keys], dtype=inverse.dtype)[local]
    rows = []
    decoded = [values.tolist() for values in reversed(distinct)]
    for key in index:
        row = []
        for values, radix in zip(decoded, reversed(radices)):
            key, code = divmod(key, radix)
            row.append(values[code])
        rows.append(tuple(reversed(row)))
    return rows, inverse


def _coder(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Each value's index among `values` (sorted, distinct): the values themselves where they are 0..n-1 (codes of
    text), a look-up table where their range is small, else a binary search (np.searchsorted's answer in each case)."""
    if not np.issubdtype(values.dtype, np.integer):
        return lambda chunk: np.searchsorted(values, chunk)
    low, high = int(values[0]), int(values[-1])
    if low == 0 and high == len(values) - 1:
        return lambda chunk: chunk
    if high - low <= 4 * len(values) + 65536:
        table = np.zeros(high - low + 1, dtype=np.int64)
        table[values - low] = np.arange(len(values))
        return lambda chunk: table[chunk - low]
    return lambda chunk: np.searchsorted(values, chunk)


def distinct_values(column: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer column, a chunk of rows at a time: a count per value where their
    range is small (no sort, no index per row), else np.unique."""
    if not len(column) or not np.issubdtype(column.dtype, np.integer):
        return np.unique(column)
    low, high = int(column.min()), int(column.max())
    if low == high:
        return column[:1].copy()
    if high - low <= 4 * len(column) + 65536:
        present = np.zeros(high - low + 1, dtype=bool)
        for start in range(0, len(column), CHUNK_ROWS):
            chunk = column[start:start + CHUNK_ROWS]
            present |= np.bincount(chunk - low if low else chunk, minlength=high - low + 1) > 0
        return (np.flatnonzero(present) + low).astype(column.dtype, copy=False)
    found = [np.unique(column[start:start + CHUNK_ROWS]) for start in range(0, len(column), CHUNK_ROWS)]
    return np.unique(np.concatenate(found))


def _first_positions(codes: np.ndarray, distinct: int) -> np.ndarray:
    """For each code 0..distinct-1, the first position it holds in `codes` (len(codes) where it holds none): a
    minimum per code, no sort."""
    first = np.full(distinct, len(codes), dtype=np.intp)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.intp))
    return first


def first_rows(codes: np.ndarray, distinct: int) -> np.ndarray:
    """The first row of each code 0..distinct-1 in a column of codes (-1 for a code in no row), a chunk at a time:
    once every code is seen the rest is not read."""
    first = np.full(distinct, -1, dtype=np.int64)
    unseen = distinct
    for start in range(0, len(codes), CHUNK_ROWS):
        chunk = codes[start:start + CHUNK_ROWS]
        present = np.flatnonzero(np.bincount(chunk, minlength=distinct))
        new = present[first[present] < 0]
        if len(new):
            at = _first_positions(chunk, distinct)
            fresh = (first < 0) & (at < len(chunk))
            first[fresh] = at[fresh] + start
            unseen -= len(new)
            if not unseen:
                break
    return first
