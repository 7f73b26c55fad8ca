"""Idioms of what an op really is and of numerics (xdiag.idioms.op_identity, memory_numerics) on JAX programs captured
here on the CPU, each with the idiom and with the change made. Where the idiom costs only on an accelerator the
catalogue offers it there only, and its recogniser is read directly on the CPU capture."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.idioms import IDIOMS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.reader import read_session_in_process

from tests.idiom_capture import capture_programs

PROGRAMS = {
    # name -> (body that defines run(), the idiom it holds or None)
    "highest": ("""
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST))
        run = lambda: layer(x, w)
    """, "precision_highest_matmul"),
    "highest_by_default": ("""
        jax.config.update("jax_default_matmul_precision", "highest")
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(x @ w)
        run = lambda: layer(x, w)
    """, "precision_highest_matmul"),
    "default_precision": ("""
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(jnp.dot(x, w))
        run = lambda: layer(x, w)
    """, None),
    "dropout": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 1024))
        key = jax.random.key(1)
        @jax.jit
        def dropout(x, key):
            keep = jax.random.bernoulli(key, 0.9, x.shape)
            return jnp.where(keep, x / 0.9, 0.0)
        run = lambda: dropout(x, key)
    """, "threefry_random_bits"),
    "dropout_rbg": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 1024))
        key = jax.random.key(1, impl="rbg")
        @jax.jit
        def dropout(x, key):
            keep = jax.random.bernoulli(key, 0.9, x.shape)
            return jnp.where(keep, x / 0.9, 0.0)
        run = lambda: dropout(x, key)
    """, None),
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("ops"))


def matches(path: Path, idiom: str):
    """The idiom's matches in the capture, from its recogniser (whatever the platforms the catalogue offers it on)."""
    return IDIOMS[idiom].recognise(Program(read_session_in_process([path])))


def line_of(path: Path, name: str, text: str) -> str:
    script = (path.parents[4] / f"{name}.py").read_text().splitlines()
    return f"{name}.py:{next(n for n, line in enumerate(script, 1) if text in line)}"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_holds_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {key for key in OURS if matches(captured[name], key)}
    assert found == ({expected} if expected else set()), found


OURS = ("precision_highest_matmul", "threefry_random_bits")


@pytest.mark.parametrize("name", ["highest", "highest_by_default"])
def test_a_float32_matmul_at_highest_precision_names_its_line_and_passes(name, captured):
    (match,) = matches(captured[name], "precision_highest_matmul")
    text = "jnp.dot(x, w, precision=" if name == "highest" else "jnp.tanh(x @ w)"
    assert match.line.endswith(line_of(captured[name], name, text)), match.line
    assert match.facts["example"] == "dot f32[512,512] × f32[512,512]" and match.work_ratio == 6
    assert match.needed_percent == pytest.approx(match.stake_percent / 6) and match.stake_percent > 20
    assert IDIOMS["precision_highest_matmul"].platforms == ("TPU", "GPU")
    assert "precision_highest_matmul" not in {m.idiom for m in recognise(read_session_in_process([captured[name]]))}


def test_threefry_bits_for_a_dropout_mask_name_the_call_and_its_line(captured):
    """A CPU runs JAX's rbg generator no faster than threefry (its RngBitGenerator is expanded into integer ops
    there too): the catalogue offers the change on a TPU or GPU only, and the recogniser is read here directly."""
    (match,) = matches(captured["dropout"], "threefry_random_bits")
    assert match.line.endswith(line_of(captured["dropout"], "dropout", "jax.random.bernoulli(key")), match.line
    assert match.facts["words_per_op"] == 1024 * 1024 and match.facts["random_calls"] == ["bernoulli", "uniform"]
    assert match.stake_percent > 20 and match.params["calls"] == "jax.random.bernoulli, jax.random.uniform"
    change = IDIOMS["threefry_random_bits"].change_text(match)
    assert change.startswith('make the random bits with the rbg generator: jax.config.update("jax_default_prng_impl"')
    assert IDIOMS["threefry_random_bits"].platforms == ("TPU", "GPU")
