"""Issue 61 item 5: the fix trials on a TPU v5e, re-read from the committed captures.

Each trial (bench/fix_trials/trials.json) is a program of bench/fix_trials/programs/ captured as its user wrote it
and, where one was captured, after one change. Here every capture's report is made again: the "before" report
must name the lever the program was written to need, and the "after" report must no longer lead with it. The
realized gains in bench/fix_trials.md must be the ones the committed step times give (steps.json), so the table
cannot drift from the captures. A known gap is an xfail(strict): it fails the day the gap closes.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fix_trials", REPO / "bench" / "fix_trials" / "trials.py")
ft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ft)
TRIALS = {t["program"]: t for t in ft.trials()}
PAIRS = [p for p, t in TRIALS.items() if t.get("after")]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    work = tmp_path_factory.mktemp("fix_trials")
    return {p: ft.row(t, work) for p, t in TRIALS.items()}


def _known_gap(trial: dict, field: str):
    return pytest.mark.xfail(strict=True, reason=trial[field]) if trial.get(field) else ()


def test_every_trial_has_its_program_and_captures():
    for program, trial in TRIALS.items():
        source = (REPO / "bench" / "fix_trials" / "programs" / f"{program}.py").read_text()
        variants = re.search(r"^VARIANTS = (\[.*\])$", source, re.M)
        assert variants, program
        labels = ["before-a", "before-b"] + ([trial["after"]] if trial.get("after") else [])
        for label in labels:
            rec = ft.steps(program, label)
            assert rec["program"] == program and rec["variant"] in json.loads(variants.group(1).replace("'", '"'))
            assert len(rec["pipelined"]["per_step_ms"]) == 10 and rec["pipelined"]["mean_ms"] > 0
            assert rec["units"] and rec["device"].startswith("TPU v5")
            assert (ft.CAPTURES / f"{program}.{label}.xplane.pb.xz").stat().st_size > 10_000


@pytest.mark.parametrize("program", [pytest.param(p, marks=_known_gap(t, "missed")) for p, t in TRIALS.items()])
def test_before_report_names_the_lever(rows, program):
    assert rows[program]["named"], (rows[program]["top_lever"], rows[program]["top_title"])


@pytest.mark.parametrize("program", [pytest.param(p, marks=_known_gap(TRIALS[p], "lead_expected")) for p in PAIRS])
def test_after_report_no_longer_leads_with_it(rows, program):
    assert rows[program]["after_top_lever"] != TRIALS[program]["lever"], rows[program]["after_top_title"]


def test_the_table_holds_what_the_captures_measured(rows):
    """Every trial row of bench/fix_trials.md: before and after ms and the realized gain, from steps.json."""
    table = (REPO / "bench" / "fix_trials.md").read_text()
    for program, row in rows.items():
        line = next((ln for ln in table.splitlines() if ln.startswith(f"| `{program}`")), None)
        assert line, program
        assert f"{row['before_ms']:.1f} ms" in line, (program, line)
        if "realized" in row:
            assert f"{row['after_ms']:.1f} ms" in line and f"{row['realized']:+.1f}%" in line, (program, line)
