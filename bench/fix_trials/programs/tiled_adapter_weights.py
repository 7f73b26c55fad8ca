"""A per-example linear layer in raw JAX: the shared projection is tiled to the batch (jnp.tile) so that a batched
matmul can take it next to per-example inputs, as code written for per-example weights and then given one weight
matrix keeps doing.

As its user wrote it: 128 examples of 64 tokens, width 1,024, bfloat16; the (1,024, 1,024) weights (2 MiB) tiled
to (128, 1,024, 1,024) (256 MiB) every step. Variants:
  fixed   x @ w: one matmul over the unbatched weights, read once
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (a linear layer per example)"
VARIANTS = ["before", "fixed"]
BATCH, TOKENS, WIDTH = size(128, 4), size(64, 8), size(1024, 64)


def build(variant):
    kx, kw = jax.random.split(jax.random.key(12))
    x = jax.random.normal(kx, (BATCH, TOKENS, WIDTH), jnp.bfloat16)
    w = jax.random.normal(kw, (WIDTH, WIDTH), jnp.bfloat16) / 32

    @jax.jit
    def layer(x, w):
        if variant == "fixed":  # EDIT
            return jax.nn.gelu(x @ w)  # EDIT
        tiled = jnp.tile(w[None], (x.shape[0], 1, 1))  # as written: one copy of the weights per example
        return jax.nn.gelu(jnp.matmul(x, tiled))

    def step(carry):
        return layer(x, w)

    return step, layer(x, w), {"units": BATCH * TOKENS, "unit": "tokens"}
