"""A continuous-batching serving step on JAX's Pallas ragged_paged_attention kernel (raw JAX, bf16), as a
vLLM-style engine runs it: decode sequences and prompt chunks mixed in one call per layer.

As its user wrote it: 6 layers; 56 sequences decoding one token and 2 prefilling 256-token chunks, 2,048 cached
tokens each; 32 query heads over 8 KV heads of 128; pages of 16 tokens; num_kv_pages_per_block=4 (and the
num_queries_per_block=32: the kernel takes its tuned table only when both are left out). Variants:
  kvpb16 / kvpb32     num_kv_pages_per_block=16 / 32
  tuned               both block sizes left to the kernel's tuned table (the arguments removed)
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import ON_CPU, size

FRAMEWORK, PHASE = "jax", "inference serving (mixed prefill + decode)"
VARIANTS = ["before", "kvpb16", "kvpb32", "tuned"]
LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = size(6, 1), size(32, 4), size(8, 2), 128
DECODE, PREFILL, CHUNK, KV_LEN, PAGE = size(56, 2), size(2, 1), size(256, 16), size(2048, 128), 16
KVPB = 4


def build(variant):
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    kvpb = {"kvpb16": 16, "kvpb32": 32, "tuned": None}.get(variant, KVPB)  # EDIT (variants)
    if ON_CPU and kvpb:
        kvpb = min(kvpb, 4)
    seqs = DECODE + PREFILL
    q_lens = np.array([CHUNK] * PREFILL + [1] * DECODE, np.int32)
    tokens = int(q_lens.sum())
    pages_per_seq = KV_LEN // PAGE
    total = seqs * pages_per_seq
    ks = jax.random.split(jax.random.key(2), 4)
    kv_caches = [jax.random.normal(k, (total, PAGE, 2 * KV_HEADS, HEAD_DIM), jnp.bfloat16)
                 for k in jax.random.split(ks[0], LAYERS)]
    page_indices = jax.random.permutation(ks[1], total).reshape(seqs, pages_per_seq).astype(jnp.int32)
    kv_lens = jnp.full((seqs,), KV_LEN, jnp.int32)
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    num_seqs = jnp.array([seqs], jnp.int32)
    wq = jax.random.normal(ks[2], (LAYERS, Q_HEADS * HEAD_DIM, Q_HEADS * HEAD_DIM), jnp.bfloat16) * 0.02
    hidden = jax.random.normal(ks[3], (tokens, Q_HEADS * HEAD_DIM), jnp.bfloat16)
    blocks = {} if kvpb is None else {"num_kv_pages_per_block": kvpb, "num_queries_per_block": 32}

    @jax.jit
    def forward(hidden, kv_caches):
        for layer in range(LAYERS):
            q = (hidden @ wq[layer]).reshape(tokens, Q_HEADS, HEAD_DIM)
            o = ragged_paged_attention(q, kv_caches[layer], kv_lens, page_indices, cu_q_lens, num_seqs,
                                       sm_scale=HEAD_DIM ** -0.5, **blocks)
            hidden = hidden + o.reshape(tokens, -1).astype(hidden.dtype)
        return hidden

    def step(carry):
        return forward(hidden, kv_caches)

    return step, None, {"units": tokens, "unit": "tokens"}
