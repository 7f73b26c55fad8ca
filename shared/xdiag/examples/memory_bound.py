"""Memory-bound: elementwise ops and reductions over big arrays, no matmul.

Problem: the jitted step repeatedly normalises a 32 MB f32 activation
(``ROWS x COLS``): a row mean, centring/scaling/clipping elementwise ops, a
column-wise second moment, rescaling, and a residual mix with a second
array. Every op does O(1) flops per element loaded, so the step streams
hundreds of MB through memory per step while doing almost no arithmetic.
The reductions along different axes stop XLA from fusing everything into one
pass, so it runs several full-size passes.

What a profile shows: the XLA threads (or GPU stream) are busy for ~90%+
of the step with a handful of large fusions, each taking milliseconds over
the 8M-element arrays: reduce fusions (on CPU ``ynn_fusion.N`` whose HLO is
reduce + elementwise) and elementwise loop fusions
(``multiply_clamp_fusion``, ``broadcast_multiply_fusion``,
``wrapped_broadcast``; ``loop_*``/``input_reduce_*`` fusions on GPU). There is
no dot/convolution/gemm op at all; every op moves 32-64 MB for ~1-5 flops
per element, i.e. far more bytes per flop than any machine's
bandwidth/compute ratio.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 15
LAYERS = 3


def _shape() -> tuple[int, int]:
    # 8M f32 elements = 32 MB on CPU; 128M = 512 MB on an accelerator.
    return pick((2048, 4096), (16384, 8192))


def _layer(x, skip, gamma):
    mean = jnp.mean(x, axis=1, keepdims=True)  # row reduction
    x = (x - mean) * gamma
    x = jnp.clip(x, -3.0, 3.0)
    second = jnp.mean(x * x, axis=0, keepdims=True)  # column reduction
    x = x * jax.lax.rsqrt(second + 1e-5)
    return 0.9 * x + 0.1 * skip


@partial(jax.jit, donate_argnums=(0,))
def train_step(x, skip, gamma):
    for _ in range(LAYERS):
        x = _layer(x, skip, gamma)
    return x


def setup():
    rows, cols = _shape()
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (rows, cols), jnp.float32)
    skip = jax.random.normal(k2, (rows, cols), jnp.float32)
    gamma = jnp.full((1, cols), 1.01, jnp.float32)
    return x, skip, gamma


def step(state, i):
    x, skip, gamma = state
    return train_step(x, skip, gamma), skip, gamma


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
