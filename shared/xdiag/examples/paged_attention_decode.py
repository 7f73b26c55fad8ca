"""Decode-time attention with JAX's Pallas paged-attention kernel over a paged KV cache (grouped-query attention).

Problem (a decode step's nature, not a defect): batch 32, 32 query heads over 8 KV heads, head dim 128, bf16 pages
of 16 tokens, 2,048 tokens per sequence. Each call reads every sequence's K and V pages once
(B·L·2·H_kv·D·2 bytes = 268 MB) and does 4·B·H_q·L·D FLOPs on them (4 FLOPs per byte with 4 query heads per KV
head): the kernel is bound by HBM bandwidth. With 16-token pages and 8 pages per compute block, each of its DMAs
moves 4 KB, and the kernel reaches a small share of the HBM roof: larger pages or more pages per compute block
first; then fewer bytes per token (int8/fp8 KV cache) or more queries per read (speculative decoding).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 10
BATCH, Q_HEADS, KV_HEADS, HEAD_DIM = 32, 32, 8, 128
PAGE, SEQ_LEN, PAGES_PER_BLOCK = 16, 2048, 8
CALLS = 4  # per step, as four layers of one decode step would


def setup():
    require_tpu("paged_attention")
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    pages_per_seq = SEQ_LEN // PAGE
    total_pages = BATCH * pages_per_seq
    keys = jax.random.split(jax.random.key(4), 4)
    k_pages = jax.random.normal(keys[0], (KV_HEADS, total_pages, PAGE, HEAD_DIM), jnp.bfloat16)
    v_pages = jax.random.normal(keys[1], (KV_HEADS, total_pages, PAGE, HEAD_DIM), jnp.bfloat16)
    # Each sequence's pages scattered over the pool, as a serving engine's allocator leaves them.
    page_indices = jax.random.permutation(keys[2], total_pages).reshape(BATCH, pages_per_seq).astype(jnp.int32)
    lengths = jnp.full((BATCH,), SEQ_LEN, jnp.int32)
    q = jax.random.normal(keys[3], (BATCH, Q_HEADS, HEAD_DIM), jnp.bfloat16)

    @jax.jit
    def decode(q, k_pages, v_pages, lengths, page_indices):
        for _ in range(CALLS):
            q = paged_attention(q, k_pages, v_pages, lengths, page_indices,
                                pages_per_compute_block=PAGES_PER_BLOCK).astype(q.dtype)
        return q

    return decode, (q, k_pages, v_pages, lengths, page_indices)


def step(state, i):
    decode, (q, *rest) = state
    return decode, (decode(q, *rest), *rest)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
