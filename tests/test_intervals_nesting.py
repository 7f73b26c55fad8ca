"""The vectorised walk of nested events (analysis/intervals.py: frame_parents, open_frame, ends_past_earlier) gives
what a stack of open frames gives, event by event: the walk the line view's Python-frame times and
aggregate_xplane_events' callers made one event at a time before. Random lines of nested and crossing events, the
shapes a tracer writes (nested calls, instants, ties) and those it should not (a child past its parent's end)."""

from __future__ import annotations

import numpy as np
import pytest

from xdiag.analysis.intervals import ends_past_earlier, frame_parents, open_frame


def _stack_walk(starts, ends, is_frame, whole):
    """The walk one event at a time: each frame's parent, each other event's innermost open frame (with `whole`, the
    innermost that also lasts to its end) and whether it ends past every earlier event charged to that frame."""
    order = np.lexsort((-ends, starts)).tolist()
    stack, covered = [], {}
    parent, frame_of, once = {}, {}, {}
    frame_number = {}
    for i in order:
        start, end = int(starts[i]), int(ends[i])
        while stack and int(ends[stack[-1]]) <= start:
            stack.pop()
        if is_frame[i]:
            frame_number[i] = len(frame_number)
            parent[i] = frame_number[stack[-1]] if stack else -1
            stack.append(i)
            continue
        inner = next((f for f in reversed(stack) if not whole or int(ends[f]) >= end), None)
        frame_of[i] = frame_number[inner] if inner is not None else -1
        if inner is not None:
            once[i] = end > covered.get(inner, -1)
            if once[i]:
                covered[inner] = end
    return order, parent, frame_of, once


def _random_line(rng, n):
    starts = np.sort(rng.integers(0, 200, n)).astype(np.int64)
    lengths = rng.choice([0, 1, 2, 5, 20, 80], n)
    return starts, starts + lengths, rng.random(n) < 0.3


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("whole", [False, True])
def test_the_vectorised_walk_gives_what_the_stack_gives(seed, whole):
    rng = np.random.default_rng(seed)
    starts, ends, is_frame = _random_line(rng, int(rng.integers(1, 300)))
    order, parent, frame_of, once = _stack_walk(starts, ends, is_frame, whole)

    walked = np.lexsort((-ends, starts))
    in_walk = is_frame[walked]
    frames = walked[in_walk]
    parents = frame_parents(starts[frames], ends[frames])
    assert parents.tolist() == [parent[i] for i in frames.tolist()]
    at = np.flatnonzero(~in_walk)
    events = walked[at]
    found = open_frame(parents, ends[frames], np.cumsum(in_walk)[at], starts[events], ends[events] if whole else None)
    assert found.tolist() == [frame_of[i] for i in events.tolist()]
    inside = found >= 0
    kept = ends_past_earlier(found[inside], ends[events[inside]], floor=-1)
    assert kept.tolist() == [once[i] for i in events[inside].tolist()]


def test_the_random_lines_hold_every_case_the_walk_tells_apart():
    """Nested frames, events in no frame, events charged and events skipped as nested in one charged before, and
    events whose innermost open frame ends before they do: the comparison above meets each of them."""
    seen = set()
    for seed in range(40):
        rng = np.random.default_rng(seed)
        starts, ends, is_frame = _random_line(rng, int(rng.integers(1, 300)))
        _, parent, open_at, once = _stack_walk(starts, ends, is_frame, False)
        _, _, enclosing, _ = _stack_walk(starts, ends, is_frame, True)
        seen |= {"nested frame"} if any(p >= 0 for p in parent.values()) else set()
        seen |= {"no frame"} if any(f < 0 for f in open_at.values()) else set()
        seen |= {"charged"} if any(once.values()) else set()
        seen |= {"skipped"} if not all(once.values()) else set()
        seen |= {"outlasts its frame"} if open_at != enclosing else set()
    assert seen == {"nested frame", "no frame", "charged", "skipped", "outlasts its frame"}


def test_nested_events_are_charged_once_and_a_frame_past_its_parent_is_still_its_child():
    # frame A [0, 100); inside it a wait [10, 50) with a wait [20, 30) nested in it; frame B [60, 120) crosses A's end
    starts = np.array([0, 10, 20, 60, 70], dtype=np.int64)
    ends = np.array([100, 50, 30, 120, 80], dtype=np.int64)
    frames = np.array([0, 3])
    parents = frame_parents(starts[frames], ends[frames])
    assert parents.tolist() == [-1, 0]
    events = np.array([1, 2, 4])
    found = open_frame(parents, ends[frames], np.array([1, 1, 2]), starts[events])
    assert found.tolist() == [0, 0, 1]
    assert ends_past_earlier(found, ends[events]).tolist() == [True, False, True]


def test_groups_too_wide_for_one_running_max_are_walked_one_by_one():
    ends = np.array([2**61, 5, 2**61 - 1, 7, 3], dtype=np.int64)
    groups = np.array([0, 1, 0, 2, 1])
    assert ends_past_earlier(groups, ends).tolist() == [True, True, False, True, False]
