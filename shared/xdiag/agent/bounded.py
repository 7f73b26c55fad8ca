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
"""The answer's key listing each cut list: where it is, the rows shown (1-based, inclusive) and how many it holds."""


def compact(answer: Any) -> str:
    """The answer as the agent reads it: JSON without indentation or spaces (an indented copy is ~1.4x the bytes)."""
    return json.dumps(answer, separators=(",", ":"), default=str, ensure_ascii=False)


def bound_answer(answer: dict[str, Any], rows: int, offset: int, ceiling: int, paging: str) -> tuple[dict, str]:
    """The answer with every list cut to `rows` rows (tables from `offset`), then to fewer rows where its compact
    JSON would exceed `ceiling` bytes; and that JSON. `paging` says how to ask for other rows (the arguments'
    names), quoted in the answer wherever a list was cut. The answer's own keys are kept; `truncated` is added."""
    cut = _cut(answer, rows, offset)
    text = compact(cut.answer)
    if len(text.encode()) > ceiling:
        fitted = _fit(answer, rows, offset, ceiling, paging)
        if fitted is not None:
            return fitted
        # Not even its first row of each table fits: the tables go, the rest (status, summary, reason) stays.
        cut = _cut(answer, 0, offset)
        cut.note(f"over {ceiling} bytes with one row per list: every list left out ({paging} to page)")
    elif not cut.cuts:
        return answer, text
    else:
        cut.note(paging)
    return cut.answer, compact(cut.answer)


def _fit(answer: dict[str, Any], rows: int, offset: int, ceiling: int, paging: str) -> tuple[dict, str] | None:
    """The most rows per list (at most `rows`) whose answer fits under `ceiling` bytes, by bisection."""
    best, low, high = None, 1, rows - 1
    while low <= high:
        middle = (low + high) // 2
        cut = _cut(answer, middle, offset)
        cut.note(f"cut to {middle} rows per list to fit {ceiling} bytes; {paging}")
        text = compact(cut.answer)
        if len(text.encode()) <= ceiling:
            best, low = (cut.answer, text), middle + 1
        else:
            high = middle - 1
    return best


class _Cut:
    def __init__(self, answer: dict[str, Any], rows: int, offset: int) -> None:
        self.rows, self.offset = rows, offset
        self.cuts: list[dict[str, Any]] = []
        self.answer = self._walk(answer, "", in_row=False)

    def _walk(self, value: Any, where: str, in_row: bool) -> Any:
        if isinstance(value, dict):
            return {key: self._walk(item, f"{where}.{key}" if where else key, in_row) for key, item in value.items()}
        if not isinstance(value, list):
            return value
        start = 0 if in_row else min(self.offset, len(value))
        kept = value[start:start + self.rows]
        if len(kept) < len(value):
            shown = [start + 1, start + len(kept)] if kept else []
            self.cuts.append({"list": where, "rows_shown": shown, "rows": len(value)})
        return [self._walk(item, f"{where}[]", in_row=True) for item in kept]

    def note(self, how: str) -> None:
        if self.cuts:
            self.answer[TRUNCATED] = {"lists": self.cuts, "more": how}


def _cut(answer: dict[str, Any], rows: int, offset: int) -> _Cut:
    return _Cut(answer, rows, offset)
