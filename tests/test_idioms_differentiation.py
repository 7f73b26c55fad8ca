"""Differentiation that computes more than the result needs: a full Jacobian or Hessian read only by products with
vectors, and frozen leaves' gradients computed and then multiplied by a per-leaf flag. Read from the chip's captures
(tests/profiles/fix_trials/) and from small programs captured on this CPU, where the same facts must hold and where a
program that needs its work (the whole matrix returned, one learning rate shared by every leaf) is left alone."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest
from xdiag.idioms import IDIOMS
from xdiag.idioms.program import Program
from xdiag.profile.reader import read_session_in_process

from tests.fix_trial_captures import unpack_capture
from tests.idiom_capture import capture_programs


def matches(path: Path, key: str):
    return IDIOMS[key].recognise(Program(read_session_in_process([path])))


@pytest.fixture(scope="module")
def chip(tmp_path_factory):
    work = tmp_path_factory.mktemp("chip")
    return lambda program, label: unpack_capture(program, label, work)


def test_a_hessian_read_only_as_a_quadratic_form_is_found_with_its_tangents(chip):
    (match,) = matches(chip("blind3_lj_relax", "before-a"), "full_jacobian_for_products")
    assert match.facts["tangents"] == 768 and match.facts["matrix"] == "f32[768,768]" and match.stake_percent > 95
    assert match.params["order"] == "hessian" and match.line.endswith("blind3_lj_relax.py:51")
    assert "jax.jvp(jax.grad(energy), (x,), (d,))[1]" in IDIOMS[match.idiom].change_text(match)
    assert not matches(chip("blind3_lj_relax", "fixed"), "full_jacobian_for_products")


def test_gradients_multiplied_by_a_flag_per_leaf_stake_the_backward_pass_behind_the_trained_layer(chip):
    """The flags arrive as scalar arguments, one per leaf, each times the learning rate; the head's gradient needs
    none of the backbone's backward ops, which hold about two thirds of the step."""
    (match,) = matches(chip("blind3_linear_probe", "before-a"), "masked_frozen_gradients")
    assert match.facts["trained"] == ["params['head']['w']"]
    assert match.facts["frozen_candidates"] == [f"params['backbone'][{k}]['w']" for k in range(6)]
    assert match.facts["flags"] == [f"trainable['backbone'][{k}]['w']" for k in range(6)]
    assert 60 < match.stake_percent < 70
    text = IDIOMS[match.idiom].change_text(match)
    assert text.startswith("if the flags of") and "jax.lax.stop_gradient(h)" in text
    assert not matches(chip("blind3_linear_probe", "fixed"), "masked_frozen_gradients")


MLP = """
    k = jax.random.split(jax.random.key(0), 4)
    params = {"body": [jax.random.normal(k[i], (256, 256)) / 16 for i in range(3)],
              "head": jax.random.normal(k[3], (256, 10)) / 16}
    x = jax.random.normal(k[0], (512, 256))

    def loss(params, x):
        h = x
        for w in params["body"]:
            h = jnp.tanh(h @ w)
        return jnp.mean((h @ params["head"]) ** 2)
"""
PROGRAMS = {
    "jacobian_times_vector": ("""
        w = jax.random.normal(jax.random.key(0), (256, 256)) / 16
        f = lambda x: jnp.tanh(w @ jnp.tanh(w @ x))
        x, v = jnp.ones(256), jnp.arange(256.0)
        step = jax.jit(lambda x, v: jax.jacfwd(f)(x) @ v)
        run = lambda: step(x, v)
    """, True),
    "hessian_returned": ("""
        w = jax.random.normal(jax.random.key(0), (256, 256)) / 16
        f = lambda x: jnp.sum(jnp.tanh(w @ x) ** 2)
        x = jnp.ones(256)
        step = jax.jit(jax.hessian(f))
        run = lambda: step(x)
    """, False),
    "flag_per_leaf": (dedent(MLP) + dedent("""
        flags = jax.tree.map(lambda _: jnp.float32(0.0), params)
        flags["head"] = jnp.float32(1.0)

        @jax.jit
        def step(params, flags, x):
            grads = jax.grad(loss)(params, x)
            return jax.tree.map(lambda p, g, m: p - 0.1 * m * g, params, grads, flags)
        run = lambda: step(params, flags, x)
    """), True),
    "one_rate_for_all": (dedent(MLP) + dedent("""
        @jax.jit
        def step(params, lr, x):
            grads = jax.grad(loss)(params, x)
            return jax.tree.map(lambda p, g: p - lr * g, params, grads)
        run = lambda: step(params, jnp.float32(0.1), x)
    """), False),
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()},
                            tmp_path_factory.mktemp("differentiation"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_found_on_a_cpu_where_the_work_is_not_needed_and_only_there(name, captured):
    key = "masked_frozen_gradients" if name in ("flag_per_leaf", "one_rate_for_all") else "full_jacobian_for_products"
    found = matches(captured[name], key)
    assert bool(found) == PROGRAMS[name][1], [m.what for m in found]
    if name == "jacobian_times_vector":
        assert found[0].params["order"] == "jacobian" and found[0].facts["tangents"] == 256
