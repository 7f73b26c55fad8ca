"""f32 matmuls at ``precision=HIGHEST``: the matrix unit emulates full f32 with several bf16 passes.

Problem: an MLP step whose matmuls run in float32 at ``jax.lax.Precision.HIGHEST``. On a TPU's MXU (and on tensor
cores) that is ~3-6 bf16 passes per product, so the step runs several times below the chip's bf16 matmul rate
although every op is a compute-bound ``dot``/``convolution`` fusion.

Fix: bf16 operands with f32 accumulation (``preferred_element_type=jnp.float32``), or the default precision
(``jax.default_matmul_precision('bfloat16')``/``'tensorfloat32'``) where the model tolerates it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 10
HIGHEST = jax.lax.Precision.HIGHEST


def _sizes() -> tuple[int, int, int]:
    return pick((256, 512, 2), (4096, 4096, 3))  # (batch, width, layers)


def _loss(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(jnp.dot(h, w, precision=HIGHEST))
    return jnp.mean(h * h)


@jax.jit
def train_step(ws, x):
    grads = jax.grad(_loss)(ws, x)
    return [w - 1e-3 * g for w, g in zip(ws, grads)]


def setup():
    batch, width, layers = _sizes()
    keys = jax.random.split(jax.random.key(0), layers + 1)
    ws = [jax.random.normal(k, (width, width), jnp.float32) / jnp.sqrt(width) for k in keys[:layers]]
    return ws, jax.random.normal(keys[-1], (batch, width), jnp.float32)


def step(state, i):
    ws, x = state
    return train_step(ws, x), x


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
