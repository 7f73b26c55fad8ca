"""A retrieval step in raw JAX: score a batch of queries against a catalogue of item embeddings and keep the best
k of each, written as a full sort of every row (jnp.argsort, then [:, :k]).

As its user wrote it: 128 queries, 131,072 items of width 256 in bfloat16, k = 32. Sorting orders all 131,072
scores of a row to keep 32. Variants:
  fixed    jax.lax.top_k(scores, k)
  approx   jax.lax.approx_max_k(scores, k) (TPU's approximate top-k, recall 0.95 by default)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference serving (retrieval)"
VARIANTS = ["before", "fixed", "approx"]
QUERIES, ITEMS, WIDTH, K = size(128, 4), size(131072, 2048), size(256, 32), 32


def best_k(scores, variant):
    if variant == "fixed":  # EDIT
        return jax.lax.top_k(scores, K)
    if variant == "approx":  # EDIT
        return jax.lax.approx_max_k(scores, K)
    order = jnp.argsort(-scores, axis=-1)[:, :K]  # as written
    return jnp.take_along_axis(scores, order, axis=-1), order


def build(variant):
    k = jax.random.split(jax.random.key(3), 2)
    items = jax.random.normal(k[0], (ITEMS, WIDTH), jnp.bfloat16)
    queries = jax.random.normal(k[1], (QUERIES, WIDTH), jnp.bfloat16)

    @jax.jit
    def retrieve(queries, items):
        scores = jnp.dot(queries, items.T, preferred_element_type=jnp.float32)
        return best_k(scores, variant)

    def step(carry):
        return retrieve(queries, items)

    return step, retrieve(queries, items), {"units": QUERIES, "unit": "queries"}
