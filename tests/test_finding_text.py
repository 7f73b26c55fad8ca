"""Issue 71: what a report tells the user to change names things they can find in their code.

An HLO instruction's name (`fusion.46`, `while.5`, `copy.16`, a parameter's `params__w__.1`) is XLA's, made when the
program compiles: no line of the user's program holds it. Over every committed profile (tests/profiles/**, the chip's
fix-trial captures included), no finding's fix carries one, nor does what an idiom of the catalogue says the program
does there (its `what`): each op is described by what it computes (a matmul of bf16[a,b] × bf16[b,c]) at its line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.errors import ProfileError
from xdiag.profile.locate import locate_session

from tests.fix_trial_captures import CAPTURES, unpack_capture

PROFILES = Path(__file__).resolve().parent / "profiles"
HLO_NAME = re.compile(r"(?<![\w./%-])%?[A-Za-z_][\w-]*\.\d+(?:\.[\w-]+)*(?![\w(])")
"""An HLO instruction's name: an identifier, then a dot and its number (`fusion.46`, `%copy.3`,
`bitcast_dynamic-update-slice_fusion.4`, `params__w__.1`); not a file (`train.py:33`), a call (`jax.lax.scan`) or a
number (`5.49 ms`)."""


def _committed() -> dict[str, Path]:
    found = {}
    for path in sorted(PROFILES.glob("*/*")):
        if path.parent.name == "hostile":
            continue
        if path.is_dir() or path.name.endswith((".xplane.pb", ".trace.json.gz", ".pt.trace.json")):
            found[f"{path.parent.name}/{path.name}"] = path
    for path in sorted(CAPTURES.glob("*.xplane.pb.xz")):
        found[f"{CAPTURES.name}/{path.name}"] = path
    return found


COMMITTED = _committed()


def test_the_hlo_name_check_can_fail():
    named = ("compute it once at a.py:45: fusion.46 (a fusion holding a matmul)", "the loop while.5 runs",
             "the largest is copy.16 f32[32,512]", "ops: bitcast_dynamic-update-slice_fusion.4 (14.71%)",
             "keep the largest argument (params__params____Dense_0____kernel__.1, 64 MiB)", "reads %dot.3")
    assert all(HLO_NAME.search(text) for text in named)
    plain = ("at programs/hoist_invariant.py:45 (build.<locals>.loss): jax.lax.scan / fori_loop, 5.49 ms on a TPU "
             "v5e, 26.7–29.6% shorter steps (docs/reference/measurements.md#loop-invariant-compute); a matmul of "
             "bf16[2048,64] × bf16[64,2048] → bf16[2048,2048]; jnp.float32, x.astype(np.float32); Keras 3.15.1; "
             "params['params']['Dense_0']['kernel'], opt_state[0].nu")
    assert not HLO_NAME.findall(plain)


def _analysis(name: str, path: Path, work: Path):
    if path.name.endswith(".xz"):
        program, label = path.name.split(".")[:2]
        path = unpack_capture(program, label, work)
    return analyze_session(locate_session(path), work / "out")


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_no_fix_and_no_idioms_what_names_an_hlo_instruction(name, tmp_path):
    try:
        analysis = _analysis(name, COMMITTED[name], tmp_path)
    except ProfileError:  # a trace too large to read in its time bound here: test_kineto says so
        pytest.skip("not readable here")
    named = [f"{f.key}: fix: {HLO_NAME.findall(f.fix)}" for f in (analysis.diagnosis.findings if analysis.diagnosis
                                                                   else []) if HLO_NAME.search(f.fix)]
    anatomy = tmp_path / "out" / "tools" / "get_program_anatomy.json"
    idioms = (json.loads(anatomy.read_text()).get("summary") or {}).get("idioms") or [] if anatomy.exists() else []
    named += [f"{m['idiom']}: what: {HLO_NAME.findall(m['what'])}" for m in idioms if HLO_NAME.search(m["what"])]
    assert not named, named
