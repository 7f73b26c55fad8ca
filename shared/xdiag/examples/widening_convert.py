"""Widening converts: bf16 data widened to f32 around large reductions.

Problem: the activations are stored in bfloat16, but every statistic the
step computes - per-row and per-column sums, sums of squares, an absolute
max, a log-sum-exp - first does ``x.astype(jnp.float32)`` (the usual
"accumulate in f32" habit applied to the whole tensor instead of inside the
reduction), and the rescaled result is narrowed back to bf16. The converts
and the f32 reductions over the widened copies dominate the step; there is
almost no other work.

What a profile shows: all of the step's device time is in ops whose HLO
is a convert or a reduction over converted data. On CPU: ``wrapped_convert``
(HLO fusion of a single bf16->f32 ``convert`` of the whole tensor, ~50%),
``ynn_fusion.1`` (the row/column/square-sum ``reduce``s over the f32 copy,
fused with the normalisation and the f32->bf16 ``convert`` back, ~35%) and
``ynn_fusion`` (abs-max ``reduce`` over the f32 copy, ~15%). On GPU expect
``*convert*`` loop fusions and ``input_reduce_fusion``-style kernels.

Only one normalisation is done per jit call: with two in one program XLA
(allowed to keep excess precision) removes the f32->bf16->f32 round trip
between them.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 25


def _shape() -> tuple[int, int]:
    # 16M bf16 elements (32 MB) on CPU; 128M (256 MB) on an accelerator.
    return pick((4096, 4096), (16384, 8192))


@partial(jax.jit, donate_argnums=(0,))
def train_step(x):
    # One normalisation per jit call: with two in one program XLA (which may
    # keep excess precision) drops the bf16 round trip between them.
    xf = x.astype(jnp.float32)  # widened copy of the whole tensor
    row_sum = jnp.sum(xf, axis=1, keepdims=True)
    col_sum = jnp.sum(xf, axis=0, keepdims=True)
    sq_sum = jnp.sum(jnp.square(x.astype(jnp.float32)), axis=1, keepdims=True)
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    mean = row_sum / x.shape[1]
    var = sq_sum / x.shape[1] - mean * mean
    y = (xf - mean) * jax.lax.rsqrt(var + 1e-5) + 1e-3 * col_sum / x.shape[0]
    y = y / (amax + 1.0)
    return y.astype(jnp.bfloat16)  # narrowed back for storage


def setup():
    rows, cols = _shape()
    x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32).astype(jnp.bfloat16)
    return x


def step(state, i):
    return train_step(state)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
