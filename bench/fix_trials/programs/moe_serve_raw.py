"""A serving step of a mixture-of-experts decoder (raw JAX, bf16), as a vLLM-style TPU engine runs one: per layer,
ragged paged attention over a mixed batch, then the routed experts with megablox's grouped matmul.

Written after the lever catalogue froze (i61cat a75606d), before any report of it was read. As its user wrote it:
4 layers; 256 sequences decoding one token and 1 prefilling a 512-token chunk, 1,024 cached tokens each; 16 query
heads over 4 KV heads of 128; pages of 32 tokens; num_kv_pages_per_block=2, num_queries_per_block=16; 16 experts,
top-2, width 2,048 (FFN 1,024), gmm with its default tiling. Variants:
  kvpb16        num_kv_pages_per_block=16, num_queries_per_block=32
  tuned         the two block sizes left out (the kernel's tuned table)
  tile512       gmm tiling=(512, 1024, 1024) where it divides (tk = 2048 / 1024)
  tuned_tile512 both
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import ON_CPU, size

FRAMEWORK, PHASE = "jax", "inference serving (mixed prefill + decode)"
VARIANTS = ["before", "kvpb16", "tuned", "tile512", "tuned_tile512"]
LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = size(4, 1), size(16, 4), size(4, 2), 128
# gmm needs the routed rows (2 x tokens) divisible by its row tile: 768 tokens (1,536 rows) divide by 128 and 512.
DECODE, PREFILL, CHUNK, KV_LEN, PAGE = size(256, 2), 1, size(512, 62), size(1024, 128), size(32, 16)
D, FFN, EXPERTS, TOPK = Q_HEADS * HEAD_DIM, size(1024, 128), size(16, 4), 2


def build(variant):
    from jax.experimental.pallas.ops.tpu.megablox import gmm
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    blocks = {"num_kv_pages_per_block": 2, "num_queries_per_block": 16}  # as written
    if variant == "kvpb16":  # EDIT
        blocks = {"num_kv_pages_per_block": 16, "num_queries_per_block": 32}
    if variant.startswith("tuned"):  # EDIT
        blocks = {}
    tiling = (512, 1024, 1024) if variant.endswith("tile512") and not ON_CPU else (128, 128, 128)  # EDIT
    cpu = {"interpret": True} if ON_CPU else {}
    seqs = DECODE + PREFILL
    q_lens = np.array([CHUNK] * PREFILL + [1] * DECODE, np.int32)
    tokens = int(q_lens.sum())
    pages_per_seq = KV_LEN // PAGE
    total = seqs * pages_per_seq
    ks = jax.random.split(jax.random.key(7), 6)
    kv = [jax.random.normal(k, (total, PAGE, 2 * KV_HEADS, HEAD_DIM), jnp.bfloat16)
          for k in jax.random.split(ks[0], LAYERS)]
    page_indices = jax.random.permutation(ks[1], total).reshape(seqs, pages_per_seq).astype(jnp.int32)
    kv_lens = jnp.full((seqs,), KV_LEN, jnp.int32)
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    num_seqs = jnp.array([seqs], jnp.int32)
    wq = jax.random.normal(ks[2], (LAYERS, D, D), jnp.bfloat16) * 0.02
    router = jax.random.normal(ks[3], (LAYERS, D, EXPERTS), jnp.bfloat16) * 0.02
    w_in = jax.random.normal(ks[4], (LAYERS, EXPERTS, D, FFN), jnp.bfloat16) * 0.02
    w_out = jax.random.normal(ks[5], (LAYERS, EXPERTS, FFN, D), jnp.bfloat16) * 0.02
    hidden = jnp.ones((tokens, D), jnp.bfloat16)

    @jax.jit
    def forward(hidden, kv):
        for i in range(LAYERS):
            q = (hidden @ wq[i]).reshape(tokens, Q_HEADS, HEAD_DIM)
            o = ragged_paged_attention(q, kv[i], kv_lens, page_indices, cu_q_lens, num_seqs,
                                       sm_scale=HEAD_DIM ** -0.5, **blocks)
            hidden = hidden + o.reshape(tokens, D).astype(hidden.dtype)
            weights, experts = jax.lax.top_k(jax.nn.softmax((hidden @ router[i]).astype(jnp.float32)), TOPK)
            order = jnp.argsort(experts.reshape(-1))
            rows = hidden[order // TOPK]
            sizes = jnp.bincount(experts.reshape(-1), length=EXPERTS).astype(jnp.int32)
            h = jax.nn.silu(gmm(rows, w_in[i], sizes, preferred_element_type=jnp.bfloat16, tiling=tiling, **cpu))
            y = gmm(h, w_out[i], sizes, preferred_element_type=jnp.bfloat16, tiling=tiling, **cpu)
            y = jnp.zeros_like(y).at[order].set(y).reshape(tokens, TOPK, D)
            hidden = hidden + (y * weights[..., None].astype(y.dtype)).sum(1)
        return hidden

    def step(carry):
        return forward(hidden, kv)

    return step, None, {"units": tokens, "unit": "tokens"}
