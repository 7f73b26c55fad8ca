"""How much of a window do these intervals cover? The union of [start, end) intervals (ps) and its coverage of
windows, at the sizes of large profiles (tens of millions of intervals); and which events of a thread are not
nested inside another."""

from __future__ import annotations

import numpy as np

PS_PER_MS = 1e9  # intervals are in picoseconds


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint intervals.

    Inputs run to tens of millions of intervals on large profiles: temporaries are freed as soon as done
    and the sort is skipped where the starts are already in order."""
    if len(starts) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all()):
        s, running_end = starts, np.array(ends, dtype=np.int64)
    else:
        order = np.argsort(starts, kind="stable")
        s, running_end = starts[order], ends[order].astype(np.int64, copy=False)
        del order
    np.maximum.accumulate(running_end, out=running_end)
    new_segment = np.empty(len(s), dtype=bool)
    new_segment[0] = True
    np.greater(s[1:], running_end[:-1], out=new_segment[1:])
    if new_segment.all():  # no interval reaches the next (a device line's ops, one after another): each its own
        return (s.copy() if s is starts else s), np.maximum(running_end, 0, out=running_end)
    merged_s = s[new_segment]
    # running_end never decreases, so a segment's end is its value at the segment's last interval.
    last = np.flatnonzero(new_segment)
    last[:-1] = last[1:] - 1
    last[-1] = len(s) - 1
    merged_e = np.maximum(running_end[last], 0)
    return merged_s, merged_e


def union_with(merged: tuple[np.ndarray, np.ndarray], starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """merge_intervals of the merged intervals and more: the same union as merging every interval again, at the
    size of the merged ones. The new intervals are merged on their own first (nested host events collapse), so
    tens of millions of them are sorted once, not joined to the rest before."""
    starts, ends = merge_intervals(starts, ends)
    if not len(starts) and _is_merged(*merged):  # nothing to add: merging them again is the same union
        return merged if isinstance(merged, tuple) else tuple(merged)
    return merge_intervals(np.concatenate([merged[0], starts]), np.concatenate([merged[1], ends]))


def _is_merged(starts: np.ndarray, ends: np.ndarray) -> bool:
    """Whether merge_intervals of these intervals is these intervals: int64, none ending before it starts or before
    0, each starting after the one before ends (so sorted and disjoint)."""
    if starts.dtype != np.int64 or ends.dtype != np.int64 or len(starts) != len(ends):
        return False
    return not len(starts) or bool(ends[0] >= 0 and (ends >= starts).all() and (starts[1:] > ends[:-1]).all())


def covered(starts: np.ndarray, ends: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """For each window, how much of it the union of the intervals covers (ps)."""
    return covered_by_merged(merge_intervals(starts, ends), win_s, win_e)


def covered_by_merged(merged: tuple[np.ndarray, np.ndarray], win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """covered() of intervals already merged (merge_intervals' answer)."""
    ms, me = merged
    win_s, win_e = np.asarray(win_s, dtype=np.int64), np.asarray(win_e, dtype=np.int64)
    if len(ms) == 0:
        return np.zeros(len(win_s), dtype=np.int64)
    prefix = np.concatenate([[0], np.cumsum(me - ms)])

    def upto(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ms, t, side="right") - 1
        safe = np.clip(idx, 0, None)
        inside = np.minimum(t, me[safe]) - ms[safe]
        return np.where(idx >= 0, prefix[safe] + np.clip(inside, 0, None), 0)

    return upto(win_e) - upto(win_s)


def outermost(mask: np.ndarray, line: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Of the events in `mask`, those not nested inside another masked event of the same thread.

    The Python tracer nests `device_get` in `__float__` in `_value`…: one sync, not three.
    """
    keep = np.zeros(len(mask), dtype=bool)
    for name in np.unique(line[mask]):
        idx = np.nonzero(mask & (line == name))[0]
        idx = idx[np.lexsort((-ends[idx], starts[idx]))]
        running_end = np.maximum.accumulate(ends[idx])
        outer = np.ones(len(idx), dtype=bool)
        outer[1:] = starts[idx][1:] >= running_end[:-1]
        keep[idx[outer]] = True
    return keep
