"""The idiom catalogue (xdiag.idioms) on real profiles: JAX programs captured here on the CPU with each idiom and
without it, read by the recognisers and the rule engine as a user's profile would be."""

from __future__ import annotations

import glob
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, PATTERNS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

PROGRAMS = {
    # name -> (body of step(x), the idiom it holds or None)
    "onehot": ("""
        V, D, N = 8192, 128, 1024
        table = jax.random.normal(jax.random.key(0), (V, D))
        ids = jax.random.randint(jax.random.key(1), (N,), 0, V)
        @jax.jit
        def embed(table, ids):
            return jax.nn.one_hot(ids, V) @ table
        run = lambda: embed(table, ids)
    """, "structured_matmul"),
    "lookup": ("""
        V, D, N = 8192, 128, 1024
        table = jax.random.normal(jax.random.key(0), (V, D))
        ids = jax.random.randint(jax.random.key(1), (N,), 0, V)
        @jax.jit
        def embed(table, ids):
            return table[ids] * 2.0
        run = lambda: embed(table, ids)
    """, None),
    "tril": ("""
        T, D = 1024, 256
        x = jax.random.normal(jax.random.key(0), (T, D))
        @jax.jit
        def running(x):
            return jnp.tril(jnp.ones((T, T))) @ x
        run = lambda: running(x)
    """, "structured_matmul"),
    "sort": ("""
        x = jax.random.normal(jax.random.key(0), (64, 16384))
        @jax.jit
        def best(x):
            return jnp.sort(x, axis=-1)[:, -8:]
        run = lambda: best(x)
    """, None),  # full_sort is no idiom on a CPU, where jax.lax.top_k is a full sort too (read directly below)
    "quantile": ("""
        x = jax.random.normal(jax.random.key(0), (1 << 18,))
        @jax.jit
        def clip_at(x):
            return jnp.percentile(jnp.abs(x), 99.0)
        run = lambda: clip_at(x)
    """, None),
    "top_k": ("""
        x = jax.random.normal(jax.random.key(0), (64, 16384))
        @jax.jit
        def best(x):
            return jax.lax.top_k(x, 8)[0]
        run = lambda: best(x)
    """, None),
    "per_row": ("""
        w = jax.random.normal(jax.random.key(0), (1024, 1024))
        xs = jax.random.normal(jax.random.key(1), (64, 1024))
        @jax.jit
        def serve(w, xs):
            return jax.lax.map(lambda x: jnp.tanh(x @ w), xs)
        run = lambda: serve(w, xs)
    """, "loop_invariant_weights"),
    "loop_of_calls": ("""
        w = jax.random.normal(jax.random.key(0), (256, 256)) / 16
        @jax.jit
        def relax(x):
            y = jnp.tanh(x @ w)
            return y, jnp.abs(y - x).max()
        x0 = jnp.ones((64, 256))
        def run():
            x = x0
            for _ in range(20):
                x, change = relax(x)
                if float(change) < 1e-9:
                    break
            return x
    """, "python_loop_of_calls"),
    "layouts": ("""
        x = jax.random.normal(jax.random.key(0), (8, 16, 256, 64))
        w = jax.random.normal(jax.random.key(1), (64, 64))
        @jax.jit
        def project(x, w):
            y = jnp.tanh(x @ w)
            return y, jnp.swapaxes(y, 1, 2), jnp.transpose(y, (0, 3, 2, 1))
        run = lambda: project(x, w)
    """, "transposed_outputs"),
    "one_transposed_output": ("""
        x = jax.random.normal(jax.random.key(0), (8, 16, 256, 64))
        w = jax.random.normal(jax.random.key(1), (64, 64))
        @jax.jit
        def project(x, w):
            return jnp.swapaxes(jnp.tanh(x @ w), 1, 2)
        run = lambda: project(x, w)
    """, None),
}
CAPTURE = """
import glob, shutil, sys
import jax, jax.numpy as jnp
{body}
for _ in range(2):
    jax.block_until_ready(run())
with jax.profiler.trace(sys.argv[1]):
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(run())
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU, each in a process of its own: name -> its *.xplane.pb (its
    script beside the capture's folder as <name>.py)."""
    out = {}
    root = tmp_path_factory.mktemp("idioms")
    for name, (body, _) in PROGRAMS.items():
        script = root / f"{name}.py"
        script.write_text(CAPTURE.format(body=textwrap.dedent(body)))
        subprocess.run([sys.executable, str(script), str(root / name)], check=True, timeout=300,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
        out[name] = Path(glob.glob(str(root / name / "plugins" / "profile" / "*" / "*.xplane.pb"))[0])
    return out


def test_every_idiom_names_its_pattern_and_a_gain():
    for key, idiom in IDIOMS.items():
        assert idiom.pattern in PATTERNS, key
        assert 0 < idiom.gain[0] <= idiom.gain[1] <= 1.5, key
        assert "{" not in idiom.why, f"{key}: its premise is quoted as it is, not formatted"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_idiom_is_recognised_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {m.idiom for m in recognise(read_session_in_process([captured[name]]))}
    if expected is None:
        assert not found & {"structured_matmul", "full_sort", "loop_invariant_weights", "transposed_outputs"}, found
    else:
        assert expected in found, found


def test_an_array_returned_again_in_other_layouts_names_its_outputs_and_lines(captured):
    [match] = [m for m in recognise(read_session_in_process([captured["layouts"]])) if m.idiom == "transposed_outputs"]
    assert match.params["shapes"] == "f32[8,256,16,64], f32[8,64,256,16]" and match.facts["reordered_outputs"] == 2
    assert "one f32 array of 2,097,152 elements" in match.what and match.function == "project"
    change = IDIOMS["transposed_outputs"].change_text(match)
    assert change.startswith("return the array once from project") and "layouts.py:" in match.params["outputs"]


def test_a_one_hot_matmul_is_named_with_its_shapes_and_its_line(captured):
    match = next(m for m in recognise(read_session_in_process([captured["onehot"]])) if m.idiom == "structured_matmul")
    assert match.params["kind"] == "one_hot" and match.params["values"] == 8192 and match.params["rows"] == 1024
    assert "f32[1024,8192]" in match.what and "f32[8192,128]" in match.what
    script = (captured["onehot"].parents[4] / "onehot.py").read_text().splitlines()
    line = next(n for n, text in enumerate(script, 1) if "jax.nn.one_hot(ids, V) @ table" in text)
    assert match.line.endswith(f"onehot.py:{line}"), match.line
    assert match.work_ratio == 8192


def _full_sort(path: Path) -> list:
    """The full_sort recogniser itself, on a CPU capture (the catalogue offers it on TPUs and GPUs only)."""
    return IDIOMS["full_sort"].recognise(Program(read_session_in_process([path])))


def test_a_sort_kept_to_its_top_k_names_k_and_n(captured):
    [match] = _full_sort(captured["sort"])
    assert (match.params["k"], match.params["n"]) == (8, 16384)
    assert IDIOMS["full_sort"].change_text(match).startswith("keep the top 8 at ")
    assert "full_sort" not in {m.idiom for m in recognise(read_session_in_process([captured["sort"]]))}


def test_a_quantile_is_no_top_k_and_top_k_itself_is_no_full_sort(captured):
    """jnp.percentile sorts all n values and reads one position deep inside: not 'the first k' (a user who took
    jax.lax.top_k(x, 1) for it got the maximum); and top_k, which XLA:CPU runs as a sort, is the change already."""
    [match] = _full_sort(captured["quantile"])
    change = IDIOMS["full_sort"].change_text(match)
    assert change.startswith("compute the percentile at ") and "m = ceil((1 - q)·262144) + 1" in change
    assert "first" not in match.what and match.work_ratio is None
    assert _full_sort(captured["top_k"]) == []


def test_the_report_leads_with_the_idioms_change_and_drops_what_it_explains(captured, tmp_path):
    analysis = analyze_session(locate_session(captured["onehot"]), tmp_path / "onehot")
    top = analysis.diagnosis.findings[0]
    assert top.key == "structured_matmul", [f.key for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, replace the one-hot matmul at ") and "table[ids]" in top.fix
    assert "Expected:" in top.fix
    assert analysis.diagnosis.status.value == "NEEDS_ATTENTION"
    assert any("the work its result needs" in r for r in analysis.health["unhealthy_because"])
