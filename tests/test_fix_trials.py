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

from tests.hlo_subject import hlo_names

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


def test_no_fix_names_an_hlo_instruction(rows):
    """Before and after: a fix describes each op by what it computes at its line, not by XLA's name for it."""
    named = {p: hlo_names(row["fixes"], []) for p, row in rows.items()}
    assert not {p: found for p, found in named.items() if found}


def test_every_trial_has_its_program_and_captures():
    for program, trial in TRIALS.items():
        source = (REPO / "bench" / "fix_trials" / "programs" / f"{program}.py").read_text()
        variants = re.search(r"^VARIANTS = (\[.*\])$", source, re.M)
        assert variants, program
        labels = ["before-a", "before-b"] + [label for label in (trial.get("after"), trial.get("best"),
                                                                  (trial.get("next") or {}).get("after")) if label]
        for label in labels:
            rec = ft.steps(program, label)
            assert rec["program"] == program and rec["variant"] in json.loads(variants.group(1).replace("'", '"'))
            assert len(rec["pipelined"]["per_step_ms"]) == 10 and rec["pipelined"]["mean_ms"] > 0
            assert rec["units"] and rec["device"].startswith("TPU v5")
            assert (ft.CAPTURES / f"{program}.{label}.xplane.pb.xz").stat().st_size > 10_000


@pytest.mark.parametrize("program", [p for p, t in TRIALS.items() if not t.get("not_offered")])
def test_before_report_names_the_lever(rows, program):
    """lstm_linen_train's per-step float(loss) (host_sync) and remat_linen_lm's nn.remat (needless_remat) included:
    neither was named before issue 61's re-read."""
    assert rows[program]["named"], (rows[program]["top_lever"], rows[program]["top_title"])


@pytest.mark.parametrize("program", [p for p, t in TRIALS.items() if t.get("not_offered")])
def test_a_lever_the_trials_contradict_is_not_offered_and_says_why(rows, program):
    """gpt2_train_linen: Pallas flash_attention at head_dim 64 with its default 128 blocks doubled the step (52 ->
    104 ms, the flash capture): the report reads head_dim 64 from the attention's shapes, does not offer the lever,
    and names that measured regression."""
    row = rows[program]
    assert not row["named"], row["lever_fix"]
    assert "head_dim" in row["not_advised"] and "104 ms instead of 52" in row["not_advised"], row["not_advised"]


@pytest.mark.parametrize("program", [p for p in PAIRS if TRIALS[p].get("applies_lever")])
def test_after_report_no_longer_leads_with_it(rows, program):
    trial, row = TRIALS[program], rows[program]
    if trial["lever"]:
        assert row["after_top_lever"] != trial["lever"], row["after_top_title"]
    else:
        assert row["after_top_key"] != trial["finding"], row["after_top_title"]


def _within_1_5(predicted, realized) -> bool:
    low, high = predicted
    return 1 / 1.5 <= realized / ((low + high) / 2) <= 1.5


@pytest.mark.parametrize("program", [p for p in PAIRS if TRIALS[p].get("applies_lever")
                                     and TRIALS[p].get("prediction") != "ceiling"])
def test_a_prediction_is_within_a_factor_of_1_5_of_what_it_realized(rows, program):
    """Where the after capture is the lever's change as written, the middle of its predicted range is within ×1.5 of
    the realized gain (mlp_f32_raw 78.7%, paged_decode_raw 64.7%, lstm_linen_train 14.7%: pre-freeze trials, which
    calibrated the paged and host-fetch ranges, so this holds them, it does not judge them; vit_nnx_train 61.4%,
    moe_serve_raw 55.3%, paged_decode_nnx 66.3%: the held-out trials, two of whose levers were re-read after them)."""
    row = rows[program]
    assert _within_1_5(row["predicted"], row["realized"]), (program, row["predicted"], row["realized"])


@pytest.mark.parametrize("program", [p for p in PAIRS if TRIALS[p].get("prediction") == "ceiling"])
def test_a_throughput_ceiling_holds(rows, program):
    """gru_keras_train: 'too little work per step' predicts how far throughput can grow before the device is the
    limit (~7.7×), not a shorter step: batch 16 -> 128 took 74.6% off the time per sample (3.9× the throughput),
    inside that ceiling and more than a third of it."""
    row = rows[program]
    assert row["named"], row["top_title"]
    ceiling = float(re.search(r"can grow ~(\d+(?:\.\d+)?)×", row["lever_text"]).group(1))
    speedup = 1 / (1 - row["realized"] / 100)
    assert ceiling / 3 <= speedup <= ceiling, (ceiling, speedup)


