"""Idioms whose trial programs (bench/fix_trials/programs/) are captured here on the CPU, before and after their
change, at sizes between the programs' tiny CPU ones and their TPU ones: the recogniser finds the idiom in the before
capture (its line and its numbers), not in the fixed one, and the report leads with its change where the platform
offers it."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

PROGRAMS = Path(__file__).resolve().parents[1] / "bench" / "fix_trials" / "programs"
SIZES = {  # large enough on a CPU for the idiom's ops to hold their share of the step, small enough to run in seconds
    "x64_features": {"ROWS": 4096, "FEATURES": 256, "HIDDEN": 256},
    "where_branches": {"BATCH": 8, "SIDE": 48},
    "scan_buffer_copy": {"STEPS": 64, "BATCH": 8, "WIDTH": 1024},
    "blind3_tight_binding": {"SITES": 512, "STATES": 128, "SUBSTEPS": 2},
    "blind3_token_blocklist": {"DOCS": 64, "SEQ": 512, "BLOCKED": 1024},
}
CAPTURE = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
import jax
program = importlib.import_module(sys.argv[2])
for name, value in json.loads(sys.argv[5]).items():
    setattr(program, name, value)
step, carry, _ = program.build(sys.argv[3])
for _ in range(2):
    carry = jax.block_until_ready(step(carry))
with jax.profiler.trace(sys.argv[4]):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            carry = jax.block_until_ready(step(carry))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """(program, variant) -> its *.xplane.pb, captured on first use in a process of its own."""
    root, made = tmp_path_factory.mktemp("idiom_programs"), {}
    script = root / "capture.py"
    script.write_text(CAPTURE)

    def capture(program: str, variant: str) -> Path:
        if (program, variant) not in made:
            out = root / f"{program}.{variant}"
            subprocess.run([sys.executable, str(script), str(PROGRAMS), program, variant, str(out),
                            json.dumps(SIZES[program])], check=True, timeout=300,
                           env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
            made[(program, variant)] = Path(glob.glob(str(out / "plugins" / "profile" / "*" / "*.xplane.pb"))[0])
        return made[(program, variant)]
    return capture


def line_of(program: str, text: str) -> str:
    """The program's last line holding the text: the variant as written comes after its fix (`# EDIT`)."""
    source = (PROGRAMS / f"{program}.py").read_text().splitlines()
    return f"{program}.py:{max(n for n, line in enumerate(source, 1) if text in line)}"


def matches(path: Path, idiom: str):
    """The idiom's matches in the capture, from its recogniser (whatever the platform the catalogue offers it on)."""
    return IDIOMS[idiom].recognise(Program(read_session_in_process([path])))


def leads(path: Path, out: Path):
    return analyze_session(locate_session(path), out).diagnosis.findings[0]


def test_float64_ops_are_found_on_a_cpu_but_offered_on_accelerators_only(captured):
    """A CPU runs float64 at about half float32's rate, a cost its users accept for the precision: the recogniser
    finds the ops there (what this test can capture), and the catalogue offers the change on a TPU or GPU only."""
    before = read_session_in_process([captured("x64_features", "before")])
    (match,) = IDIOMS["float64_on_accelerator"].recognise(Program(before))
    assert match.line.endswith(line_of("x64_features", 'logits = (jnp.tanh(x @ params["w1"])')), match.line
    assert match.stake_percent > 50 and match.needed_percent == pytest.approx(match.stake_percent / 2)
    assert match.facts["f64_arguments"] == ["f64[256,256]", "f64[256,1]"] and " f64[" in match.facts["example"]
    assert IDIOMS["float64_on_accelerator"].platforms == ("TPU", "GPU")
    assert "float64_on_accelerator" not in {m.idiom for m in recognise(before)}
    assert not matches(captured("x64_features", "fixed"), "float64_on_accelerator")


