"""The prepared session file gives the tools exactly what reading the profile gives them, with the shared tables it
carries or without them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from xdiag.analysis import prepared as prepared_tables
from xdiag.analysis.breakdown import StepRow
from xdiag.analysis.op_table import OpTable
from xdiag.errors import ProfileError
from xdiag.profile.compact import MAGIC, load_session, save_session
from xdiag.profile.session import read_session
from xdiag.tools import BROAD_TOOLS, run_tool

from tests.conftest import H200, SHARED_PROFILES

PROFILES = sorted(H200.glob("*.xplane.pb")) + sorted(p for p in SHARED_PROFILES.glob("*/*.xplane.pb") if "bad" not in p.parts)


def _outputs(session) -> dict:
    out = {}
    for tool in (*BROAD_TOOLS, "get_kernel_stats"):
        result = run_tool(session, tool)
        out[tool] = json.dumps([result.status.value, result.reason, result.summary, result.detail], sort_keys=True, default=str)
    return out


def _same_tables(built, adopted) -> None:
    """Every column of the op table with its dtype, and the rows with their values' types (a NumPy float rounds
    otherwise than a Python one)."""
    ops, stored = built.cache["op_table"], adopted.cache["op_table"]
    for column in (*OpTable.STORED, *OpTable.CODED):
        assert getattr(stored, column).dtype == getattr(ops, column).dtype, column
        assert np.array_equal(getattr(stored, column), getattr(ops, column)), column
    assert stored.keys() == ops.keys()
    # One array holds the ends and the events' ends where no `end:` event paired with an op, in the file too.
    assert stored.ends_are_events_ends == ops.ends_are_events_ends
    for key in ("step_set", "step_rows", "device_rows"):
        assert repr(adopted.cache[key]) == repr(built.cache[key]), key


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_prepared_session_and_its_tables_give_the_same_tool_results(profile, tmp_path):
    prepared = tmp_path / "session.xdiag"
    session = read_session([profile])
    save_session(session, prepared, prepared_tables.export(session))
    loaded = load_session(prepared)
    assert prepared_tables.adopt(loaded) and not loaded.stored_tables
    _same_tables(session, loaded)
    assert session.cache["op_table"].ends_are_events_ends  # a device's ops end where their events end
    assert _outputs(loaded) == _outputs(read_session([profile]))


def test_rows_keep_each_value_and_its_type_through_the_file():
    """Columns of one NumPy type, of mixed types, and rows of differing shapes (stored value by value)."""
    rows = [StepRow("h", 0, np.float64(1.25), {"compute": np.float64(0.5), "host_other": 0.75}, 3, 1, 0, 0, 0),
            StepRow("h", np.int64(1), 2.5, {"compute": np.float64(1 / 3), "host_other": 0.1}, 4, 1, 0, 1, 0, "d")]
    differing = [*rows, StepRow("h", 2, 1.0, {"compute": 1.0}, 0, 0, 0, 0, 0)]
    for table in (rows, differing):
        stored = json.loads(json.dumps(prepared_tables._as_columns(table)))
        assert repr([StepRow(**row) for row in prepared_tables._from_columns(stored)]) == repr(table)


def test_tables_of_other_code_or_damaged_are_rebuilt_not_adopted(h200_profiles, tmp_path, monkeypatch):
    prepared = tmp_path / "session.xdiag"
    session = read_session([h200_profiles["small_steps"]])
    save_session(session, prepared, prepared_tables.export(session))
    expected = _outputs(session)
    loaded = load_session(prepared)
    del loaded.stored_tables["steps"]["paths"]  # damaged: the tools build the tables themselves
    assert not prepared_tables.adopt(loaded) and "op_table" not in loaded.cache
    assert _outputs(loaded) == expected
    monkeypatch.setattr(prepared_tables, "code_digest", lambda: "another version of the analysis")
    loaded = load_session(prepared)
    assert not prepared_tables.adopt(loaded) and "op_table" not in loaded.cache
    assert _outputs(loaded) == expected


def test_prepared_cpu_session_gives_the_same_tool_results(cpu_profiles, tmp_path):
    prepared = tmp_path / "session.xdiag"
    save_session(read_session([cpu_profiles["recompilation"]]), prepared)  # without tables: the tools build them
    loaded = load_session(prepared)
    assert not prepared_tables.adopt(loaded)
    assert _outputs(loaded) == _outputs(read_session([cpu_profiles["recompilation"]]))
    assert [m.display_name for m in loaded.hlo_modules]  # the HLO travels too


@pytest.mark.parametrize("workload", ["dispatch_bound", "host_sync", "collective_bound"])
def test_prepared_cpu_tables_give_the_same_tool_results(cpu_profiles, workload, tmp_path):
    prepared = tmp_path / "session.xdiag"
    session = read_session([cpu_profiles[workload]])
    save_session(session, prepared, prepared_tables.export(session))
    loaded = load_session(prepared)
    assert prepared_tables.adopt(loaded)
    _same_tables(session, loaded)
    assert _outputs(loaded) == _outputs(read_session([cpu_profiles[workload]]))


def test_a_file_that_is_not_a_prepared_session_is_refused(tmp_path, cpu_profiles):
    with pytest.raises(ProfileError, match="not an xdiag session file"):
        load_session(cpu_profiles["healthy"])
    broken = tmp_path / "broken.xdiag"
    broken.write_bytes(MAGIC + (100).to_bytes(8, "little") + b"{not json")
    with pytest.raises(ProfileError, match="corrupt session header"):
        load_session(broken)
