"""Co-occurrence counts in raw JAX: a 0/1 incidence matrix of documents × terms, kept as int32, multiplied by its
transpose to count, for each pair of terms, the documents holding both.

As its user wrote it: 4,096 documents × 4,096 terms, int32, counts = a.T @ a (137 G integer multiply-adds on the
vector units). Variants:
  fixed   the product in bfloat16 with float32 accumulation (exact: 0/1 operands, counts below 2**24), cast back
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "analytics (counting)"
VARIANTS = ["before", "fixed"]
DOCS, TERMS = size(4096, 64), size(4096, 64)


def build(variant):
    incidence = jax.random.bernoulli(jax.random.key(13), 0.05, (DOCS, TERMS)).astype(jnp.int32)

    @jax.jit
    def cooccurrence(a):
        if variant == "fixed":  # EDIT
            f = a.astype(jnp.bfloat16)  # EDIT
            return jnp.matmul(f.T, f, preferred_element_type=jnp.float32).astype(jnp.int32)  # EDIT
        return a.T @ a  # as written

    def step(carry):
        return cooccurrence(incidence)

    return step, cooccurrence(incidence), {"units": DOCS, "unit": "documents"}
