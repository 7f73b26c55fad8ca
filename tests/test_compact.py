"""The prepared session file gives the tools exactly what reading the profile gives them."""

from __future__ import annotations

import json

import pytest
from xdiag.errors import ProfileError
from xdiag.profile.compact import load_session, save_session
from xdiag.profile.reader import read_session
from xdiag.tools import BROAD_TOOLS, run_tool

from tests.conftest import H200, SHARED_PROFILES

PROFILES = sorted(H200.glob("*.xplane.pb")) + sorted(p for p in SHARED_PROFILES.glob("*/*.xplane.pb") if "bad" not in p.parts)


def _outputs(session) -> dict:
    out = {}
    for tool in (*BROAD_TOOLS, "get_kernel_stats"):
        result = run_tool(session, tool)
        out[tool] = json.dumps([result.status.value, result.reason, result.summary, result.detail], sort_keys=True, default=str)
    return out


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_prepared_session_gives_the_same_tool_results(profile, tmp_path):
    prepared = tmp_path / "session.xdiag"
    save_session(read_session([profile]), prepared)
    assert _outputs(load_session(prepared)) == _outputs(read_session([profile]))


def test_prepared_cpu_session_gives_the_same_tool_results(cpu_profiles, tmp_path):
    prepared = tmp_path / "session.xdiag"
    save_session(read_session([cpu_profiles["recompilation"]]), prepared)
    loaded = load_session(prepared)
    assert _outputs(loaded) == _outputs(read_session([cpu_profiles["recompilation"]]))
    assert [m.display_name for m in loaded.hlo_modules]  # the HLO travels too


def test_a_file_that_is_not_a_prepared_session_is_refused(tmp_path, cpu_profiles):
    with pytest.raises(ProfileError, match="not an xdiag session file"):
        load_session(cpu_profiles["healthy"])
    broken = tmp_path / "broken.xdiag"
    broken.write_bytes(b"XDIAGS01" + (100).to_bytes(8, "little") + b"{not json")
    with pytest.raises(ProfileError, match="corrupt session header"):
        load_session(broken)