@pytest.mark.parametrize("program", [p for p in PAIRS if TRIALS[p].get("next")])
def test_the_after_report_leads_the_next_change_and_it_holds(rows, program):
    """The closed loop on the chip: once the first fix is applied, the after report names the next lever, and the
    capture that applies it realizes what that report predicts (within ×1.5 of its middle). moe_serve_raw: after
    the ragged attention's tuned sizes the grouped matmul holds 46.7% of op time at 23.2% of its roof, and
    tiling=(512, 1024, 1024) took 40.1% more; paged_decode_nnx: after pages_per_compute_block=32 the copies of the
    12 KV caches that are not donated hold 47% of op time, and donate_argnums took 45.7% more."""
    row = rows[program]
    assert row["next_named"], (row["after_top_title"], row["next_lever"])
    assert row["after_top_lever"] == row["next_lever"], row["after_top_title"]
    assert _within_1_5(row["next_predicted"], row["next_realized"]), (row["next_predicted"], row["next_realized"])


def test_no_prediction_exceeds_the_step(rows):
    """ragged_serve_raw predicted 76.1-118.4% before every gain was capped at the share of the step the component
    holds."""
    for program, row in rows.items():
        for predicted in (row["predicted"], row["top_predicted"]):
            if predicted:
                assert 0 <= predicted[0] <= predicted[1] <= 100, (program, predicted)


def test_keras_causal_attention_leads_with_the_path_that_reaches_the_kernel(rows):
    """prefill_keras: keras.ops.dot_product_attention(is_causal=True) under jit falls back to XLA attention in
    Keras 3.15.1 (the mask is built with jnp.tril, a Tracer): 2.8x slower (the dpa capture). The lever now passes
    a NumPy mask, says why not is_causal=True, and predicts nothing it has not measured."""
    row = rows["prefill_keras"]
    fix = row["lever_fix"]
    assert "mask=causal_mask" in fix and "np.tril(np.ones(" in fix and "Not is_causal=True" in fix, fix
    assert row["predicted"] is None and "not measured" in fix, fix
    assert "einsum + softmax + einsum" not in fix


def test_attention_is_described_as_the_program_writes_it(rows):
    """remat_linen_lm calls jax.nn.dot_product_attention at its line 28: its ops carry that call's own einsums
    (BTNH,BSNH->BNTS), so the report names the call, not an einsum + softmax + einsum it does not write."""
    row = rows["remat_linen_lm"]
    # The recomputation, whose lever was measured, leads; the attention finding, whose only lever is withheld at
    # head_dim 64, comes after it (issue 71: a finding with no change to make ranks after those with one).
    assert row["top_key"] == "needless_remat", row["top_title"]
    attention = row["texts"]["materialised_attention"]
    assert "written as jax.nn.dot_product_attention" in attention and "head_dim 64" in attention
    assert "einsum + softmax + einsum" not in attention


def test_the_table_holds_what_the_captures_measured(rows):
    """Every trial row of bench/fix_trials.md: before and after ms and the realized gain, from steps.json."""
    table = (REPO / "bench" / "fix_trials.md").read_text()
    for program, row in rows.items():
        lines = [ln for ln in table.splitlines() if ln.startswith(f"| `{program}`")]
        figures = [f"{row['before_ms']:.1f} ms"] + ([f"{row['after_ms']:.1f} ms", f"{row['realized']:+.1f}%"]
                                                    if "realized" in row else [])
        assert any(all(f in ln for f in figures) for ln in lines), (program, figures, lines)
        if "best_realized" in row:
            assert any(f"{row['best_realized']:+.1f}%" in ln for ln in lines), (program, row["best_realized"])
        if "next_realized" in row:
            assert any(f"{row['next_realized']:+.1f}%" in ln for ln in lines), (program, row["next_realized"])


def test_the_paged_fix_names_a_value_the_kernel_accepts(rows):
    """paged_decode_nnx: 'raise pages_per_compute_block' named no value, and the kernel needs one that divides the
    pages per sequence; the report reads them from the kernel's page_indices (s32[4608] over 24 sequences: 192) and
    names 32, the value its trial measured (+66.3%)."""
    fix = rows["paged_decode_nnx"]["lever_fix"]
    assert "raise pages_per_compute_block to 32" in fix and "the 192 pages per sequence" in fix, fix
