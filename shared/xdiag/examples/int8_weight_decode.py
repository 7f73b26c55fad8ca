"""Batch-1 decoding with int8 weights (weight-only quantisation) converted to bf16 inside the products.

Problem: 32 tokens per call through 8 layers of [2048,8192] and [8192,2048] int8 weights (268 MB per token): the
activations stay bf16 and the weights are widened inside the matrix-vector fusions, so the MXU runs bf16, and XLA
prefetches the int8 weight tiles into VMEM with async copies. Half the bytes of bf16 weights, still read once per
token: the loop runs at the HBM roof, its traffic in the copies; more tokens per weight read is the lever.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6
TOKENS = 32


def _sizes() -> tuple[int, int]:
    return pick((256, 2), (2048, 8))  # (d_model, layers)


@jax.jit
def generate(up, down, x):
    def token(t, x):
        for a, b in zip(up, down):
            h = jax.nn.gelu((x @ a.astype(jnp.bfloat16)) * 0.01)
            x = x + (h @ b.astype(jnp.bfloat16)) * 0.01
        return x

    return jax.lax.fori_loop(0, TOKENS, token, x)


def setup():
    d, layers = _sizes()
    keys = jax.random.split(jax.random.key(3), layers)
    up = [jax.random.randint(k, (d, 4 * d), -127, 128, jnp.int32).astype(jnp.int8) for k in keys]
    down = [jax.random.randint(k, (4 * d, d), -127, 128, jnp.int32).astype(jnp.int8) for k in keys]
    return (up, down, jax.random.normal(jax.random.key(4), (1, d), jnp.bfloat16)), None


def step(state, i):
    (up, down, x), _ = state
    return (up, down, generate(up, down, x)), None


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
