"""The per-step tables of a session assembled from many hosts, held as arrays (xdiag.analysis.packed) and made into
rows once, where read (MadeOnFirstRead): every value comes back as it went in, of its type, on a real TPU capture's
steps and step rows."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from xdiag.analysis import packed
from xdiag.analysis.breakdown import StepRow, step_rows
from xdiag.analysis.prepared import _as_columns
from xdiag.analysis.steps import Step, step_set
from xdiag.profile.session import read_session

PROFILE = Path(__file__).parent / "profiles" / "tpu_v5e" / "kv_decode.xplane.pb"


@pytest.fixture(scope="module")
def session():
    return read_session([PROFILE])


def _stored(rows: list) -> dict:
    """As a host's summary stores them: typed columns, through JSON."""
    return json.loads(json.dumps(_as_columns(rows)))


def _fields(row) -> list:
    values = []
    for value in dataclasses.astuple(row):
        items = sorted(value.items()) if isinstance(value, dict) else [value]
        values += [(type(item), repr(item)) for item in items]
    return values


@pytest.mark.parametrize("table, kind", [("steps", Step), ("step_rows", StepRow)])
def test_two_hosts_joined_come_back_value_for_value_the_second_moved_by_its_shift(session, table, kind):
    rows = step_set(session).steps if table == "steps" else step_rows(session)
    assert rows
    part = packed.pack(_stored(rows))
    shift = 1_234_567
    back = packed.rows(packed.decode(json.loads(json.dumps(packed.encode(packed.joined([part, part], [0, shift]))))),
                       kind)
    moved = [dataclasses.replace(row, **{key: getattr(row, key) + shift for key in ("start_ps", "end_ps")
                                         if hasattr(row, key)}) for row in rows]
    assert [_fields(row) for row in back] == [_fields(row) for row in [*rows, *moved]]


def test_hosts_whose_columns_differ_in_type_are_joined_row_by_row(session):
    rows = step_rows(session)
    first, second = _stored(rows), _stored(rows)
    column = second["paths"].index(["step_ms"])
    assert second["columns"][column]["kind"] == "" and isinstance(second["columns"][column]["values"][0], float)
    second["columns"][column]["values"][0] = -0.0
    second["columns"][column]["values"][1] = 7  # an int among floats: no one array holds both as they were
    joined = packed.joined([packed.pack(first), packed.pack(second)])
    assert "rows" in joined
    back = packed.rows(packed.decode(json.loads(json.dumps(packed.encode(joined)))), StepRow)
    assert len(back) == 2 * len(rows)
    assert math.copysign(1, back[len(rows)].step_ms) == -1 and back[len(rows) + 1].step_ms == 7
    assert type(back[len(rows) + 1].step_ms) is int
    assert [_fields(row) for row in back[:len(rows)]] == [_fields(row) for row in rows]


def test_a_negative_zero_keeps_its_sign_among_zeros(session):
    rows = step_rows(session)
    stored = _stored(rows)
    column = stored["paths"].index(["step_ms"])
    stored["columns"][column]["values"][:2] = [0.0, -0.0]
    back = packed.rows(packed.pack(stored), StepRow)
    assert [math.copysign(1, row.step_ms) for row in back[:2]] == [1, -1]


def test_a_table_made_on_first_read_is_made_once_when_threads_ask_at_once():
    import threading
    import time

    from xdiag.analysis.session_cache import MadeOnFirstRead

    made = []

    def slow() -> list:
        made.append(1)
        time.sleep(0.2)
        return ["rows"]

    cache = MadeOnFirstRead({"kept": 1}, {"step_rows": slow})
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(("step_rows" in cache, cache["step_rows"])))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [1] and seen == [(True, ["rows"])] * 4
    assert cache.get("kept") == 1 and cache.get("missing") is None and "missing" not in cache
