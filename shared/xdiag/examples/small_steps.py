"""Low utilisation: a correct jitted step with almost no work in it.

Problem: nothing is wrong with the code - one ``jax.jit`` step, weights
donated, no host syncs beyond the end-of-step wait - but the model is tiny
(a 32-wide two-layer MLP on a batch of 16), so each step does a few
microseconds of device work. Fixed per-step costs (Python call, argument
handling, executable launch, the end-of-step wait) are larger than the work
itself, and the device sits idle most of the time. The fix is more work per
step (bigger batch, several steps per call via ``lax.scan``), not a code fix.

What a profile shows: hundreds of short ``train`` step annotations, each
with one ``PjitFunction(train_step)`` launch on the ``python`` line and one
tiny ``jit_train_step`` execution whose ops (``dot``/small fusions on CPU,
a few tiny kernels on GPU) take microseconds; summed device op time is a
small fraction of the step time, with no single host culprit.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps

DEFAULT_STEPS = 300
BATCH, WIDTH = 16, 32


def _loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - x) ** 2)


@partial(jax.jit, donate_argnums=(0,))
def train_step(params, x):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    return jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads), loss


def setup():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (WIDTH, WIDTH)) * 0.1,
        "w2": jax.random.normal(k2, (WIDTH, WIDTH)) * 0.1,
    }
    x = jax.random.normal(k3, (BATCH, WIDTH))
    return params, x, None


def step(state, i):
    params, x, _ = state
    params, loss = train_step(params, x)
    return params, x, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
