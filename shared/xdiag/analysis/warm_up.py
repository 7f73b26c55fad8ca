"""Which host calls pay a one-time cost? The first call of a jitted function that takes far longer than its later
calls, and GPU runtime calls far longer than their median (a kernel's module loaded on first use, the context
created): the step breakdown's warm_up layer."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from xdiag.analysis.host_threads import HostThreads
from xdiag.analysis.host_vocabulary import JITTED_CALL_EVENT
from xdiag.analysis.intervals import PS_PER_MS, outermost
from xdiag.profile.columns import unique_with_inverse

WARM_UP_MIN_RATIO = 3.0
"""A first call counts as warm-up when it takes at least this many times its function's median later call."""
WARM_UP_MIN_EXCESS_PS = 1_000_000_000  # and at least 1 ms longer: a few µs of noise is no warm-up


@dataclass(slots=True)
class WarmUpCall:
    """The first call of a jitted function that takes far longer than its later calls; or a GPU runtime call far
    longer than its call's median (first_call False)."""

    host: str
    function: str
    start_ps: int
    end_ps: int
    later_call_ms_median: float
    first_call: bool = True  # False: a GPU runtime call far longer than its call's median (_slow_runtime_calls)

    @property
    def ms(self) -> float:
        return (self.end_ps - self.start_ps) / PS_PER_MS


def warm_up_calls(events: HostThreads) -> list[WarmUpCall]:
    """The first call of each function that takes far longer than its later calls (WARM_UP_MIN_RATIO): the
    warm-up a benchmark or training loop pays once (buffer allocation, autotuning, loading the program). Found once
    per host's threads (the step breakdown and get_step_trace both ask)."""
    if "warm_up_calls" not in events.derived:
        events.derived["warm_up_calls"] = _warm_up_calls(events)
    return list(events.derived["warm_up_calls"])


def _warm_up_calls(events: HostThreads) -> list[WarmUpCall]:
    calls = events.select(JITTED_CALL_EVENT)
    keep = outermost(np.ones(len(calls.start_ps), dtype=bool), calls.line, calls.start_ps, calls.end_ps)
    starts, ends, names = calls.start_ps[keep], calls.end_ps[keep], events.names(JITTED_CALL_EVENT)[keep]
    out = []
    distinct, inverse = unique_with_inverse(names)  # np.unique's order; it sorts every call's name (18 of 20 ms)
    for number, name in enumerate(distinct):
        idx = np.flatnonzero(inverse == number)
        if len(idx) < 3:  # the first call and at least two later ones to compare it with
            continue
        idx = idx[np.argsort(starts[idx], kind="stable")]
        durations = ends[idx] - starts[idx]
        later = float(np.median(durations[1:]))
        if durations[0] >= WARM_UP_MIN_RATIO * later and durations[0] - later >= WARM_UP_MIN_EXCESS_PS:
            out.append(WarmUpCall(events.host, str(name), int(starts[idx[0]]), int(ends[idx[0]]), later / PS_PER_MS))
    if events.vocabulary.runtime_call is not None:
        out += _slow_runtime_calls(events)
    return out


_COPY_CALL = re.compile(r"Memcpy")
_NO_NAME = re.compile(r"(?!)")  # matches no event name: select by a stat alone


def _slow_runtime_calls(events: HostThreads) -> list[WarmUpCall]:
    """GPU runtime calls (HostVocabulary.runtime_call: not its syncs nor copies) that take far longer than their
    call's median, by the first-call rule's ratio and excess (and, as there, two other calls to compare with): the
    first cudaFree that sets up the context, a stream or library handle created once, the allocator growing; and a
    launch that loads its kernel's module: only the first launch of its kernel (first_launch_stat), as a launch
    that is slow at every step (a full launch queue, a lock) is not paid once. Nor is another call that is slow in
    most of the trace's annotated steps (_slow_in_most_steps: the allocator freeing and growing again each step)."""
    words = events.vocabulary
    calls = events.select(words.runtime_call)
    starts, ends, names = calls.start_ps, calls.end_ps, events.names(words.runtime_call)
    firsts = events.select(_NO_NAME, words.first_launch_stat) if words.first_launch_stat else None
    first_starts = set(zip(firsts.line.tolist(), firsts.start_ps.tolist())) if firsts is not None else set()
    is_first = np.array([key in first_starts for key in zip(calls.line.tolist(), starts.tolist())], dtype=bool)
    steps = _annotated_steps(events)
    out = []
    distinct, inverse = unique_with_inverse(names)
    for number, name in enumerate(distinct):
        if words.sync.search(str(name)) or _COPY_CALL.search(str(name)):
            continue
        idx = np.flatnonzero(inverse == number)
        if len(idx) < 3:  # the slow call and at least two others to compare it with
            continue
        durations = ends[idx] - starts[idx]
        median = float(np.median(durations))
        slow = (durations >= WARM_UP_MIN_RATIO * median) & (durations - median >= WARM_UP_MIN_EXCESS_PS)
        if words.dispatch.search(str(name)):
            slow &= is_first[idx]
        elif _slow_in_most_steps(starts[idx[slow]], steps):
            continue
        out += [WarmUpCall(events.host, str(name), int(starts[i]), int(ends[i]), median / PS_PER_MS, first_call=False)
                for i in idx[slow]]
    return out


def _annotated_steps(events: HostThreads) -> list[tuple[int, int]]:
    """(start, end) of each step the trace's own step annotations mark (ProfilerStep#N), one per step number."""
    spans: dict[int, tuple[int, int]] = {}
    for number, start, end in events.step_annotations()[1]:
        found = spans.get(number)
        spans[number] = (start, end) if found is None else (min(found[0], start), max(found[1], end))
    return sorted(spans.values())


def _slow_in_most_steps(slow_starts: np.ndarray, steps: list[tuple[int, int]]) -> bool:
    """Whether a call's slow runs start in more than half of the annotated steps, and in two at least: a cost every
    step pays (per-step overhead), not a one-time one. Without two steps to compare, nothing recurs."""
    if len(steps) < 2 or not len(slow_starts):
        return False
    ordered = np.sort(slow_starts)
    hit = sum(1 for start, end in steps
              if np.searchsorted(ordered, end, side="left") > np.searchsorted(ordered, start, side="left"))
    return hit >= 2 and hit > len(steps) / 2
