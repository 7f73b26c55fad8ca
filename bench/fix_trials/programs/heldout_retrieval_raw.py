"""Dense retrieval in raw JAX: a batch of query embeddings scored against an in-memory corpus of passage
embeddings by inner product, returning the 10 best passages (ids and scores) for each query.

As its user wrote it: 256 queries per step, a corpus of 131,072 passages, embeddings of 128 in bf16, scores in
float32. Variants:
  fixed    jax.lax.top_k on the scores
  approx   jax.lax.approx_max_k(scores, 10, recall_target=0.95) (not bit-identical: approximate)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (retrieval)"
VARIANTS = ["before", "fixed", "approx"]
QUERIES, CORPUS, DIM, K = size(256, 8), size(131072, 2048), 128, 10


def build(variant):
    k1, k2 = jax.random.split(jax.random.key(5))
    corpus = jax.random.normal(k1, (CORPUS, DIM), jnp.float32)
    corpus = (corpus / jnp.linalg.norm(corpus, axis=-1, keepdims=True)).astype(jnp.bfloat16)
    queries = jax.random.normal(k2, (QUERIES, DIM), jnp.bfloat16)

    @jax.jit
    def search(queries, corpus):
        scores = jnp.einsum("qd,nd->qn", queries, corpus, preferred_element_type=jnp.float32)
        if variant == "fixed":  # EDIT
            return jax.lax.top_k(scores, K)  # EDIT
        if variant == "approx":  # EDIT
            return jax.lax.approx_max_k(scores, K, recall_target=0.95)  # EDIT
        ids = jnp.argsort(scores, axis=-1)[:, -K:][:, ::-1]
        return jnp.take_along_axis(scores, ids, axis=-1), ids

    def step(carry):
        queries, corpus, _ = carry
        return queries, corpus, search(queries, corpus)

    init = (jnp.zeros((QUERIES, K), jnp.float32), jnp.zeros((QUERIES, K), jnp.int32))
    return step, (queries, corpus, init), {"units": QUERIES, "unit": "queries"}
