"""Idioms whose change the TPU v5e measured as slower, no better, or much smaller than their premise said: a report
read on that chip states the measurement instead of predicting the gain, and such a finding ranks after changes that
work; where the recogniser missed the idiom on the chip's HLO, it finds it there. Re-read from the committed captures
(tests/profiles/fix_trials/) and the catalogue itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, Match
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.fix_trial_captures import CAPTURES, unpack_capture

TPU = {"platform": "TPU", "framework": "JAX"}


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """(program, label) -> the committed capture decompressed, once."""
    work = tmp_path_factory.mktemp("chip_refuted")
    return lambda program, label: unpack_capture(program, label, work)


def findings(path: Path, out: Path):
    return analyze_session(locate_session(path), out).diagnosis.findings


def blocked_ms(program: str, label: str) -> float:
    return json.loads((CAPTURES / f"{program}.{label}.steps.json").read_text())["blocked"]["median_ms"]


def test_a_select_xla_fused_into_one_branchs_convolution_is_found_on_the_chip(capture, tmp_path):
    """On a TPU v5e XLA fuses jnp.where's select into the convolution that computes one of its arrays: that fusion is
    the branch's work, so the match stakes both depthwise convolutions, and the report leads with lax.cond, its
    prediction within 1.5x of what the change measured step by step (the ten unblocked steps of the fixed capture
    ran slower, which its blocked, traced and device times contradict: docs/reference/measurements.md)."""
    (match,) = IDIOMS["select_computes_both_branches"].recognise(
        Program(read_session_in_process([capture("where_branches", "before-a")])))
    cheaper, dearer = sorted(match.facts["branch_ms"])
    assert cheaper > 10 and dearer > 10 and 40 < match.stake_percent < 55, match.what
    top = findings(capture("where_branches", "before-a"), tmp_path / "before")[0]
    assert top.key == "select_computes_both_branches", top.fix[:200]
    assert top.fix.startswith("First, compute only the branch the flag picks at ") and "jax.lax.cond(" in top.fix
    low, high = (float(x) for x in top.fix.split("Expected: ", 1)[1].split("% shorter", 1)[0].split("–"))
    realized = 100 * (1 - blocked_ms("where_branches", "fixed") / blocked_ms("where_branches", "before-a"))
    assert 1 / 1.5 <= realized / ((low + high) / 2) <= 1.5, (low, high, realized)
    after = findings(capture("where_branches", "fixed"), tmp_path / "fixed")
    assert after and after[0].key != "select_computes_both_branches"


def test_a_tiny_scan_on_a_tpu_is_not_told_to_unroll(capture, tmp_path):
    """Unrolling the 65,536-trip moving average 128 times made it 58% slower on the chip, and its recurrence is
    linear (read from the loop body): the finding leads with the associative scan, predicted within 1.5x of the
    90.4% the chip measured, states the unroll's measurement, and no finding offers the unroll with a gain."""
    found = findings(capture("tiny_scan", "before-a"), tmp_path / "before")
    top = found[0]
    assert top.key == "scan_tiny_body" and top.fix.startswith("First, evaluate the recurrence at "), top.fix
    assert "jax.lax.associative_scan(combine, (a, b)" in top.fix and "to 0.577 ms" in top.fix  # its timing
    assert "unroll=128 made a 65,536-trip moving average slower" in top.fix
    assert "docs/reference/measurements.md#scan-linear-recurrence" in top.fix
    low, high = (float(x) for x in top.fix.split("Expected: ", 1)[1].split("% shorter", 1)[0].split("–"))
    assert 1 / 1.5 <= (1 - 0.577 / 5.99) * 100 / ((low + high) / 2) <= 1.5, (low, high)
    assert not [f.key for f in found[1:] if "unroll=" in f.fix and "Expected:" in f.fix]


def match(idiom: str, **params) -> Match:
    return Match(idiom, 30.0, "", params=params)


@pytest.mark.parametrize("idiom, params, anchor", [
    ("scan_tiny_body", {"independent": False, "linear": False}, "scan-tiny-body-on-a-tpu"),
    ("unaligned_minor_dims", {}, "unaligned-minor-dims-on-a-tpu"),
    ("weights_tiled_per_example", {"tile_written": False}, "weights-tiled-on-a-tpu"),
])
def test_a_change_the_chip_measured_slower_or_no_better_is_withheld_there(idiom, params, anchor):
    premise = IDIOMS[idiom].withheld(match(idiom, **params), TPU)
    assert premise.startswith("on a TPU v5e ") and f"docs/reference/measurements.md#{anchor}" in premise
    assert "one program measured" in premise
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "measurements.md").read_text()
    assert f'<a id="{anchor}"></a>' in page


@pytest.mark.parametrize("idiom, params, setting", [
    ("scan_tiny_body", {"independent": True}, TPU),  # vectorising independent trips is not what was measured
    ("scan_tiny_body", {"independent": False}, {"platform": "GPU"}),
    ("scan_tiny_body", {"independent": False, "linear": True}, TPU),  # the associative scan, measured faster there
    ("weights_tiled_per_example", {"tile_written": True}, TPU),  # a tile written out is work the change removes
])
def test_only_what_the_chip_measured_is_withheld(idiom, params, setting):
    assert not IDIOMS[idiom].withheld(match(idiom, **params), setting)


@pytest.mark.parametrize("idiom, gain", [("select_computes_both_branches", (0.6, 0.8)),
                                         ("params_stacked_each_step", (0.25, 0.5)),
                                         ("repeated_kv_heads", (0.15, 0.25)),
                                         ("large_constant_in_program", (0.4, 0.6))])
def test_gains_the_chip_measured_smaller_are_set_from_the_measurement(idiom, gain):
    assert IDIOMS[idiom].gain == gain and IDIOMS[idiom].measured.startswith("docs/reference/measurements.md#")


def test_an_idiom_withheld_on_the_chip_ranks_after_a_change_that_works(capture, tmp_path):
    """A TPU capture whose ops are also mostly lane padding: that finding states the measurement that withholds its
    change and comes after the finding whose change is predicted to save time, though no lever fits it either."""
    found = findings(capture("discard_crop_head", "before-a"), tmp_path / "before")
    keys = [f.key for f in found]
    assert keys[0] == "discarded_rows" and "unaligned_minor_dims" in keys, keys
    assert found[keys.index("unaligned_minor_dims")].fix.startswith("Not advised here: on a TPU v5e taking the padding")
