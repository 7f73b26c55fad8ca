"""A trace file's planes and lines as the trace reader builds them, an event at a time: each line's names, times, kinds
and sparse stats in growing arrays (no Python object per event), each plane's names and texts numbered in the order
first met; finished into the session's Plane and Line columns once the file is read (xdiag.profile.trace_json).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np

from xdiag.profile.space import NO_VALUE, Line, Plane, StatColumns, TimeColumn


class LineColumns:
    """One line's events as they arrive: name ids, start and duration (ps from the file's base), sparse stats."""

    def __init__(self, line_id: int, name: str):
        self.id, self.name = line_id, name
        self.names, self.starts, self.durations = array("l"), array("q"), array("q")
        self.kinds = array("b")  # the kind of each event, as the trace reader numbers them
        self.numeric: dict[str, tuple[array, array]] = {}
        self.strings: dict[str, tuple[array, array]] = {}

    def add(self, name_id: int, start_ps: int, duration_ps: int, kind: int = 0) -> int:
        self.names.append(name_id)
        self.starts.append(start_ps)
        self.durations.append(duration_ps)
        self.kinds.append(kind)
        return len(self.names) - 1

    def put(self, table: dict, stat: str, index: int, value: int) -> None:
        if stat not in table:
            table[stat] = (array("q"), array("q"))
        table[stat][0].append(index)
        table[stat][1].append(value)

    def earliest_ps(self) -> int | None:
        return min(self.starts) if len(self.starts) else None

    def line(self, base_ns: int, shift_ps: int) -> Line:
        """The finished line, its times `shift_ps` later (so none is before the line's timestamp)."""
        count = len(self.names)
        numeric, strings = StatColumns(count, NO_VALUE, np.int64), StatColumns(count, -1, np.int32)
        for table, columns in ((self.numeric, numeric), (self.strings, strings)):
            for stat, (index, values) in table.items():
                columns.put(stat, np.frombuffer(index, np.int64).astype(np.int32), np.frombuffer(values, np.int64))
        metadata = np.frombuffer(self.names, np.int64) if count else np.empty(0, np.int64)
        top = int(metadata.max()) if count else 0
        metadata = metadata.astype(np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.int32)
        return Line(self.id, self.name, self.name, base_ns, metadata,
                    TimeColumn.pack(np.frombuffer(self.starts, np.int64) + shift_ps),
                    TimeColumn.pack(np.frombuffer(self.durations, np.int64).copy()), numeric, strings)


class PlaneColumns:
    def __init__(self, plane_id: int, name: str, hold_text: Callable[[str], None]):
        self.id, self.name, self.hold_text = plane_id, name, hold_text
        self.names: dict[str, int] = {}
        self.metadata_stats: dict[int, dict[str, object]] = {}
        self.strings: dict[str, int] = {}
        self.lines: dict[object, LineColumns] = {}
        self.stats: dict[str, object] = {}

    def name_id(self, name: str) -> int:
        return self._number(self.names, name)

    def string_id(self, text: str) -> int:
        return self._number(self.strings, text)

    def _number(self, table: dict[str, int], text: str) -> int:
        """The text's number in `table`, texts numbered in the order first met; a new one counts against the file's
        limit on texts (hold_text)."""
        found = table.get(text)
        if found is None:
            self.hold_text(text)
            found = table[text] = len(table)
        return found

    def line(self, key: object, name: str) -> LineColumns:
        found = self.lines.get(key)
        if found is None:
            found = self.lines[key] = LineColumns(len(self.lines), name)
        return found

    def earliest_ps(self) -> int | None:
        starts = [found for line in self.lines.values() if (found := line.earliest_ps()) is not None]
        return min(starts) if starts else None

    def plane(self, host: str, base_ns: int, shift_ps: int, line_names: dict[object, str]) -> Plane:
        lines = []
        for key, columns in self.lines.items():
            columns.name = line_names.get(key, columns.name)
            lines.append(columns.line(base_ns, shift_ps))
        return Plane(self.id, self.name, host, {v: k for k, v in self.names.items()}, {}, self.metadata_stats,
                     self.stats, list(self.strings), lines)
