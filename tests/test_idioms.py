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
    """, "full_sort"),
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
    "host_preprocess": ("""
        images = np.random.default_rng(0).integers(0, 256, (64, 64, 64, 3), dtype=np.uint8)
        w = jax.random.normal(jax.random.key(0), (3, 16))
        @jax.jit
        def train(w, x):
            return w - 0.01 * jax.grad(lambda w: jnp.tanh(x.mean(axis=(1, 2)) @ w).mean())(w)
        def normalise(images):
            x = images.astype(np.float32) / 255.0
            x = (x - 0.45) / 0.22
            return np.ascontiguousarray(x[:, :, ::-1, :])
        run = lambda: train(w, normalise(images))
    """, "host_preprocessing"),
    "list_of_examples": ("""
        examples = [np.full((64,), i, np.int32) for i in range(64)]
        @jax.jit
        def train(tokens):
            return jnp.tanh(tokens.astype(jnp.float32) / 64).sum()
        run = lambda: train(jnp.stack([jnp.asarray(e) for e in examples]))
    """, "per_element_transfers"),
    "stacked_examples": ("""
        examples = [np.full((64,), i, np.int32) for i in range(64)]
        @jax.jit
        def train(tokens):
            return jnp.tanh(tokens.astype(jnp.float32) / 64).sum()
        run = lambda: train(np.stack(examples))
    """, None),
    "value_reads": ("""
        ws = [jax.random.normal(jax.random.key(i), (32, 32)) for i in range(48)]
        @jax.jit
        def norms(ws):
            return [jnp.linalg.norm(w) for w in ws]
        def run():
            return {f"layer{i}": float(v) for i, v in enumerate(norms(ws))}
    """, "per_element_transfers"),
    "loss_read": ("""
        import math
        rng = np.random.default_rng(0)
        state = {"w": jax.random.normal(jax.random.key(0), (768, 768)) / 28}
        x = jax.random.normal(jax.random.key(1), (768, 768))
        @jax.jit
        def train(w, x):
            loss, g = jax.value_and_grad(lambda w: jnp.tanh(jnp.tanh(x @ w) @ w).mean())(w)
            return w - 0.01 * g, loss
        def run():
            order = np.argsort(rng.random(400_000))  # the loader's shuffle, on the host
            state["w"], loss = train(state["w"], x)
            if not math.isfinite(float(loss)):
                raise FloatingPointError(order[0])
            return state["w"]
    """, "read_each_step"),
}
HOST_IDIOMS = {"host_preprocessing", "per_element_transfers", "read_each_step"}
CAPTURE = """
import glob, shutil, sys
import jax, jax.numpy as jnp
import numpy as np
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
        assert not found & ({"structured_matmul", "full_sort", "loop_invariant_weights"} | HOST_IDIOMS), found
    else:
        assert expected in found, found
        if expected in HOST_IDIOMS:
            assert not found & HOST_IDIOMS - {expected}, found


def test_a_one_hot_matmul_is_named_with_its_shapes_and_its_line(captured):
    match = next(m for m in recognise(read_session_in_process([captured["onehot"]])) if m.idiom == "structured_matmul")
    assert match.params["kind"] == "one_hot" and match.params["values"] == 8192 and match.params["rows"] == 1024
    assert "f32[1024,8192]" in match.what and "f32[8192,128]" in match.what
    script = (captured["onehot"].parents[4] / "onehot.py").read_text().splitlines()
    line = next(n for n, text in enumerate(script, 1) if "jax.nn.one_hot(ids, V) @ table" in text)
    assert match.line.endswith(f"onehot.py:{line}"), match.line
    assert match.work_ratio == 8192


def test_a_sort_kept_to_its_top_k_names_k_and_n(captured):
    match = next(m for m in recognise(read_session_in_process([captured["sort"]])) if m.idiom == "full_sort")
    assert (match.params["k"], match.params["n"]) == (8, 16384)


def test_the_report_leads_with_the_idioms_change_and_drops_what_it_explains(captured, tmp_path):
    analysis = analyze_session(locate_session(captured["onehot"]), tmp_path / "onehot")
    top = analysis.diagnosis.findings[0]
    assert top.key == "structured_matmul", [f.key for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, replace the one-hot matmul at ") and "table[ids]" in top.fix
    assert "Expected:" in top.fix
    assert analysis.diagnosis.status.value == "NEEDS_ATTENTION"
    assert any("the work its result needs" in r for r in analysis.health["unhealthy_because"])


@pytest.mark.parametrize("name", ["host_preprocess", "list_of_examples", "value_reads", "loss_read"])
def test_a_host_idioms_report_leads_with_its_change_at_the_users_line(name, captured, tmp_path):
    """How the host's Python feeds or reads the device: the report leads with the idiom's change, at the line of the
    script the Python tracer names."""
    analysis = analyze_session(locate_session(captured[name]), tmp_path / name)
    top = analysis.diagnosis.findings[0]
    assert top.key == PROGRAMS[name][1], [(f.key, f.fix[:120]) for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, ") and "Expected:" in top.fix
    script = (captured[name].parents[4] / f"{name}.py").read_text().splitlines()
    if name == "host_preprocess":
        line = next(n for n, text in enumerate(script, 1) if "def normalise" in text)
        assert f"{name}.py:{line}" in top.fix and "jax.device_put" in top.fix and "float32" in top.fix, top.fix
    elif name == "list_of_examples":
        line = next(n for n, text in enumerate(script, 1) if "jnp.asarray(e)" in text)
        assert f"{name}.py:{line}" in top.fix and "np.stack" in top.fix, top.fix
    elif name == "value_reads":
        line = next(n for n, text in enumerate(script, 1) if "float(v)" in text)
        assert f"{name}.py:{line}" in top.fix and "jax.device_get" in top.fix and "48 reads per step" in top.fix, \
            top.fix
    else:
        line = next(n for n, text in enumerate(script, 1) if "def run" in text)
        assert f"{name}.py:{line}" in top.fix and "every N steps" in top.fix, top.fix
