"""A causal attention training step on JAX's Pallas flash-attention kernel (forward and both backward kernels).

Healthy: batch 2, 16 heads, sequence 4,096, head dim 128, bf16, causal, 512-wide blocks. The step is the kernel
forward (``flash_attention``) and its backward (the dK/dV and dQ kernels) under ``jax.value_and_grad``; the
kernels hold most of the op time. The kernels' products per step are 2·B·H·S²·D·(2 forward + 4 dK/dV + 3 dQ)
halved by the causal mask, 0.62 TFLOP, which the MXU-bound kernels run at about half the chip's bf16 peak. The kernels
carry no cost estimate a profile reader can trust (the forward's counts the full S×S; the backward's none), so the
rates come from the operands and the kernels' semantics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 6
BATCH, HEADS, SEQ, HEAD_DIM = 2, 16, 4096, 128
BLOCK = 512


def setup():
    require_tpu("flash_attention")
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    blocks = fa.BlockSizes(block_q=BLOCK, block_k_major=BLOCK, block_k=BLOCK, block_b=1,
                           block_q_major_dkv=BLOCK, block_k_major_dkv=BLOCK, block_k_dkv=BLOCK, block_q_dkv=BLOCK,
                           block_k_major_dq=BLOCK, block_k_dq=BLOCK, block_q_dq=BLOCK)

    def loss(q, k, v, target):
        out = fa.flash_attention(q, k, v, causal=True, sm_scale=HEAD_DIM**-0.5, block_sizes=blocks)
        return jnp.mean((out.astype(jnp.float32) - target) ** 2)

    @jax.jit
    def train_step(q, k, v, target):
        value, (dq, dk, dv) = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, target)
        return q - 1e-3 * dq, k - 1e-3 * dk, v - 1e-3 * dv, value

    keys = jax.random.split(jax.random.key(3), 4)
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys[:3])
    target = jax.random.normal(keys[3], shape, jnp.float32)
    return train_step, (q, k, v), target


def step(state, i):
    train_step, (q, k, v), target = state
    q, k, v, _ = train_step(q, k, v, target)
    return train_step, (q, k, v), target


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
