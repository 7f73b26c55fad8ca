"""A hand-written Pallas RMSNorm kernel with no cost estimate holds the step (a custom call no profile can cost).

Problem (for the reader, not the chip): each step normalises a bf16[16384, 4096] activation with a learned scale in
one Pallas kernel of 512-row blocks, eight times over. The kernel carries no ``CostEstimate`` and its three operands
are not a matrix product's, so neither the profile's cost model nor the shapes give its FLOPs: how close it runs to
the chip's roofs cannot be measured, only the bandwidth its operand and result bytes set as a floor. The reading
asks for a cost estimate (``pallas_call(..., cost_estimate=pl.CostEstimate(...))``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 10
ROWS, WIDTH, BLOCK_ROWS, PASSES = 16384, 4096, 128, 8


def _kernel(x_ref, scale_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    o_ref[...] = (x * inv * scale_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def rmsnorm(x, scale):
    from jax.experimental import pallas as pl

    rows, width = x.shape
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // BLOCK_ROWS,),
        in_specs=[pl.BlockSpec((BLOCK_ROWS, width), lambda i: (i, 0)), pl.BlockSpec((1, width), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((BLOCK_ROWS, width), lambda i: (i, 0)),
    )(x, scale)


@functools.partial(jax.jit, donate_argnums=0)
def normalise(x, scale):
    for _ in range(PASSES):
        x = rmsnorm(x, scale)
    return x


def setup():
    require_tpu("a Pallas TPU kernel")
    kx, ks = jax.random.split(jax.random.key(10))
    return jax.random.normal(kx, (ROWS, WIDTH), jnp.bfloat16), (1 + 0.1 * jax.random.normal(ks, (1, WIDTH))).astype(jnp.bfloat16)


def step(state, i):
    x, scale = state
    return normalise(x, scale), scale


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
