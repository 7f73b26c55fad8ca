"""An LSTM (hidden 1,024) over 512 time steps at batch 64 under ``lax.scan``: the cell's weights re-read from HBM
every step.

Problem: each time step multiplies [64,1024] by the two [1024,4096] bf16 weight matrices (16 MB), which XLA reads
from HBM again on every trip of the loop: ~62 FLOPs per byte, a quarter of the v5e's ridge point, so the loop runs
at the HBM roof and at a few percent of the MXU's. More sequences per batch (up to ~4x) do more work per weight
read in the same time; so would a kernel that keeps the weights in VMEM across time steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6


def _sizes() -> tuple[int, int, int]:
    return pick((64, 8, 128), (512, 64, 1024))  # (time steps, batch, hidden)


@jax.jit
def forward(w, u, xs):
    batch, hidden = xs.shape[1], u.shape[0]

    def cell(carry, x):
        h, c = carry
        i, f, g, o = jnp.split(x @ w + h @ u, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((batch, hidden), jnp.bfloat16)
    _, hs = jax.lax.scan(cell, (zeros, zeros), xs)
    return hs.mean()


def setup():
    steps, batch, hidden = _sizes()
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    w = (jax.random.normal(k1, (hidden, 4 * hidden)) / 32).astype(jnp.bfloat16)
    u = (jax.random.normal(k2, (hidden, 4 * hidden)) / 32).astype(jnp.bfloat16)
    return (w, u, jax.random.normal(k3, (steps, batch, hidden), jnp.bfloat16)), None


def step(state, i):
    arrays, _ = state
    return arrays, forward(*arrays)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
