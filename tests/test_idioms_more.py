"""Six idioms of three patterns on real profiles: small JAX programs captured here on the CPU with each idiom
and with its fix, read by the recognisers and the rule engine as a user's profile would be."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import recognise
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.idiom_capture import capture_programs

BATCHED = """
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (32, 128, 256))
        y = jax.random.normal(k2, (32, 256, 128))
"""
TILED = """
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (64, 16, 256))
        w = jax.random.normal(k2, (256, 256)) / 16
"""
COUNTS = """
        k1, k2 = jax.random.split(jax.random.key(0))
        a = jax.random.bernoulli(k1, 0.1, (512, 512)).astype(jnp.int32)
        b = jax.random.bernoulli(k2, 0.1, (512, 512)).astype(jnp.int32)
"""
TABLE = """
        table = jnp.asarray(np.random.default_rng(0).standard_normal((1024, 512), dtype=np.float32))  # 2 MiB
        ids = jnp.arange(64) * 7
"""
ATTENTION = """
        kq, kk, kv = jax.random.split(jax.random.key(0), 3)
        q = jax.random.normal(kq, (4, 256, 8, 64))  # 8 query heads
        k, v = (jax.random.normal(key, (4, 256, 2, 64)) for key in (kk, kv))  # 2 key/value heads
"""
LAYERS = """
        keys = jax.random.split(jax.random.key(0), 8)
        layers = [jax.random.normal(key, (1024, 1024)) / 32 for key in keys]  # 32 MiB
        x = jnp.ones((8, 1024))
        body = lambda h, w: (jnp.tanh(h @ w), None)
"""
PROGRAMS = {
    # name -> (body defining run(), the idiom it holds or None, the text of the line its report names)
    "multiply_sum": (BATCHED + """
        step = jax.jit(lambda x, y: (x[:, :, :, None] * y[:, None, :, :]).sum(2))
        run = lambda: step(x, y)
    """, "contraction_as_multiply_reduce", "(x[:, :, :, None] * y[:, None, :, :]).sum(2)"),
    "einsum": (BATCHED + """
        step = jax.jit(lambda x, y: jnp.einsum('bnk,bkm->bnm', x, y))
        run = lambda: step(x, y)
    """, None, None),
    "tiled_weights": (TILED + """
        step = jax.jit(lambda x, w: jnp.tanh(jnp.matmul(x, jnp.tile(w[None], (x.shape[0], 1, 1)))))
        run = lambda: step(x, w)
    """, "weights_tiled_per_example", "jnp.tile(w[None]"),
    "shared_weights": (TILED + """
        step = jax.jit(lambda x, w: jnp.tanh(x @ w))
        run = lambda: step(x, w)
    """, None, None),
    "integer_counts": (COUNTS + """
        step = jax.jit(lambda a, b: a @ b)
        run = lambda: step(a, b)
    """, "integer_matmul", "a @ b"),
    "float_counts": (COUNTS + """
        step = jax.jit(lambda a, b: (a.astype(jnp.float32) @ b.astype(jnp.float32)).astype(jnp.int32))
        run = lambda: step(a, b)
    """, None, None),
    "closed_over_table": (TABLE + """
        step = jax.jit(lambda ids: jnp.tanh(table[ids]).sum())
        run = lambda: step(ids)
    """, "large_constant_in_program", "jnp.tanh(table[ids])"),
    "table_argument": (TABLE + """
        step = jax.jit(lambda ids, table: jnp.tanh(table[ids]).sum())
        run = lambda: step(ids, table)
    """, None, None),
    "repeated_heads": (ATTENTION + """
        def attend(q, k, v):
            k, v = jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2)
            p = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k), axis=-1)
            return jnp.einsum('bhqk,bkhd->bqhd', p, v)
        step = jax.jit(attend)
        run = lambda: step(q, k, v)
    """, "repeated_kv_heads", "k, v = jnp.repeat(k, 4, axis=2)"),
    "grouped_heads": (ATTENTION + """
        def attend(q, k, v):
            q = q.reshape(4, 256, 2, 4, 64)
            p = jax.nn.softmax(jnp.einsum('bqgrd,bkgd->bgrqk', q, k), axis=-1)
            return jnp.einsum('bgrqk,bkgd->bqgrd', p, v).reshape(4, 256, 8, 64)
        step = jax.jit(attend)
        run = lambda: step(q, k, v)
    """, None, None),
    "stacked_in_step": (LAYERS + """
        step = jax.jit(lambda layers, x: jax.lax.scan(body, x, jnp.stack(layers))[0])
        run = lambda: step(layers, x)
    """, "params_stacked_each_step", "jnp.stack(layers)"),
    "stacked_once": (LAYERS + """
        stacked = jnp.stack(layers)
        step = jax.jit(lambda stacked, x: jax.lax.scan(body, x, stacked)[0])
        run = lambda: step(stacked, x)
    """, None, None),
}
COMPILE_TIME = {"large_constant_in_program"}
"""Idioms whose cost is at compile time, which a capture of steady steps does not hold: no share of its steps to stake,
so no finding in its report; the recogniser still names them (tested above)."""


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _, _) in PROGRAMS.items()},
                            tmp_path_factory.mktemp("more_idioms"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_idiom_is_recognised_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {m.idiom for m in recognise(read_session_in_process([captured[name]]))}
    # no other idiom of the catalogue claims these programs: each is one idiom's, or none's once fixed (layout-only
    # copies aside: an attention einsum moves heads into its scores' order in either form, a fact of its own)
    assert found - {"layout_copies"} == ({expected} if expected else set()), found


@pytest.mark.parametrize("name", sorted(n for n, (_, idiom, _) in PROGRAMS.items()
                                        if idiom and idiom not in COMPILE_TIME))
def test_the_report_leads_with_the_idioms_change_at_the_users_line(name, captured, tmp_path):
    _, idiom, text = PROGRAMS[name]
    findings = analyze_session(locate_session(captured[name]), tmp_path / name).diagnosis.findings
    top = findings[0]
    assert top.key == idiom, [(f.key, f.fix[:120]) for f in findings]
    script = (captured[name].parents[4] / f"{name}.py").read_text().splitlines()
    line = next(n for n, code in enumerate(script, 1) if text in code)
    assert top.fix.startswith("First, ") and f"{name}.py:{line}" in top.fix and "Expected:" in top.fix, top.fix
