"""Widened statistics: bf16 data widened once to f32, then read back by several dependent reduction passes.

Problem: the activations are stored in bfloat16, but the step first writes an f32 copy of the whole tensor
(``xf = x.astype(jnp.float32)``) and then computes its statistics from that copy: a row mean, the centred second,
third and fourth moments (each needs the mean first), a normalised absolute maximum (needs the variance), the share
of each row's tail beyond half that maximum (needs the maximum) and a trimmed variance (needs the tail). Every pass
reads the widened f32 copy, twice the bytes of the bf16 data it came from, and the convert itself writes it: the
widening doubles the bytes of every memory-bound pass. Reducing the bf16 array with an f32 accumulator
(``jnp.mean(x, axis=1, dtype=jnp.float32)``) lets XLA widen inside each reduction, in registers.

What a profile shows: on CPU the widening convert (``wrapped_convert``, 25-40% of op time: XLA:CPU converts
bf16 slowly, and its time varies most from run to run) and the passes over its f32 result (``ynn_fusion.N`` and
the fusions around them, 1/8 to 5/8 FLOP per byte), which take 60-75% of op time: memory-bound ops that read what
the convert wrote. The tail and trimmed passes keep that share clear of the 50% at which memory-bound work becomes
a finding, whatever the convert's time.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 15


def _shape() -> tuple[int, int]:
    # 16M bf16 elements (32 MB) on CPU; 128M (256 MB) on an accelerator.
    return pick((4096, 4096), (16384, 8192))


@partial(jax.jit, donate_argnums=(0,))
def train_step(x):
    xf = x.astype(jnp.float32)  # the widened copy every pass below reads
    mean = jnp.mean(xf, axis=1, keepdims=True)
    centred = xf - mean
    var = jnp.mean(centred * centred, axis=1, keepdims=True)
    skew = jnp.mean(centred ** 3, axis=1, keepdims=True) / (var * jnp.sqrt(var) + 1e-6)
    kurtosis = jnp.mean(centred ** 4, axis=1, keepdims=True) / (var * var + 1e-6)
    z = jnp.abs(centred) * jax.lax.rsqrt(var + 1e-5)
    amax = jnp.max(z)
    tail = jnp.mean((z > 0.5 * amax).astype(jnp.float32), axis=1, keepdims=True)  # needs the maximum
    cut = jnp.maximum(jnp.max(tail), 0.25) * amax
    trimmed = jnp.mean(jnp.where(z <= cut, centred * centred, 0.0), axis=1, keepdims=True)  # needs the tail
    scale = 1.0 + 1e-3 * (kurtosis - 3.0 + skew + tail - trimmed / (var + 1e-6)) / (amax + 1.0)
    return (x * scale.astype(jnp.bfloat16)).astype(jnp.bfloat16)


def setup():
    rows, cols = _shape()
    return jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32).astype(jnp.bfloat16)


def step(state, i):
    return train_step(state)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
