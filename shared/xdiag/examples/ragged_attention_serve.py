"""A serving batch on JAX's Pallas ragged paged-attention kernel: prefill and decode sequences mixed in one call.

Problem (the nature of serving attention): 64 sequences of 1,024 cached tokens each, 60 decoding one token and 4
prefilling 256, 16 query heads over 4 KV heads, head dim 128, bf16 pages of 32 tokens. The call reads each
sequence's K and V pages (64·1,024·2·4·128·2 bytes = 134 MB) and does 4·H_q·D FLOPs per (query, key) pair it
scores; the decode sequences, most of the batch, are bound by HBM bandwidth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 10
SEQS, KV_LEN, PREFILL_SEQS, PREFILL_LEN = 64, 1024, 4, 256
Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 4, 128, 32
CALLS = 4  # per step, as four layers of one serving step would


def setup():
    require_tpu("ragged_paged_attention")
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    q_lens = np.array([PREFILL_LEN] * PREFILL_SEQS + [1] * (SEQS - PREFILL_SEQS), np.int32)
    tokens = int(q_lens.sum())
    pages_per_seq = KV_LEN // PAGE
    total_pages = SEQS * pages_per_seq
    keys = jax.random.split(jax.random.key(5), 3)
    kv_pages = jax.random.normal(keys[0], (total_pages, PAGE, 2 * KV_HEADS, HEAD_DIM), jnp.bfloat16)
    page_indices = jax.random.permutation(keys[1], total_pages).reshape(SEQS, pages_per_seq).astype(jnp.int32)
    kv_lens = jnp.full((SEQS,), KV_LEN, jnp.int32)
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), jnp.int32)
    num_seqs = jnp.array([SEQS], jnp.int32)
    q = jax.random.normal(keys[2], (tokens, Q_HEADS, HEAD_DIM), jnp.bfloat16)

    @jax.jit
    def serve(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        for _ in range(CALLS):
            q = ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                                       sm_scale=HEAD_DIM**-0.5).astype(q.dtype)
        return q

    return serve, (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)


def step(state, i):
    serve, (q, *rest) = state
    return serve, (serve(q, *rest), *rest)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
