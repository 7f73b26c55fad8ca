"""A Pallas matmul kernel with block sizes far too small for the hardware.

Problem: a hand-written Pallas kernel multiplies f32[2048,1024] by f32[1024,2048] in 128x128 output blocks with a
128-wide contraction chunk: 16x16x8 grid steps, each moving its operand tiles from HBM again and doing one small
MXU pass. The kernel is a custom call (``tpu_custom_call``) whose FLOPs come from its operand shapes; it runs far
below the chip's matmul roof. The same product as ``jnp.dot`` (XLA's own tiling) runs several times faster.

Fix: larger blocks (e.g. 512x512 output tiles with the whole contraction per step), bf16 operands, or XLA's dot.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xdiag.examples._common import on_accelerator, pick, run_steps

DEFAULT_STEPS = 10
BLOCK = 128


def _sizes() -> tuple[int, int, int]:
    return pick((256, 256, 256), (2048, 1024, 2048))  # (m, k, n)


def _kernel(x_ref, y_ref, o_ref):
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("interpret",))
def small_block_matmul(x, y, interpret=False):
    from jax.experimental import pallas as pl

    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // BLOCK, n // BLOCK, k // BLOCK),
        in_specs=[
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, kk: (i, j)),
        interpret=interpret,
    )(x, y)


def setup():
    m, k, n = _sizes()
    kx, ky = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, (m, k)), jax.random.normal(ky, (k, n)), None


@functools.partial(jax.jit, static_argnames=("interpret",))
def chained_products(x, y, interpret=False):
    # Eight dependent products in one program, so the step is the kernel's time, not eight dispatches.
    out = x
    for _ in range(8):
        out = small_block_matmul(x, y, interpret=interpret)
        x = out[:, : x.shape[1]] * 1e-3
    return out


def step(state, i):
    x, y, _ = state
    return x, y, chained_products(x, y, interpret=not on_accelerator())


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
