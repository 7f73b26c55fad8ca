"""When did a host's threads run events of a given name? A host's /host:CPU thread lines, queried by event-name
pattern (dispatch, compile, sync, callback, step annotations) in its runtime's words (host_vocabulary). XProf's
filter of the host events its views read is another thing: xdiag.analysis.xprof.host_events."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from xdiag.analysis.host_vocabulary import COMPLETION_SUFFIX, PYTORCH_HOST, XLA_HOST, HostVocabulary
from xdiag.analysis.intervals import merge_intervals
from xdiag.analysis.session_cache import cached
from xdiag.profile.columns import isin_ids
from xdiag.profile.space import Line, Plane, Session
from xdiag.profile.trace_json import FORMAT_STAT, KINETO

STEP_STAT = "step_num"


@dataclass
class EventSelection:
    """Host-thread events whose names match a pattern (XLA op events excluded)."""

    start_ps: np.ndarray
    end_ps: np.ndarray
    line: np.ndarray  # int32: which host thread each event is on (for nesting; see HostThreads.thread_of_line)


class HostThreads:
    """A host's thread lines, queried by event-name pattern.

    Nothing is copied up front: a query matches the pattern once per distinct event name, then
    gathers only the matching events, so memory follows what the analysis asks for rather than
    the profile's size.
    """

    def __init__(self, host: str, lines: list[tuple[Plane, Line]], vocabulary: HostVocabulary = XLA_HOST,
                 release: Callable[[], None] | None = None):
        self.host = host
        self._release = release or (lambda: None)  # after each query: its pages go back (HostProfile.release_pages)
        self.vocabulary = vocabulary
        self._lines = lines
        self._selections: dict[str, EventSelection] = {}
        self._unions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.derived: dict[str, Any] = {}  # what analyses find from these threads alone, once (warm_up_calls)
        self.thread_of_line = _threads_of_lines([line.name for _, line in lines])

    def _non_op(self, line: Line) -> np.ndarray | None:
        """Events that are not XLA ops (None: all of them)."""
        sparse = line.strings.sparse("hlo_op")
        if sparse is None:
            return None
        mask = np.ones(len(line), dtype=bool)
        mask[sparse[0][sparse[1] >= 0]] = False
        return mask

    def _matching(self, pattern: re.Pattern, stat: str | None = None,
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(line number, starts, ends, metadata ids) of each line's non-op events whose names match (or that carry
        `stat`)."""
        ids_by_plane: dict[int, np.ndarray] = {}  # a plane's names are matched once, not once per line (hundreds)
        for number, (plane, line) in enumerate(self._lines):
            ids = ids_by_plane.get(id(plane))
            if ids is None:
                ids = np.array([k for k, n in plane.event_names.items() if pattern.search(n)], dtype=np.int64)
                ids_by_plane[id(plane)] = ids
            marked = line.numeric.sparse(stat) if stat else None
            if not len(ids) and marked is None:
                continue
            mask = isin_ids(line.metadata_id, ids)
            if marked is not None:
                mask[marked[0]] = True
            non_op = self._non_op(line)
            if non_op is not None:
                mask &= non_op
            starts = line.starts.at(mask)
            yield number, starts, starts + line.durations.at(mask), line.metadata_id[mask]
        self._release()

    def select(self, pattern: re.Pattern, stat: str | None = None) -> EventSelection:
        key = pattern.pattern if stat is None else f"{pattern.pattern}\x00{stat}"
        if key in self._selections:
            return self._selections[key]
        starts, ends, lines = [], [], []
        for number, line_starts, line_ends, _ in self._matching(pattern, stat):
            starts.append(line_starts)
            ends.append(line_ends)
            lines.append(np.full(len(line_starts), self.thread_of_line[number], dtype=np.int32))
        empty = np.empty(0, np.int64)
        selection = EventSelection(
            start_ps=np.concatenate(starts) if starts else empty,
            end_ps=np.concatenate(ends) if ends else empty,
            line=np.concatenate(lines) if lines else np.empty(0, np.int32),
        )
        self._selections[key] = selection
        return selection

    def names(self, pattern: re.Pattern, stat: str | None = None) -> np.ndarray:
        """The names of the events `select(pattern, stat)` returns, in the same order."""
        codes, vocabulary = self.name_codes(pattern, stat)
        return vocabulary[codes]

    def name_codes(self, pattern: re.Pattern, stat: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(codes, vocabulary): the names of the events `select(pattern, stat)` returns, in the same order, as
        vocabulary[codes]; a name is in the vocabulary once per line that holds it (a few distinct names, many
        events: each looked up, and tested by a caller, once per line, not once per event)."""
        codes, vocabulary, size = [], [], 0
        for number, _, _, ids in self._matching(pattern, stat):
            unique, inverse = np.unique(ids, return_inverse=True)
            event_names = self._lines[number][0].event_names
            vocabulary += [event_names.get(int(i), "") for i in unique]
            codes.append(inverse.astype(np.int64) + size)
            size += len(unique)
        return (np.concatenate(codes) if codes else np.empty(0, np.int64)), np.array(vocabulary, dtype=object)

    def union(self, pattern: re.Pattern) -> tuple[np.ndarray, np.ndarray]:
        """merge_intervals of the matching events, built line by line: each line's events merge on their own
        first (nested calls collapse), so the events are never gathered in one place (the dispatch events of
        the 2 GiB bench profile are 12 million)."""
        if pattern.pattern not in self._unions:
            if pattern.pattern in self._selections:
                selected = self._selections[pattern.pattern]
                merged = merge_intervals(selected.start_ps, selected.end_ps)
            else:
                per_line = [merge_intervals(starts, ends) for _, starts, ends, _ in self._matching(pattern)]
                merged = merge_intervals(
                    np.concatenate([s for s, _ in per_line]) if per_line else np.empty(0, np.int64),
                    np.concatenate([e for _, e in per_line]) if per_line else np.empty(0, np.int64),
                )
            self._unions[pattern.pattern] = merged
        return self._unions[pattern.pattern]

    def issued_until_done(self, pattern: re.Pattern) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) from each issue event matching `pattern` to its completion (`<issue name>=>Done`, the
        first not yet taken after it, in order): what runs in between, e.g. a DMA, has no event of its own."""
        done_names = {n for plane, _ in self._lines for n in plane.event_names.values()
                      if n.endswith(COMPLETION_SUFFIX) and pattern.search(n)}
        starts, ends = [], []
        for done_name in sorted(done_names):
            issued = self.select(re.compile(f"^{re.escape(done_name[:-len(COMPLETION_SUFFIX)])}$"))
            done = self.select(re.compile(f"^{re.escape(done_name)}$"))
            issue_starts = np.sort(issued.start_ps)
            done_ends = np.sort(done.end_ps)
            # FIFO: the k-th issue completes with the k-th completion that ends after it.
            n = min(len(issue_starts), len(done_ends))
            first = int(np.searchsorted(done_ends, issue_starts[0], side="right")) if n else 0
            n = min(len(issue_starts), len(done_ends) - first)
            if n > 0:
                starts.append(issue_starts[:n])
                ends.append(np.maximum(done_ends[first:first + n], issue_starts[:n]))
        empty = np.empty(0, np.int64)
        return (np.concatenate(starts), np.concatenate(ends)) if starts else (empty, empty)

    def step_annotations(self) -> tuple[str, list[tuple[int, int, int]]]:
        """(annotation name, [(step number, start, end)]) from events that carry a step_num stat."""
        name, steps = "", []
        for plane, line in self._lines:
            sparse = line.numeric.sparse(STEP_STAT)
            if sparse is None:
                continue
            index, numbers = sparse
            if not name and len(index):
                name = plane.event_names.get(int(line.metadata_id[index[0]]), "")
            starts = line.starts.at(index)
            ends = starts + line.durations.at(index)
            steps += zip(numbers.tolist(), starts.tolist(), ends.tolist())
        self._release()
        return name, steps


_PYTHON_LINE = re.compile(r"^python[\d.]*$")
_MAIN_THREAD_LINE = re.compile(r"^main/\d+$")


def _threads_of_lines(names: list[str]) -> list[int]:
    """Per host line, the thread it records: its own number, except that the Python tracer's line (`python3`) and
    the runtime's line of the process's main thread (`main/<pid>`) are one thread, the one that runs the program's
    Python, so a call seen on both (PjitFunction on one, its execute on the other) nests as one call. Where there
    are several of either, which pairs up is unknown: each keeps its own."""
    threads = list(range(len(names)))
    python = [i for i, n in enumerate(names) if _PYTHON_LINE.match(n)]
    main = [i for i, n in enumerate(names) if _MAIN_THREAD_LINE.match(n)]
    if len(python) == 1 and len(main) == 1:
        threads[main[0]] = python[0]
    return threads


def host_threads(session: Session) -> list[HostThreads]:
    """Per host: its /host:CPU thread lines, to query for dispatch, compile, sync and step events."""

    def build() -> list[HostThreads]:
        out = []
        for host in session.hosts:
            planes = [plane for plane in host.planes if plane.name == "/host:CPU"]
            vocabulary = PYTORCH_HOST if any(p.stats.get(FORMAT_STAT) == KINETO for p in planes) else XLA_HOST
            out.append(HostThreads(host.hostname, [(plane, line) for plane in planes for line in plane.lines], vocabulary,
                                   host.release_pages))
        return out

    return cached(session, "host_threads", build)


def python_tracer_events(session: Session) -> int | None:
    """Events the Python tracer recorded (its `python3` line on each host's /host:CPU plane): one per Python
    function call while python_tracer_level was 1; None where the session keeps no host lines (assembled from host
    summaries)."""
    lines = [line for host in session.hosts for plane in host.planes if plane.name == "/host:CPU"
             for line in plane.lines]
    if not lines:
        return None
    return sum(len(line) for line in lines if _PYTHON_LINE.match(line.name))
