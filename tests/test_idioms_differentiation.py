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


def test_a_function_called_twice_in_the_loss_stakes_one_backward_pass_and_names_both_calls(chip):
    """The loss is two helper terms that each call the conv encoder on the same images: XLA merges the forward, but
    the encoder's 19 backward convolutions and matmuls run under both calls; one copy held 25.6% of the step where
    encoding once took 27.2% off it on the chip (3.26 -> 2.38 ms)."""
    (match,) = matches(chip("blind5_vae_faces", "before-a"), "repeated_call_in_gradient")
    assert 23 < match.stake_percent < 28 and match.facts["repeated_matmuls"] == 19
    assert match.params["callee"] == "encode" and match.function == "kl_term"
    assert match.line.endswith("blind5_vae_faces.py:74") and match.params["outer"] == "loss_before"
    text = IDIOMS[match.idiom].change_text(match)
    assert "call encode once" in text and "loss_before (at " in text
    assert not matches(chip("blind5_vae_faces", "fixed"), "repeated_call_in_gradient")


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
ENCODER = """
    k = jax.random.split(jax.random.key(0), 5)
    params = [jax.random.normal(k[i], (512, 512)) / 23 for i in range(3)]
    x, other = jax.random.normal(k[3], (1024, 512)), jax.random.normal(k[4], (1024, 512))

    def encode(params, x):
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return h

    def reconstruction(params, x):
        return jnp.mean((encode(params, x) - x) ** 2)

    def penalty(params, x):
        return jnp.mean(encode(params, x) ** 2)
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
    "encoder_called_twice": (dedent(ENCODER) + dedent("""
        step = jax.jit(jax.grad(lambda p, x: reconstruction(p, x) + 0.5 * penalty(p, x)))
        run = lambda: step(params, x)
    """), True),
    "encoder_called_once": (dedent(ENCODER) + dedent("""
        def loss(p, x):
            h = encode(p, x)
            return jnp.mean((h - x) ** 2) + 0.5 * jnp.mean(h ** 2)
        step = jax.jit(jax.grad(loss))
        run = lambda: step(params, x)
    """), False),
    "encoder_on_two_inputs": (dedent(ENCODER) + dedent("""
        step = jax.jit(jax.grad(lambda p, x, y: reconstruction(p, x) + 0.5 * penalty(p, y)))
        run = lambda: step(params, x, other)
    """), False),
}
KEYS = {"flag_per_leaf": "masked_frozen_gradients", "one_rate_for_all": "masked_frozen_gradients",
        "encoder_called_twice": "repeated_call_in_gradient", "encoder_called_once": "repeated_call_in_gradient",
        "encoder_on_two_inputs": "repeated_call_in_gradient"}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()},
                            tmp_path_factory.mktemp("differentiation"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_found_on_a_cpu_where_the_work_is_not_needed_and_only_there(name, captured):
    key = KEYS.get(name, "full_jacobian_for_products")
    found = matches(captured[name], key)
    assert bool(found) == PROGRAMS[name][1], [m.what for m in found]
    if name == "encoder_called_twice":  # the call whose forward XLA merged into the other's is the repeated one
        assert found[0].params["callee"] == "encode" and found[0].function in ("reconstruction", "penalty")
        # the backward matmuls of 3 products, 2 each but the first's (x is not differentiated)
        assert found[0].facts["repeated_matmuls"] == 5
        assert "reconstruction (at " in found[0].params["calls"] and "penalty (at " in found[0].params["calls"]
    if name == "jacobian_times_vector":
        assert found[0].params["order"] == "jacobian" and found[0].facts["tangents"] == 256
