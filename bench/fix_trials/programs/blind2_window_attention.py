"""Sliding-window causal self-attention over long sequences (the attention core of a local-attention encoder), raw JAX.

Each step takes the projected queries, keys and values of a batch (bf16) and returns the attention output, every
position attending to itself and the 255 positions before it (window 256). As its user wrote it: batch 4 sequences
of 4,096 tokens, 8 heads of 64. Variants:
  fixed   queries processed in blocks of 256 that each score only their own and the previous block of keys
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (attention)"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, HEADS, DH, WINDOW = size(4, 2), size(4096, 64), size(8, 2), 64, size(256, 16)


def blocked_window_attention(q, k, v):  # EDIT
    b, t, h, d = q.shape  # EDIT
    nb = t // WINDOW  # EDIT
    qb = q.reshape(b, nb, WINDOW, h, d)  # EDIT
    kb, vb = (x.reshape(b, nb, WINDOW, h, d) for x in (k, v))  # EDIT
    prev = lambda x: jnp.pad(x, ((0, 0), (1, 0), (0, 0), (0, 0), (0, 0)))[:, :-1]  # EDIT
    kk = jnp.concatenate([prev(kb), kb], axis=2)  # EDIT
    vv = jnp.concatenate([prev(vb), vb], axis=2)  # EDIT
    s = jnp.einsum("bnqhd,bnkhd->bnhqk", qb, kk, preferred_element_type=jnp.float32) / jnp.sqrt(d)  # EDIT
    qpos = jnp.arange(nb)[:, None] * WINDOW + jnp.arange(WINDOW)[None, :]  # EDIT
    kpos = jnp.arange(nb)[:, None] * WINDOW - WINDOW + jnp.arange(2 * WINDOW)[None, :]  # EDIT
    rel = qpos[:, :, None] - kpos[:, None, :]  # EDIT
    mask = (rel >= 0) & (rel < WINDOW) & (kpos[:, None, :] >= 0)  # EDIT
    s = jnp.where(mask[None, :, None], s, -1e9)  # EDIT
    p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)  # EDIT
    return jnp.einsum("bnhqk,bnkhd->bnqhd", p, vv).reshape(b, t, h, d)  # EDIT


def build(variant):
    kq, kk, kv = jax.random.split(jax.random.key(8), 3)
    q, k, v = (jax.random.normal(key, (BATCH, SEQ, HEADS, DH), jnp.bfloat16) for key in (kq, kk, kv))

    @jax.jit
    def window_attention(q, k, v):
        if variant == "fixed":  # EDIT
            return blocked_window_attention(q, k, v)  # EDIT
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(DH)
        i = jnp.arange(SEQ)
        mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < WINDOW)
        s = jnp.where(mask[None, None], s, -1e9)
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    def step(carry):
        q, k, v, _ = carry
        return q, k, v, window_attention(q, k, v)

    return step, (q, k, v, jnp.zeros_like(q)), {"units": BATCH * SEQ, "unit": "tokens"}
