"""The shape of a JSON text checked as it streams, before the parser sees it: the trace reader's limits on what one
file may make it hold (nesting, one string, one number, one event, the values beside the events), whatever the file
holds. xdiag.profile.trace_json feeds it each chunk it reads.
"""

from __future__ import annotations

import numpy as np

from xdiag.errors import ProfileError
from xdiag.sizes import readable_size

TRACE_MAX_DEPTH = 64
"""Nesting of arrays and objects (a Kineto event is 4 deep): the parser's path to a value grows with the depth."""
TRACE_MAX_STRING_BYTES = 1024**2
"""One string, as written: the parser holds a string whole before it hands it on (Kineto's longest are kernel
names and stacks, a few KiB)."""
TRACE_MAX_NUMBER_CHARS = 100
"""One number (or true, false, null), as written: ijson's C parser ends the process on an integer of more than
4,300 digits instead of raising."""
TRACE_MAX_EVENT_BYTES = 1024**2
"""One event, or one top-level value other than `traceEvents`, as written: each is built whole as Python objects."""
TRACE_MAX_TOP_VALUES = 1000
"""Arrays and objects at the top level of a trace object (Kineto writes a dozen keys beside `traceEvents`)."""

_BRACKET = np.zeros(256, np.int8)  # +1 opens an array or object, -1 closes one
_BRACKET[[ord("{"), ord("[")]] = 1
_BRACKET[[ord("}"), ord("]")]] = -1
_LITERAL = np.ones(256, bool)  # a byte of a number, true, false or null where it is outside a string
_LITERAL[list(b'{}[],:" \t\r\n')] = False
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_EXEMPT = -1  # the start recorded for the one container the event limit does not bind: `traceEvents` itself


