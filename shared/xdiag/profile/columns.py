"""Factorising columns: `np.unique(values, return_inverse=True)` in linear time, the distinct rows of
several columns without a key per row, and `np.isin` of small integer ids by a look-up table.

numpy sorts: for small integer ranges (stat slots, stat-name ids) a count per value does the same
work without the sort, and for object arrays of strings (per-op keys, millions of rows on large
profiles) sorting compares Python strings n·log n times where hashing each once and sorting only
the distinct keys gives the same answer. Results are exactly numpy's: the distinct values sorted,
and for each row the index of its value among them.
"""

from __future__ import annotations

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
    return table[values]


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

    Rows are hashed one at a time as tuples, so no key is kept per row (a string key per row costs ~100 bytes,
    hundreds of MB on profiles with millions of ops); integer columns take part as codes of their distinct values.
    """
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
