"""The decoders on hostile input: a few hundred seeded mutants of committed real profiles, and the minimal reproducer
of every class the fuzzing of issue 56 found (tests/profiles/hostile, with the 20 MB of empty XEvents and the 200,000
empty lines made here), each read in a child process of its own (tests/fuzzing.py). Every one ends in exit 2 with one
line of reason, or a correct exit 0, within 60 s and 512 MiB over the unmutated file's peak: on the decoder compiled
ahead of time and on numba's JIT build alike, and through `xdiag analyze` (XProf's views on and off) and `xdiag tool`.

The mutants are the same every run (seed 56); `python -m tests.fuzzing --seed N` runs others."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzzing import GOOD, reproducers

TESTS = Path(__file__).resolve().parent
HOSTILE = TESTS / "profiles" / "hostile"


def _fuzz(tmp_path: Path, *args: str, jit: bool = False) -> dict:
    """tests/fuzzing.py run with `args`; its results."""
    out = tmp_path / "results.json"
    env = {**os.environ, "XDIAG_WIRE_JIT": "1" if jit else "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "shared"), str(TESTS.parent)])}
    done = subprocess.run([sys.executable, "-m", "tests.fuzzing", *args, "--json", str(out)], cwd=TESTS.parent,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def _not_good(results: dict) -> list:
    """The inputs that did not end as wanted, and those whose reason names a negative byte position."""
    return [(seed, how, outcome["outcome"], outcome["last_line"]) for seed, how, outcome in results["results"]
            if outcome["outcome"] not in GOOD or re.search(r"byte -\d", outcome["last_line"])]


def test_the_committed_reproducers_are_what_the_fuzzing_module_makes():
    made = reproducers()
    assert sorted(made) == sorted(p.name for p in HOSTILE.iterdir() if p.name != "README.md")
    for name, data in made.items():
        assert (HOSTILE / name).read_bytes() == data, name


@pytest.mark.parametrize("jit", [False, True], ids=["compiled", "jit"])
def test_mutants_and_reproducers_end_in_exit_2_with_one_line_or_exit_0(tmp_path, jit):
    results = _fuzz(tmp_path, "--mode", "reader", "--xplanes", "200", "--traces", "100", "--with-reproducers",
                    jit=jit)
    assert _not_good(results) == []
    counts = results["counts"]
    assert counts["exit 2, one line"] > 100 and counts["exit 0"] > 20  # mutants of every kind, not all refused


@pytest.mark.parametrize("mode", ["analyze", "analyze-no-views", "tool"])
def test_the_reproducers_through_the_commands_end_in_exit_2_with_one_line_or_exit_0(tmp_path, mode):
    results = _fuzz(tmp_path, "--mode", mode, "--reproducers")
    assert _not_good(results) == []
    outcomes = {seed: outcome for seed, _, outcome in results["results"]}
    assert outcomes["event_length_2p63.xplane.pb"]["outcome"] == "exit 2, one line"
    assert "is corrupt" in outcomes["event_length_2p63.xplane.pb"]["last_line"]
    assert "more events than its bytes hold" in outcomes["empty_events_20MB.xplane.pb"]["last_line"]


def test_a_many_host_read_stops_a_worker_that_does_not_answer_in_time(tmp_path, monkeypatch):
    from xdiag.errors import ProfileError
    from xdiag.profile import hosts_map

    folder = tmp_path / "session"
    folder.mkdir()
    for host in ("host0", "host1"):
        (folder / f"{host}.xplane.pb").write_bytes((TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb").read_bytes())
    monkeypatch.setattr(hosts_map, "host_seconds", lambda size: 0.05)  # less than a worker's interpreter takes to start
    with pytest.raises(ProfileError, match=r"host0.xplane.pb: the host's reader did not answer within 0 s"):
        hosts_map.read_session_by_host(sorted(folder.iterdir()), workers=1)
    monkeypatch.undo()
    assert len(hosts_map.read_session_by_host(sorted(folder.iterdir()), workers=1).hosts) == 2  # in time: read


def test_a_read_past_its_time_bound_stops_with_one_line(monkeypatch):
    from xdiag.errors import ProfileError
    from xdiag.profile import read_bounds
    from xdiag.profile.reader import read_session_in_process

    monkeypatch.setattr(read_bounds, "READ_SECONDS", -1.0)  # every read is past its bound at its first check
    for path in (TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb",
                 TESTS / "profiles" / "torch_ranks" / "balanced" / "rank0.pt.trace.json.gz"):
        with pytest.raises(ProfileError, match=rf"^{re.escape(path.name)}: the read took longer than its bound "
                                               r"\(-1 s \+ 1 s a MiB\) and stopped at byte \d+; not read$"):
            read_session_in_process([path])