class JsonShape:
    """Checks the JSON text as it streams, a chunk at a time and before the parser sees that chunk, so the parser never
    holds more than the limits allow: nesting depth, one string's and one number's length, one event's size. Columnar
    (numpy over the chunk's bytes), so the check costs a fraction of the parse."""

    def __init__(self, name: str, top_is_array: bool):
        self.name, self.top_is_array = name, top_is_array
        self.offset = 0  # bytes checked before this chunk
        self.tail = b""  # the last bytes of the previous chunk: what precedes a container that opens at a chunk's start
        self.in_string, self.string_start = False, 0
        self.backslashes = 0  # the run of backslashes that ended the previous chunk
        self.literal_run = 0  # the number (or literal) the previous chunk ended in, so far
        self.depth = 0
        self.top_values = 0
        # Depths whose containers the event limit binds -> the start of the one open there (None: none is open).
        self.bounded: dict[int, int | None] = {2: None} if top_is_array else {2: None, 3: None}

    def _refuse(self, what: str) -> ProfileError:
        return ProfileError(f"{self.name}: {what}; not read (a trace is refused past the reader's limits)")

    def feed(self, chunk: bytes) -> None:
        data = np.frombuffer(chunk, np.uint8)
        quotes = data == _QUOTE
        backslashes = data == _BACKSLASH
        if self.backslashes or backslashes.any():
            self._unmark_escaped(quotes, backslashes)
        inside = np.cumsum(quotes, dtype=np.int32)
        if self.in_string:
            inside += 1
        inside &= 1  # 1 from an opening quote to the byte before its closing quote
        self._check_strings(np.flatnonzero(quotes), len(data))
        self._check_literals(_LITERAL[data] & (inside == 0))
        at = np.flatnonzero((_BRACKET[data] != 0) & (inside == 0))
        self._check_containers(chunk, at, _BRACKET[data[at]])
        self.offset += len(data)
        self.tail = chunk[-64:]

    def _unmark_escaped(self, quotes: np.ndarray, backslashes: np.ndarray) -> None:
        """A quote after an odd run of backslashes is escaped (the run may have begun in the previous chunk)."""
        edges = np.flatnonzero(np.diff(backslashes.view(np.int8), prepend=0, append=0))
        run_starts, run_ends = edges[0::2], edges[1::2]  # each run of backslashes: [start, end)
        if len(run_starts) and run_starts[0] == 0:
            run_starts[0] -= self.backslashes
        escaped = run_ends[run_ends < len(quotes)]
        escaped = escaped[quotes[escaped] & ((escaped - run_starts[: len(escaped)]) % 2 == 1)]
        quotes[escaped] = False
        if self.backslashes % 2 and not backslashes[0]:  # the previous chunk's run ends right before this one
            quotes[0] = False
        if len(run_ends) and run_ends[-1] == len(quotes):
            self.backslashes = int(run_ends[-1] - run_starts[-1])
        else:
            self.backslashes = 0

    def _check_strings(self, quotes: np.ndarray, size: int) -> None:
        at = quotes.astype(np.int64) + self.offset
        if self.in_string:
            at = np.concatenate(([self.string_start], at))
        starts, ends = at[0::2], at[1::2]
        longest = int((ends - starts[: len(ends)]).max()) if len(ends) else 0
        self.in_string = len(starts) > len(ends)
        if self.in_string:
            self.string_start = int(starts[-1])
            longest = max(longest, self.offset + size - self.string_start)
        if longest > TRACE_MAX_STRING_BYTES:
            raise self._refuse(f"a string of more than {readable_size(TRACE_MAX_STRING_BYTES)}")

    def _check_literals(self, literal: np.ndarray) -> None:
        limit, others = TRACE_MAX_NUMBER_CHARS, np.flatnonzero(~literal[: TRACE_MAX_NUMBER_CHARS + 1])
        leading = int(others[0]) if len(others) else len(literal)  # the run the previous chunk began goes on so far
        others_seen = np.cumsum(~literal, dtype=np.int32)  # a run longer than the limit: as many others at both ends
        if self.literal_run + leading > limit or bool((others_seen[limit:] == others_seen[:-limit]).any()):
            raise self._refuse(f"a number (or literal) of more than {limit} characters")
        last_other = len(literal) - 1 - int(np.argmin(literal[::-1])) if not literal.all() else -1
        self.literal_run = len(literal) - 1 - last_other + (self.literal_run if last_other < 0 else 0)

    def _check_containers(self, chunk: bytes, at: np.ndarray, steps: np.ndarray) -> None:
        depths = self.depth + np.cumsum(steps, dtype=np.int64)  # the depth after each bracket
        if len(depths):
            if int(depths.max()) > TRACE_MAX_DEPTH:
                raise self._refuse(f"arrays or objects nested more than {TRACE_MAX_DEPTH} deep")
            if int(depths.min()) < 0:
                raise ProfileError(f"{self.name}: not valid JSON (a bracket closes what never opened)")
            self.depth = int(depths[-1])
        for depth in self.bounded:
            opens = at[(steps == 1) & (depths == depth)]
            closes = at[(steps == -1) & (depths == depth - 1)]
            if depth == 2 and not self.top_is_array:
                self._top_values(chunk, opens, closes)
                continue
            starts = opens.astype(np.int64) + self.offset
            if self.bounded[depth] is not None:
                starts = np.concatenate(([self.bounded[depth]], starts))
            ends = closes.astype(np.int64) + self.offset
            longest = int((ends - starts[: len(ends)]).max()) if len(ends) else 0
            self.bounded[depth] = int(starts[-1]) if len(starts) > len(ends) else None
            if self.bounded[depth] is not None:
                longest = max(longest, self.offset + len(chunk) - self.bounded[depth])
            if longest > TRACE_MAX_EVENT_BYTES:
                raise self._refuse(f"an event of more than {readable_size(TRACE_MAX_EVENT_BYTES)}")

    def _top_values(self, chunk: bytes, opens: np.ndarray, closes: np.ndarray) -> None:
        """The top-level arrays and objects: each bound by the event limit, but `traceEvents`, whose events are."""
        self.top_values += len(opens)
        if self.top_values > TRACE_MAX_TOP_VALUES:
            raise self._refuse(f"more than {TRACE_MAX_TOP_VALUES} arrays or objects beside the events")
        start = self.bounded[2]
        for position in sorted([*opens.tolist(), *closes.tolist()]):  # an open, its close, the next open...
            if start is None:
                before = (self.tail + chunk[:position])[-64:].rstrip()
                is_events = before.endswith(b":") and before[:-1].rstrip().endswith(b'"traceEvents"')
                start = _EXEMPT if is_events else self.offset + position
            else:
                if start != _EXEMPT and self.offset + position - start > TRACE_MAX_EVENT_BYTES:
                    raise self._refuse(f"a top-level value of more than {readable_size(TRACE_MAX_EVENT_BYTES)}")
                start = None
        self.bounded[2] = start
        if start not in (None, _EXEMPT) and self.offset + len(chunk) - start > TRACE_MAX_EVENT_BYTES:
            raise self._refuse(f"a top-level value of more than {readable_size(TRACE_MAX_EVENT_BYTES)}")
