"""Grouped-query attention in raw JAX ported from a PyTorch model: the key and value heads are repeated to the
query heads (repeat_kv, here jnp.repeat) before a plain multi-head attention.

As its user wrote it: batch 8, 2,048 positions, 32 query heads sharing 4 key/value heads of width 128, bfloat16, a
prefill step. Each key/value head is copied 8 times (256 MiB of copies a step) and read by the attention matmuls.
Variants:
  fixed   the queries reshaped to (batch, seq, 4, 8, 128) and contracted against the 4 key/value heads directly
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (prefill, grouped-query attention)"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, HEADS, KV_HEADS, WIDTH = size(8, 2), size(2048, 32), size(32, 8), size(4, 2), size(128, 16)
GROUP = HEADS // KV_HEADS


def build(variant):
    kq, kk, kv = jax.random.split(jax.random.key(15), 3)
    q = jax.random.normal(kq, (BATCH, SEQ, HEADS, WIDTH), jnp.bfloat16)
    k, v = (jax.random.normal(key, (BATCH, SEQ, KV_HEADS, WIDTH), jnp.bfloat16) for key in (kk, kv))
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))

    @jax.jit
    def attend(q, k, v):
        if variant == "fixed":  # EDIT
            g = q.reshape(BATCH, SEQ, KV_HEADS, GROUP, WIDTH)  # EDIT
            s = jnp.einsum("bqgrd,bkgd->bgrqk", g, k) / WIDTH ** 0.5  # EDIT
            p = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1).astype(v.dtype)  # EDIT
            return jnp.einsum("bgrqk,bkgd->bqgrd", p, v).reshape(BATCH, SEQ, HEADS, WIDTH)  # EDIT
        k, v = jnp.repeat(k, GROUP, axis=2), jnp.repeat(v, GROUP, axis=2)  # as written: repeat_kv
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / WIDTH ** 0.5
        p = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    def step(carry):
        return attend(q, k, v)

    return step, attend(q, k, v), {"units": BATCH * SEQ, "unit": "tokens"}
