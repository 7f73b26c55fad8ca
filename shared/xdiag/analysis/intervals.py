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
    win_s, win_e = np.asarray(win_s, dtype=np.int64), np.asarray(win_e, dtype=np.int64)
    if len(merged[0]) == 0:
        return np.zeros(len(win_s), dtype=np.int64)
    upto = _covered_before(merged)
    return upto(win_e) - upto(win_s)


def _covered_before(merged: tuple[np.ndarray, np.ndarray]):
    """For merged intervals (at least one): t -> how much of them lies before each t."""
    ms, me = merged
    prefix = np.concatenate([[0], np.cumsum(me - ms)])

    def upto(t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ms, t, side="right") - 1
        safe = np.clip(idx, 0, None)
        inside = np.minimum(t, me[safe]) - ms[safe]
        return np.where(idx >= 0, prefix[safe] + np.clip(inside, 0, None), 0)

    return upto


def covered_by_unions(base: tuple[np.ndarray, np.ndarray], layers: list[tuple[np.ndarray, np.ndarray]],
                      win_s: np.ndarray, win_e: np.ndarray) -> list[np.ndarray]:
    """covered_by_merged of `base` (merged), then of its union with each layer (starts, ends) in turn, the layers
    before it included: the union never built. Each window's coverage by base ∪ V is its coverage by base, plus by
    V, less by their overlap, each from prefix sums: base (a device's ops) runs to millions of intervals, and
    merging a few loops or copies into it sorted and scanned them all again per layer (0.1 s of the 87.6 MiB TPU
    v5e capture's step breakdown, of its 0.14 s)."""
    win_s, win_e = np.asarray(win_s, dtype=np.int64), np.asarray(win_e, dtype=np.int64)
    extra = (np.empty(0, np.int64), np.empty(0, np.int64))
    merged = [extra]
    for starts, ends in layers:
        merged.append(union_with(extra, starts, ends) if len(extra[0]) else merge_intervals(starts, ends))
        extra = merged[-1]
    # The sums hold for sorted, disjoint intervals that end where or after they start: merge_intervals' answer, but
    # where an interval ends before it starts or before 0 (the union then is what merging them again makes)
    if not len(base[0]) or not all(_is_merged(*intervals) for intervals in (base, *merged)):
        unions = [base]
        for starts, ends in layers:
            unions.append(union_with(unions[-1], starts, ends))
        return [covered_by_merged(union, win_s, win_e) for union in unions]
    in_base = _covered_before(base)
    covered_base = in_base(win_e) - in_base(win_s)
    out = [covered_base]
    for vs, ve in merged[1:]:
        if not len(vs):
            out.append(covered_base)
            continue
        # How much of base lies in V before t: V's intervals wholly before t, then the one t is in
        overlap_prefix = np.concatenate([[0], np.cumsum(in_base(ve) - in_base(vs))])

        def overlap_before(t: np.ndarray) -> np.ndarray:
            idx = np.searchsorted(vs, t, side="right") - 1
            safe = np.clip(idx, 0, None)
            inside = in_base(np.minimum(t, ve[safe])) - in_base(vs[safe])
            return np.where(idx >= 0, overlap_prefix[safe] + inside, 0)

        out.append(covered_base + covered_by_merged((vs, ve), win_s, win_e)
                   - (overlap_before(win_e) - overlap_before(win_s)))
    return out


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


def frame_parents(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Frames in walk order (start ascending, the longer first at one start): each frame's innermost frame still open
    at its start (a stack of open frames, closed once their end is at or before the next start), -1 where none. One
    pass over the frames alone: the events between them only close frames, which the next frame's start does too."""
    parents = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    ends_list = ends.tolist()
    for i, start in enumerate(starts.tolist()):
        while stack and ends_list[stack[-1]] <= start:
            stack.pop()
        if stack:
            parents[i] = stack[-1]
        stack.append(i)
    return parents


def open_frame(parents: np.ndarray, frame_ends: np.ndarray, frames_before: np.ndarray, starts: np.ndarray,
               ends: np.ndarray | None = None) -> np.ndarray:
    """For events interleaved with frames in one walk order: the innermost frame still open at each event, as the
    stack of frame_parents holds it there (-1 where none). `frames_before`: how many frames precede each event in the
    walk. With `ends`, the innermost open frame that also lasts to the event's end (one that encloses it whole)."""
    found = np.asarray(frames_before, dtype=np.int64) - 1
    active = np.flatnonzero(found >= 0)
    while len(active):
        frame = found[active]
        closed = frame_ends[frame] <= starts[active]
        if ends is not None:
            closed |= frame_ends[frame] < ends[active]
        active = active[closed]
        found[active] = parents[found[active]]
        active = active[found[active] >= 0]
    return found


def ends_past_earlier(groups: np.ndarray, ends: np.ndarray, floor: int | None = None) -> np.ndarray:
    """Events in walk order, each in a group: True where its end is past the end of every earlier event of its
    group (and past `floor`): an event that ends within an earlier one of its group is nested in it, counted once."""
    keep = np.zeros(len(ends), dtype=bool)
    if not len(ends):
        return keep
    order = np.argsort(groups, kind="stable")
    ranks = np.unique(groups[order], return_inverse=True)[1].astype(np.int64)
    e = ends[order].astype(np.int64)
    first = np.ones(len(e), dtype=bool)
    first[1:] = ranks[1:] != ranks[:-1]
    base = int(e.min())
    width = int(e.max()) - base + 1
    if (int(ranks[-1]) + 1) * width < 2**62:  # each group's values above every earlier group's: one running max
        key = ranks * width + (e - base)
        prior = np.zeros(len(e), dtype=np.int64)
        prior[1:] = np.maximum.accumulate(key)[:-1]
        prior = prior - ranks * width + base
    else:
        prior = np.zeros(len(e), dtype=np.int64)
        starts = np.flatnonzero(first).tolist() + [len(e)]
        for a, b in zip(starts[:-1], starts[1:]):
            prior[a + 1:b] = np.maximum.accumulate(e[a:b])[:-1]
    passed = e > prior
    passed[first] = True
    if floor is not None:  # (an earlier event at or below the floor raises no bar the floor does not)
        passed &= e > floor
    keep[order] = passed
    return keep
