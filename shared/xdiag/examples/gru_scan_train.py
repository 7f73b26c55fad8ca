"""A two-layer GRU trained over 1,024 dependent time steps under ``lax.scan`` (batch 32, hidden 512, bf16).

Problem: each time step is two [32,512]x[512,1536] products and a few elementwise ops per layer, forward and
backward, each waiting on the one before. The weights (6 MB) sit in VMEM for the whole loop, so the fusions read
no HBM to speak of: thousands of microsecond-long dependent iterations run far below the chip's peaks. The time
is per-step latency, neither HBM bandwidth nor arithmetic.

Fix: more sequences per batch (the per-step cost barely grows), fewer and longer steps (chunked or parallel-scan
formulations, a linear recurrence), or a fused recurrent kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6
LAYERS = 2


def _sizes() -> tuple[int, int, int]:
    return pick((4, 64, 64), (32, 512, 1024))  # (batch, hidden, time steps)


def _gru_layer(params, xs):
    w, u, b = params

    def cell(h, x):
        xr, xz, xn = jnp.split(x @ w + b, 3, axis=-1)
        hr, hz, hn = jnp.split(h @ u, 3, axis=-1)
        r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
        h = (1 - z) * jnp.tanh(xn + r * hn) + z * h
        return h, h

    h0 = jnp.zeros((xs.shape[1], u.shape[0]), xs.dtype)
    _, hs = jax.lax.scan(cell, h0, xs)
    return hs


def _loss(params, xs, target):
    for layer in params:
        xs = _gru_layer(layer, xs)
    return jnp.mean((xs[-1].astype(jnp.float32) - target) ** 2)


@jax.jit
def train_step(params, xs, target):
    loss, grads = jax.value_and_grad(_loss)(params, xs, target)
    return [tuple(p - 1e-3 * g for p, g in zip(layer, gl)) for layer, gl in zip(params, grads)], loss


def setup():
    batch, hidden, steps = _sizes()
    keys = iter(jax.random.split(jax.random.key(2), 3 * LAYERS + 2))
    params = [tuple(a.astype(jnp.bfloat16) for a in (
        jax.random.normal(next(keys), (hidden, 3 * hidden)) / hidden**0.5,
        jax.random.normal(next(keys), (hidden, 3 * hidden)) / hidden**0.5,
        jnp.zeros((3 * hidden,)))) for _ in range(LAYERS)]
    xs = jax.random.normal(next(keys), (steps, batch, hidden)).astype(jnp.bfloat16)
    target = jax.random.normal(next(keys), (batch, hidden))
    return params, xs, target


def step(state, i):
    params, xs, target = state
    params, _ = train_step(params, xs, target)
    return params, xs, target


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
