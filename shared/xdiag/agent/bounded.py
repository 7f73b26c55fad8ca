"""Answers sized for an agent's context: every table of an answer cut to a number of rows from an offset, and the
whole answer fitted under a byte ceiling, with what was left out and how to get it said in the answer.

Generic over the answer's shape: a table is any list in the answer (at any depth); the rows of the tables that are
not inside another list start at `offset` (the caller pages with it), lists inside a row keep their first rows. A
tool's columns are never rewritten: a wider row (a new column) only means fewer rows fit under the ceiling.
"""

from __future__ import annotations

import json
from typing import Any

TRUNCATED = "truncated"
"""The answer's key listing each cut list: where it is, the rows shown (1-based, inclusive), how many it holds and
the offset that shows the next ones."""


def compact(answer: Any) -> str:
    """The answer as the agent reads it: JSON without indentation or spaces (an indented copy is ~1.4x the bytes)."""
    return json.dumps(answer, separators=(",", ":"), default=str, ensure_ascii=False)


def bound_answer(answer: dict[str, Any], rows: int, offset: int, ceiling: int, paging: str) -> str:
    """The answer's compact JSON with every list cut to `rows` rows (tables from `offset`), then to fewer rows where
    it would exceed `ceiling` bytes. `paging` says how to ask for other rows (the arguments' names); it is quoted in
    the answer's `truncated` beside each list that was cut. The answer's own keys are kept."""
    cut = _Cut(answer, rows, offset)
    cut.note(paging)
    text = compact(cut.answer)
    if len(text.encode()) <= ceiling:
        return text
    best, low, high = None, 1, rows - 1
    while low <= high:  # the most rows per list that fit, by bisection
        middle = (low + high) // 2
        fitted = _Cut(answer, middle, offset)
        fitted.note(f"cut to {middle} rows per list to fit {ceiling} bytes; {paging}")
        text = compact(fitted.answer)
        if len(text.encode()) <= ceiling:
            best, low = text, middle + 1
        else:
            high = middle - 1
    if best is not None:
        return best
    # Not even one row of each list fits: the lists go, the rest (status, summary, reason) stays.
    empty = _Cut(answer, 0, offset)
    empty.note(f"over {ceiling} bytes with one row per list: every list left out; {paging}")
    return compact(empty.answer)


class _Cut:
    """The answer with its lists cut, and each cut list: where it is, the rows shown (1-based) and how many."""

    def __init__(self, answer: dict[str, Any], rows: int, offset: int) -> None:
        self.rows, self.offset = rows, offset
        self.lists: list[dict[str, Any]] = []
        self.answer = self._walk(answer, "", in_row=False)

    def _walk(self, value: Any, where: str, in_row: bool) -> Any:
        if isinstance(value, dict):
            return {key: self._walk(item, f"{where}.{key}" if where else key, in_row) for key, item in value.items()}
        if not isinstance(value, list):
            return value
        start = 0 if in_row else min(self.offset, len(value))
        kept = value[start:start + self.rows]
        if len(kept) < len(value):
            listed = {"list": where, "rows_shown": [start + 1, start + len(kept)] if kept else [], "rows": len(value)}
            if not in_row and start + len(kept) < len(value):
                listed["next_offset"] = start + len(kept)
            self.lists.append(listed)
        return [self._walk(item, f"{where}[]", in_row=True) for item in kept]

    def note(self, how: str) -> None:
        if self.lists:
            self.answer[TRUNCATED] = {"lists": self.lists, "more": how}
