"""Attention scores in raw JAX written as a broadcast product summed over the head dimension, one score matrix per
(batch, head), as a user who thinks in elementwise terms writes q·k for every pair of positions.

As its user wrote it: 64 (batch × heads) of 512 positions and head width 64, float32: (q[:, :, None, :] *
k[:, None, :, :]).sum(-1) forms 1.07 G products on the vector units before the sum. Variants:
  fixed   one batched matmul, jnp.einsum('bqd,bkd->bqk', q, k), on the matrix unit
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (attention scores)"
VARIANTS = ["before", "fixed"]
HEADS, SEQ, WIDTH = size(64, 4), size(512, 32), size(64, 16)


def build(variant):
    kq, kk, kv = jax.random.split(jax.random.key(11), 3)
    q, k, v = (jax.random.normal(key, (HEADS, SEQ, WIDTH), jnp.float32) for key in (kq, kk, kv))

    @jax.jit
    def attend(q, k, v):
        if variant == "fixed":  # EDIT
            scores = jnp.einsum("bqd,bkd->bqk", q, k)  # EDIT
        else:
            scores = (q[:, :, None, :] * k[:, None, :, :]).sum(-1)  # as written
        return jax.nn.softmax(scores / WIDTH ** 0.5, axis=-1) @ v

    def step(carry):
        return attend(q, k, v)

    return step, attend(q, k, v), {"units": HEADS * SEQ, "unit": "query positions"}
