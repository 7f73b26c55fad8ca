"""Batched greedy decoding with a Flax NNX decoder whose attention reads a paged KV cache through JAX's Pallas
paged_attention kernel (bf16); the cache lives outside the model and is passed through nnx.jit each step.

Written after the lever catalogue froze (i61cat a75606d), before any report of it was read. As its user wrote it:
6 layers, 24 sequences of 3,072 cached tokens, 8 query heads over 8 KV heads of 128, pages of 16 tokens,
pages_per_compute_block=4; the new token's K and V are written with .at[].set and the caches are not donated.
Variants:
  ppcb32          pages_per_compute_block=32
  donate          nnx.jit(..., donate_argnums=(2, 3)): the caches updated in place
  ppcb32_donate   both
"""
import jax
import jax.numpy as jnp
from flax import nnx

from _size import ON_CPU, size

FRAMEWORK, PHASE = "flax.nnx", "inference decode"
VARIANTS = ["before", "ppcb32", "donate", "ppcb32_donate"]
LAYERS, BATCH, HEADS, HEAD_DIM, PAGE, CTX = size(6, 1), size(24, 2), size(8, 2), 128, 16, size(3072, 256)
WIDTH = HEADS * HEAD_DIM


class Decoder(nnx.Module):
    def __init__(self, ppcb, rngs):
        self.qkv = nnx.List([nnx.Linear(WIDTH, 3 * WIDTH, use_bias=False, param_dtype=jnp.bfloat16, rngs=rngs)
                             for _ in range(LAYERS)])
        self.out = nnx.List([nnx.Linear(WIDTH, WIDTH, use_bias=False, param_dtype=jnp.bfloat16, rngs=rngs)
                             for _ in range(LAYERS)])
        self.ppcb = ppcb

    def __call__(self, x, k_cache, v_cache, lengths, page_table):
        from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
        page = page_table[jnp.arange(BATCH), lengths // PAGE]
        slot = lengths % PAGE
        k_cache, v_cache = list(k_cache), list(v_cache)
        for i in range(LAYERS):
            q, k, v = (t.reshape(BATCH, HEADS, HEAD_DIM) for t in jnp.split(self.qkv[i](x), 3, axis=-1))
            k_cache[i] = k_cache[i].at[:, page, slot].set(k.swapaxes(0, 1))
            v_cache[i] = v_cache[i].at[:, page, slot].set(v.swapaxes(0, 1))
            o = paged_attention(q, k_cache[i], v_cache[i], lengths + 1, page_table, pages_per_compute_block=self.ppcb)
            x = x + self.out[i](o.reshape(BATCH, WIDTH).astype(x.dtype))
        return x, k_cache, v_cache


def build(variant):
    ppcb = 32 if "ppcb32" in variant else 4  # EDIT (ppcb32 variants)
    if ON_CPU:
        ppcb = min(ppcb, 4)
    model = Decoder(ppcb, nnx.Rngs(0))
    pages_per_seq = CTX // PAGE
    total = BATCH * pages_per_seq
    ks = jax.random.split(jax.random.key(9), 3)
    cache = lambda k: [jax.random.normal(kk, (HEADS, total, PAGE, HEAD_DIM), jnp.bfloat16)
                       for kk in jax.random.split(k, LAYERS)]
    k_cache, v_cache = cache(ks[0]), cache(ks[1])
    page_table = jax.random.permutation(ks[2], total).reshape(BATCH, pages_per_seq).astype(jnp.int32)
    lengths = jnp.full((BATCH,), CTX - 16, jnp.int32)
    x = jnp.ones((BATCH, WIDTH), jnp.bfloat16)
    donate = (2, 3) if "donate" in variant else ()  # EDIT (donate variants)

    @nnx.jit(donate_argnums=donate)
    def decode(model, x, k_cache, v_cache):
        return model(x, k_cache, v_cache, lengths, page_table)

    def step(carry):
        return decode(model, *carry)

    return step, (x, k_cache, v_cache), {"units": BATCH, "unit": "tokens"}
