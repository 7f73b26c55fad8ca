"""Embedding lookups in raw JAX whose jitted function closes over the embedding table, a global jax.Array, as a
script written top to bottom does: the table is baked into the compiled program as a constant.

As its user wrote it: a (65,536, 256) float32 table (64 MiB), 4,096 ids a step. The cost is at compile time (the
driver's warm time) and in the program's own copy of the table; the steps run alike. Variants:
  fixed   the table passed to the jitted function as an argument
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (embedding lookup)"
VARIANTS = ["before", "fixed"]
ROWS, WIDTH, IDS = size(65536, 512), size(256, 64), size(4096, 64)


def build(variant):
    kt, ki = jax.random.split(jax.random.key(14))
    table = jax.random.normal(kt, (ROWS, WIDTH), jnp.float32)
    ids = jax.random.randint(ki, (IDS,), 0, ROWS)

    if variant == "fixed":  # EDIT
        @jax.jit  # EDIT
        def embed(ids, table):  # EDIT
            return jnp.tanh(table[ids]).sum(0)  # EDIT
        return (lambda carry: embed(ids, table)), embed(ids, table), {"units": IDS, "unit": "ids"}  # EDIT

    @jax.jit
    def embed_closed(ids):
        return jnp.tanh(table[ids]).sum(0)  # as written: table is captured, a constant of the program

    return (lambda carry: embed_closed(ids)), embed_closed(ids), {"units": IDS, "unit": "ids"}
