"""One token of batched decoding over a paged KV cache with JAX's Pallas paged_attention kernel (raw JAX, bf16).

As its user wrote it: 8 layers, 16 sequences of 2,048 cached tokens, 16 heads of 128, pages of 32 tokens,
pages_per_compute_block=2; each layer writes the new token's K and V into its page pool (.at[].set) and attends.
The jitted step takes the page pools as plain arguments (no donation). Variants:
  ppcb8 / ppcb16 / ppcb32   pages_per_compute_block=8 / 16 / 32
  donate                    jax.jit(..., donate_argnums=(1, 2)): the pools updated in place
  ppcb16_donate             both
"""
import jax
import jax.numpy as jnp

from _size import ON_CPU, size

FRAMEWORK, PHASE = "jax", "inference decode"
VARIANTS = ["before", "ppcb8", "ppcb16", "ppcb32", "donate", "ppcb16_donate"]
LAYERS, BATCH, HEADS, HEAD_DIM = size(8, 2), size(16, 2), size(16, 2), 128
PAGE, CTX = size(32, 16), size(2048, 256)
PPCB = 2


def build(variant):
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    ppcb = {"ppcb8": 8, "ppcb16": 16, "ppcb32": 32, "ppcb16_donate": 16}.get(variant, PPCB)  # EDIT (variants)
    if ON_CPU:
        ppcb = min(ppcb, 4)
    donate = variant in ("donate", "ppcb16_donate")  # EDIT (variants)
    pages_per_seq = CTX // PAGE
    total = BATCH * pages_per_seq
    ks = jax.random.split(jax.random.key(1), 4)
    pool = lambda k: [jax.random.normal(kk, (HEADS, total, PAGE, HEAD_DIM), jnp.bfloat16)
                      for kk in jax.random.split(k, LAYERS)]  # one page pool per layer
    k_pool, v_pool = pool(ks[0]), pool(ks[1])
    page_table = jax.random.permutation(ks[2], total).reshape(BATCH, pages_per_seq).astype(jnp.int32)
    wqkv = jax.random.normal(ks[3], (LAYERS, HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM), jnp.bfloat16) * 0.02
    lengths = jnp.full((BATCH,), CTX - 8, jnp.int32)
    x = jnp.ones((BATCH, HEADS * HEAD_DIM), jnp.bfloat16)

    def decode_step(x, k_pool, v_pool, lengths):
        k_pool, v_pool = list(k_pool), list(v_pool)
        pos = lengths  # the new token's slot
        page = page_table[jnp.arange(BATCH), pos // PAGE]
        slot = pos % PAGE
        for layer in range(LAYERS):
            q, k, v = jnp.split(x @ wqkv[layer], 3, axis=-1)
            q, k, v = (t.reshape(BATCH, HEADS, HEAD_DIM) for t in (q, k, v))
            k_pool[layer] = k_pool[layer].at[:, page, slot].set(k.swapaxes(0, 1))
            v_pool[layer] = v_pool[layer].at[:, page, slot].set(v.swapaxes(0, 1))
            o = paged_attention(q, k_pool[layer], v_pool[layer], lengths + 1, page_table,
                                pages_per_compute_block=ppcb)
            x = x + o.reshape(BATCH, HEADS * HEAD_DIM).astype(x.dtype)
        return x, k_pool, v_pool

    fn = jax.jit(decode_step, donate_argnums=(1, 2) if donate else ())

    def step(carry):
        x, k_pool, v_pool = carry
        return fn(x, k_pool, v_pool, lengths)  # same position each step: the timing, not the text, matters

    return step, (x, k_pool, v_pool), {"units": BATCH, "unit": "tokens"}
