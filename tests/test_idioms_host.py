"""Host-structure idioms (xdiag.idioms.host_structure) on real profiles: small JAX programs captured here on the CPU
with each idiom and with its fix, read by the recognisers and the rule engine as a user's profile would be."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.idiom_capture import capture_programs

LAYER = """
        w = jax.random.normal(jax.random.key(0), (256, 256)) / 16
        x = jnp.ones((64, 256))
        def layer(x, w, lr=0.1):
            return x - lr * jnp.tanh(x @ w) @ w
"""
WEIGHTS = """
        rng = np.random.default_rng(0)
        params = [rng.standard_normal((512, 512), dtype=np.float32) / 22 for _ in range(4)]  # 4 MiB, kept as NumPy
        x = jnp.ones((32, 512))
        @jax.jit
        def forward(params, x):
            for w in params:
                x = jnp.tanh(x @ w)
            return x
"""
GROUPS = """
        x = jax.random.normal(jax.random.key(0), (4096, 64))
        labels = jax.random.permutation(jax.random.key(1), jnp.arange(4096) % 16)
"""
SEGMENTS = """
        pred = jax.random.randint(jax.random.key(0), (64, 64), 0, 8)
        labels = jax.random.randint(jax.random.key(1), (64, 64), 0, 8)
"""
PROGRAMS = {
    # name -> (body defining run(), the idiom it holds or None, the text of the line its report names)
    "jit_per_call": (LAYER + """
        run = lambda: jax.jit(lambda x: layer(x, w))(x)
    """, "recompile_per_shape", "jax.jit(lambda x: layer(x, w))(x)"),  # jax.jit per call: that idiom's, not static
    "jit_once": (LAYER + """
        step = jax.jit(layer)
        run = lambda: step(x, w)
    """, None, None),
    "static_lr": (LAYER + """
        import functools
        update = functools.partial(jax.jit, static_argnums=2)(layer)
        schedule = {"lr": 0.1}
        def run():
            schedule["lr"] *= 0.99
            return update(x, w, schedule["lr"])
    """, "static_argument_per_value", "def run():"),  # a frame is named by the line its function begins on
    "traced_lr": (LAYER + """
        update = jax.jit(layer)
        schedule = {"lr": 0.1}
        def run():
            schedule["lr"] *= 0.99
            return update(x, w, jnp.float32(schedule["lr"]))
    """, None, None),
    "numpy_weights": (WEIGHTS + """
        run = lambda: forward(params, x)
    """, "weights_uploaded_each_step", "run = lambda: forward(params, x)"),
    "device_weights": (WEIGHTS + """
        on_device = jax.device_put(params)
        run = lambda: forward(on_device, x)
    """, None, None),
    "mask_per_group": (GROUPS + """
        def run():
            totals = []
            for c in range(16):
                totals.append(x[labels == c].sum(axis=0))
            return jnp.stack(totals)
    """, "boolean_mask_in_loop", "totals.append(x[labels == c].sum(axis=0))"),
    "segment_sum": (GROUPS + """
        totals = jax.jit(lambda x, labels: jax.ops.segment_sum(x, labels, num_segments=16))
        run = lambda: totals(x, labels)
    """, None, None),
    "counts_per_class": (SEGMENTS + """
        def run():
            inter = np.zeros(8, np.int64)
            for c in range(8):
                p, l = pred == c, labels == c
                inter[c] += int(jnp.sum(p & l))
            return inter
    """, "eager_loop_reads_each_trip", "p, l = pred == c, labels == c"),
    "counts_at_once": (SEGMENTS + """
        classes = jnp.arange(8)
        counts = jax.jit(lambda p, l: jnp.sum((p[..., None] == classes) & (l[..., None] == classes), axis=(0, 1)))
        run = lambda: np.asarray(counts(pred, labels))
    """, None, None),
}
MINE = {"static_argument_per_value", "weights_uploaded_each_step", "boolean_mask_in_loop", "eager_loop_reads_each_trip"}
NEIGHBOURS = {"recompile_per_shape", "python_loop_of_calls", "eager_ops", "callback_in_step", "host_preprocessing",
              "per_element_transfers", "read_each_step"}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _, _) in PROGRAMS.items()},
                            tmp_path_factory.mktemp("host_idioms"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_idiom_is_recognised_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {m.idiom for m in recognise(read_session_in_process([captured[name]]))}
    if expected is None:
        assert not found & (MINE | NEIGHBOURS), found
    else:
        assert expected in found and not found & (MINE | NEIGHBOURS) - {expected}, found


CPU_HIDES_THE_COST = {"weights_uploaded_each_step"}
"""Idioms whose cost a CPU does not show as such (a host array is the CPU device's memory): their finding is in the
report, with its change at the user's line, but need not lead it."""


@pytest.mark.parametrize("name", sorted(n for n, (_, idiom, _) in PROGRAMS.items() if idiom))
def test_the_report_leads_with_the_idioms_change_at_the_users_line(name, captured, tmp_path):
    _, idiom, text = PROGRAMS[name]
    findings = analyze_session(locate_session(captured[name]), tmp_path / name).diagnosis.findings
    top = findings[0] if idiom not in CPU_HIDES_THE_COST else next((f for f in findings if f.key == idiom), None)
    assert top is not None and top.key == idiom, [(f.key, f.fix[:120]) for f in findings]
    script = (captured[name].parents[4] / f"{name}.py").read_text().splitlines()
    line = next(n for n, code in enumerate(script, 1) if text in code)
    assert top.fix.startswith("First, ") and f"{name}.py:{line}" in top.fix and "Expected:" in top.fix, top.fix
    if idiom == "recompile_per_shape":
        assert "jit _lambda once, outside the loop" in top.fix and "static_argnums" not in top.fix[:80], top.fix
    elif idiom == "static_argument_per_value":
        assert "static_argnums" in top.fix and "jnp.float32(lr)" in top.fix, top.fix
    elif idiom == "boolean_mask_in_loop":
        assert "jax.ops.segment_sum(x, labels, num_segments=16)" in top.fix and "a sum of the rows" in top.fix, top.fix
    elif idiom == "eager_loop_reads_each_trip":
        assert "x[..., None] == jnp.arange(8)" in top.fix and "axis=(0, 1)" in top.fix, top.fix
    elif idiom == "weights_uploaded_each_step":
        assert "jax.device_put(params)" in top.fix and "4 weight arrays (4 MiB)" in top.fix, top.fix


SCORES = """
        w = jax.random.normal(jax.random.key(0), (1, 4096))
        x = jax.random.normal(jax.random.key(1), (2048, 1))
        labels = np.arange(2048)
"""
READ_BACK = {
    # name -> (body defining run(), whether each step reads a large result back only to reduce it in NumPy)
    "argmax_on_host": (SCORES + """
        scores = jax.jit(lambda x, w: x * w)
        run = lambda: int(np.sum(jax.device_get(scores(x, w)).argmax(axis=-1) == labels))
    """, True),
    "argmax_on_device": (SCORES + """
        top1 = jax.jit(lambda x, w: jnp.argmax(x * w, axis=-1))
        run = lambda: int(np.sum(jax.device_get(top1(x, w)) == labels))
    """, False),
}


@pytest.fixture(scope="module")
def read_back(tmp_path_factory) -> dict[str, Path]:
    return capture_programs({name: body for name, (body, _) in READ_BACK.items()}, tmp_path_factory.mktemp("read_back"))


@pytest.mark.parametrize("name", sorted(READ_BACK))
def test_a_large_result_read_back_only_for_a_numpy_reduction_is_found_and_a_small_one_is_not(name, read_back):
    """The recogniser itself (the catalogue offers it on accelerators only: a CPU's host is its device)."""
    found = IDIOMS["reduced_on_host"].recognise(Program(read_session_in_process([read_back[name]])))
    if not READ_BACK[name][1]:
        assert found == [], [m.what for m in found]
        return
    [match] = found
    assert match.facts["read_shape"] == "f32[2048,4096]" and match.params["reduction"] == "argmax", match.facts
    assert match.line.startswith("argmax_on_host.py:") and match.module == "jit__lambda"
    change = IDIOMS["reduced_on_host"].change_text(match)
    assert change.startswith("take the argmax on the device: return jnp.argmax(y, axis=-1) from <lambda>"), change
