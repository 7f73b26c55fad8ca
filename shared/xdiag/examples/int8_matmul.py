"""Quantised inference matmuls: int8 x int8 -> int32 products, requantised to int8 between them.

Healthy: eight dependent [8192,8192]x[8192,8192] int8 products per step (8.8 T integer ops), each accumulated in
int32 and scaled back to int8 for the next. On a TPU v5e the MXU multiplies int8 at twice its bf16 rate (394
against 197 TOP/s): the products run near the int8 peak, which is the roof to rate them against (XLA's cost
model counts an int8 dot at half the operations, and the bf16 peak would put them above 100%).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8
PRODUCTS = 8


def _size() -> int:
    return pick(256, 8192)


@jax.jit
def chained_products(x, w):
    for _ in range(PRODUCTS):
        acc = jax.lax.dot(x, w, preferred_element_type=jnp.int32)
        x = jnp.clip(acc >> 12, -127, 127).astype(jnp.int8)  # a power-of-two requantisation scale
    return x


def setup():
    n = _size()
    kx, kw = jax.random.split(jax.random.key(7))
    x = jax.random.randint(kx, (n, n), -127, 128, jnp.int32).astype(jnp.int8)
    w = jax.random.randint(kw, (n, n), -127, 128, jnp.int32).astype(jnp.int8)
    return x, w


def step(state, i):
    x, w = state
    return chained_products(x, w), w


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
