"""The answer keys themselves (issue 65): the public profiles they need are here, each expected answer names the
independent measurement it stands on, and the profiles that judge generalisation were committed before the rules.

- ../shared (the public profiles and traces beside the checkout) missing is a failure; a local run without it may
  set XDIAG_ALLOW_MISSING_SHARED=1 to skip those tests, which CI (CI=true) never honours.
- An expected answer that is not the workload's design (`expected_by_platform`), and each expert reading of a
  public trace (test_kineto's READINGS), records beside it a measurement the analyser did not make: a hand count
  (from the shapes or the raw file), host timers, or an untraced A/B run; the A/B figures are read back from the
  file they cite.
- A profile called held out was added by a commit that changed no code that judges a profile.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from xdiag.examples import ACCELERATOR_WORKLOADS, WORKLOADS

from tests.conftest import ALLOW_MISSING_SHARED, SHARED_PROFILES, TESTS, missing_shared

REPO = TESTS.parent
MEASUREMENT_KINDS = ("hand count", "host timers", "untraced A/B")
UNTRACED_AB = TESTS / "profiles" / "tpu_v5e" / "untraced_ab.json"

JUDGING_CODE = ("shared/xdiag/investigators/", "shared/xdiag/analysis/", "shared/xdiag/tools/", "shared/xdiag/cost/")
"""The code that reads a profile into findings: a held-out profile's own commit changes none of it."""

HELD_OUT: tuple[str, ...] = ()
"""Profiles used to judge whether the rules generalise: each committed (with its expected answer) before any change
to the code that judges it. None qualifies yet: see NOT_HELD_OUT."""

NOT_HELD_OUT = {
    "tests/profiles/tpu_v5e/flash_attention_full.xplane.pb": "9b8cc41",
    "tests/profiles/tpu_v5e/lstm_batch64.xplane.pb": "9b8cc41",
    "tests/profiles/tpu_v5e/megablox_small_tiles.xplane.pb": "9b8cc41",
    "tests/profiles/tpu_v5e/int8_weight_decode.xplane.pb": "9b8cc41",
}
"""Profiles test_tpu_v5e's `test_held_out_*` once called held out, and the commit that added each together with
changes to the judging code (analysis/roofline.py, tools/get_roofline_model.py): checks of those programs, not of
generalisation."""


# --- ../shared is here -------------------------------------------------------------------------------------------


def test_the_public_profiles_and_traces_are_beside_the_checkout():
    """Tests parametrized over ../shared's files have no cases without it: this one fails instead."""
    for folder in (SHARED_PROFILES, SHARED_PROFILES.parent / "traces"):
        if not folder.is_dir() or not any(folder.rglob("*.gz" if folder.name == "traces" else "*.xplane.pb")):
            missing_shared(folder)


