"""An LSTM over 4,096 time steps under ``lax.scan``: dependent, tiny steps (latency-bound, not memory-bound).

Problem: batch 8, hidden 256: each time step is one [8,256]x[256,1024] product and a few elementwise ops, a few
microseconds of work that must wait for the previous step. The device runs ~4,000 tiny dependent iterations per
call at a few percent of its peak; no op moves much memory. The loop (``while``) wraps every op of its body.

Fix: more sequences per batch (the per-step cost barely grows), larger hidden sizes, fewer longer steps (chunked or
parallel-scan formulations), or a fused recurrent kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8


def _sizes() -> tuple[int, int, int]:
    return pick((4, 64, 128), (8, 256, 4096))  # (batch, hidden, time steps)


@jax.jit
def forward(params, xs):
    w, u, b = params

    def cell(carry, x):
        h, c = carry
        gates = x @ w + h @ u + b
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    batch, hidden = xs.shape[1], u.shape[0]
    zeros = jnp.zeros((batch, hidden), xs.dtype)
    (h, _), hs = jax.lax.scan(cell, (zeros, zeros), xs)
    return h, jnp.mean(hs)


def setup():
    batch, hidden, steps = _sizes()
    kw, ku, kx = jax.random.split(jax.random.key(0), 3)
    params = (jax.random.normal(kw, (hidden, 4 * hidden)) / 16, jax.random.normal(ku, (hidden, 4 * hidden)) / 16,
              jnp.zeros((4 * hidden,)))
    return params, jax.random.normal(kx, (steps, batch, hidden)), None


def step(state, i):
    params, xs, _ = state
    return params, xs, forward(params, xs)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