def test_a_where_between_two_augmentations_by_one_flag_leads_with_lax_cond(captured, tmp_path):
    (match,) = matches(captured("where_branches", "before"), "select_computes_both_branches")
    assert match.line.endswith(line_of("where_branches", "x = jnp.where(step < WARMUP, blur(images)")), match.line
    cheaper, dearer = sorted(match.facts["branch_ms"])
    assert cheaper > 0 and match.stake_percent > 20 and match.work_ratio == pytest.approx((cheaper + dearer) / dearer,
                                                                                          abs=0.01)
    assert not matches(captured("where_branches", "fixed"), "select_computes_both_branches")
    top = leads(captured("where_branches", "before"), tmp_path / "before")
    assert top.key == "select_computes_both_branches", top.fix[:200]
    assert top.fix.startswith("First, compute only the branch the flag picks at ") and "jax.lax.cond(" in top.fix


def test_a_scan_reading_its_cache_before_writing_it_leads_with_writing_first(captured, tmp_path):
    (match,) = matches(captured("scan_buffer_copy", "before"), "loop_copies_carried_buffer")
    assert match.line.endswith(line_of("scan_buffer_copy", "cache_k, cache_v = cache_k.at[t].set(key)")), match.line
    assert match.facts["trips"] == 64 and set(match.facts["buffers"]) == {"f32[64,8,1024]"}
    assert match.facts["copy_bytes_per_trip"] == match.facts["copies"] * 64 * 8 * 1024 * 4
    assert match.stake_percent > 10
    assert not matches(captured("scan_buffer_copy", "fixed"), "loop_copies_carried_buffer")
    top = leads(captured("scan_buffer_copy", "before"), tmp_path / "before")
    assert top.key == "loop_copies_carried_buffer", top.fix[:200]
    assert top.fix.startswith("First, make the update at ") and "buf.at[i].set(v)" in top.fix


@pytest.mark.parametrize("program", sorted(SIZES))
def test_no_idiom_of_these_programs_holds_in_their_fixed_variant(program, captured):
    found = {m.idiom for m in recognise(read_session_in_process([captured(program, "fixed")]))}
    assert not found & {"float64_on_accelerator", "select_computes_both_branches", "loop_copies_carried_buffer"}


def test_a_complex_matmul_is_named_with_the_real_products_it_costs(captured, tmp_path):
    """XLA:CPU keeps a complex64 dot: 4 real products' work, where a real (or purely imaginary) operand needs 2."""
    (match,) = matches(captured("blind3_tight_binding", "before"), "complex_matmul")
    assert match.line.endswith(line_of("blind3_tight_binding", "return gen @ v")), match.line
    assert match.facts["complex_products"] == 2 * 6 and match.facts["real_products_each"] == 4
    assert "c64[512,512] × c64[512,128], complex64" in match.what and match.work_ratio == 2
    assert not matches(captured("blind3_tight_binding", "fixed"), "complex_matmul")


def test_a_membership_test_of_all_pairs_leads_with_a_table_on_a_cpu(captured, tmp_path):
    """jnp.isin's default method: each of N ids compared with each of K listed values, reduced by any."""
    (match,) = matches(captured("blind3_token_blocklist", "before"), "membership_all_pairs")
    assert match.line.endswith(line_of("blind3_token_blocklist", "flagged = jnp.isin(tokens, blocklist)")), match.line
    assert (match.facts["elements"], match.facts["listed_values"]) == (64 * 512, 1024)
    assert match.what.startswith("jnp.isin compares each of 32,768 elements") and match.stake_percent > 20
    assert not matches(captured("blind3_token_blocklist", "fixed"), "membership_all_pairs")
    top = leads(captured("blind3_token_blocklist", "before"), tmp_path / "before")
    assert top.key == "membership_all_pairs", top.fix[:200]
    assert "jnp.zeros((V,), bool).at[values].set(True)[x]" in top.fix and "one_hot" not in top.fix
