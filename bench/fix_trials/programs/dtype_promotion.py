"""A bfloat16 decode-style MLP stack served in raw JAX whose weights stayed float32 as loaded from the checkpoint:
the activations are cast to bfloat16, but bf16 x f32 promotes, so every matmul reads float32 weights and runs and
writes in float32.

As its user wrote it: 8 residual blocks of width 4,096 and hidden 16,384 (1.07 G parameters, 4.3 GB in float32),
a batch of 32 token vectors per step; memory-bound on the weights. Variants:
  fixed   the weights cast to bfloat16 once, when loaded (2.1 GB read per step)
  pet     the weights cast once and each dot asked for float32 accumulation (preferred_element_type=jnp.float32)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (decode)"
VARIANTS = ["before", "fixed", "pet"]
RTOL = 5e-2  # bfloat16 weights round what float32 weights kept
BLOCKS, WIDTH, HIDDEN, BATCH = size(8, 2), size(4096, 64), size(16384, 256), size(32, 4)


def load_params(key):
    ks = jax.random.split(key, 2 * BLOCKS)
    return [(jax.random.normal(ks[2 * i], (WIDTH, HIDDEN), jnp.float32) / WIDTH ** 0.5,
             jax.random.normal(ks[2 * i + 1], (HIDDEN, WIDTH), jnp.float32) / HIDDEN ** 0.5) for i in range(BLOCKS)]


def build(variant):
    params = load_params(jax.random.key(12))
    if variant in ("fixed", "pet"):  # EDIT
        params = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
    x0 = jax.random.normal(jax.random.key(13), (BATCH, WIDTH), jnp.float32)

    def dot(a, w):
        if variant == "pet":  # EDIT
            return jnp.dot(a, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        return a @ w  # as written

    @jax.jit
    def decode_step(params, x):
        h = x.astype(jnp.bfloat16)
        for up, down in params:
            h = h + dot(jax.nn.gelu(dot(h, up)), down)
        return (x + 0.01 * h).astype(jnp.float32)

    def step(carry):
        return decode_step(params, carry)

    return step, x0, {"units": BATCH, "unit": "tokens"}