@pytest.mark.parametrize("env, outcome", [
    ({}, "failed"),
    ({ALLOW_MISSING_SHARED: "1"}, "skipped"),
    ({ALLOW_MISSING_SHARED: "1", "CI": "true"}, "failed"),
    ({ALLOW_MISSING_SHARED: "0"}, "failed"),
])
def test_a_missing_shared_file_fails_unless_a_local_run_says_so(env, outcome, monkeypatch, tmp_path):
    for name in (ALLOW_MISSING_SHARED, "CI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expected = pytest.fail.Exception if outcome == "failed" else pytest.skip.Exception
    with pytest.raises(expected, match="is not here"):
        missing_shared(tmp_path / "profiles")


# --- each expected answer names its measurement -----------------------------------------------------------------


def _expected_answers() -> dict[str, str]:
    """answer -> the measurement recorded beside it."""
    from tests.test_kineto import READINGS

    answers = {}
    for workload in {**WORKLOADS, **ACCELERATOR_WORKLOADS}.values():
        for platform, entry in workload.expected_by_platform.items():
            assert len(entry) == 3, f"{workload.name} on {platform}: (key, why, measured)"
            answers[f"{workload.name} on {platform}: {entry[0]}"] = entry[2]
    for trace, reading in READINGS.items():
        answers[f"{trace}: {reading.top}"] = reading.measured
    return answers


def test_every_expected_answer_names_its_independent_measurement():
    answers = _expected_answers()
    assert len(answers) >= 20
    for answer, measured in answers.items():
        assert measured.startswith(MEASUREMENT_KINDS), (answer, measured)
        assert re.search(r"\d", measured), f"{answer}: a measurement states its figures"


def test_the_untraced_ab_figures_cited_are_the_ones_recorded():
    """Every per-step time an answer cites from untraced_ab.json is a median that file holds for that workload."""
    recorded = json.loads(UNTRACED_AB.read_text())
    cited = 0
    for workload in {**WORKLOADS, **ACCELERATOR_WORKLOADS}.values():
        for platform, (_, _, measured) in workload.expected_by_platform.items():
            if "untraced_ab.json" not in measured:
                continue
            medians = {round(side["per_step_ms_median"], 2) for side in recorded[workload.name].values()}
            ab_part = measured.split("; hand count")[0]
            for figure in re.findall(r"(\d+\.\d\d) ms", ab_part):
                if f"costs {figure} ms" in ab_part:
                    continue  # the difference of two medians, checked below
                assert float(figure) in medians, (workload.name, figure, medians)
                cited += 1
            for cost in re.findall(r"costs (\d+\.\d\d) ms", ab_part):
                a, b = (recorded[workload.name][side]["per_step_ms_median"]
                        for side in ("A_block_every_step", "B_block_after_last_step"))
                assert float(cost) == pytest.approx(a - b, abs=0.011), (workload.name, cost, a, b)
    assert cited >= 6


# --- held-out profiles were committed before the rules that judge them ------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def history():
    try:
        shallow = _git("rev-parse", "--is-shallow-repository").strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"no git history at {REPO} ({exc}): the held-out check reads when each profile was added")
    if shallow == "true":
        pytest.skip("a shallow clone: the commits that added the profiles are not here (fetch with --unshallow)")


def _added_by(path: str) -> tuple[str, list[str]]:
    """The commit that added `path` (the earliest) and the files it changed."""
    commit = _git("log", "--diff-filter=A", "--format=%H", "--", path).split()[-1]
    return commit, _git("show", "--name-only", "--format=", commit).split()


def _claimed_held_out() -> set[str]:
    """The profiles the suite's `test_held_out_*` tests read (by their `analyses["<name>"]`)."""
    claimed = set()
    for module in sorted(TESTS.glob("test_*.py")):
        for body in re.findall(r"^def test_held_out_\w+\(.*?(?=^def |^@|\Z)", module.read_text(), re.S | re.M):
            claimed |= {f"tests/profiles/tpu_v5e/{name}.xplane.pb" for name in re.findall(r'analyses\["(\w+)"\]', body)}
    return claimed


def test_held_out_profiles_were_committed_before_the_rules_that_judge_them(history):
    claimed = _claimed_held_out()
    assert claimed, "no test_held_out_* test found: the list below would check nothing"
    assert claimed <= set(HELD_OUT) | set(NOT_HELD_OUT), sorted(claimed - set(HELD_OUT) - set(NOT_HELD_OUT))
    for profile in HELD_OUT:
        assert (REPO / profile).is_file(), profile
        commit, changed = _added_by(profile)
        judging = [f for f in changed if f.startswith(JUDGING_CODE)]
        assert not judging, f"{profile} was added in {commit[:7]} together with {judging}: it is not held out"
    for profile, fitted in NOT_HELD_OUT.items():
        commit, changed = _added_by(profile)
        assert commit.startswith(fitted) and profile not in HELD_OUT, (profile, commit)
        assert any(f.startswith(JUDGING_CODE) for f in changed), f"{profile}: {fitted} changed no judging code"
