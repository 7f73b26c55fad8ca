"""A batch-scoring step in raw JAX whose model applies a NumPy function to an intermediate through
jax.pure_callback on every call: a signed-log squashing (np.sign(h) * np.log1p(np.abs(h))) kept from the NumPy
prototype.

As its user wrote it: batch 8,192, width 1,024, 4 dense layers in bfloat16 with the squashing after the second,
on a float32 (8,192, 1,024) intermediate (32 MiB). The callback copies it to the host, runs NumPy there and copies
the result back, with the device idle in between. Variants:
  fixed   the same function in jnp inside the step, no callback
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (batch scoring)"
VARIANTS = ["before", "fixed"]
BATCH, WIDTH, LAYERS = size(8192, 16), size(1024, 32), 4


def symlog_np(h):
    return (np.sign(h) * np.log1p(np.abs(h))).astype(np.float32)


def symlog(h, variant):
    if variant == "fixed":  # EDIT
        return jnp.sign(h) * jnp.log1p(jnp.abs(h))
    return jax.pure_callback(symlog_np, jax.ShapeDtypeStruct(h.shape, jnp.float32), h)  # as written


def build(variant):
    keys = jax.random.split(jax.random.key(10), LAYERS + 1)
    ws = [(jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / np.sqrt(WIDTH)).astype(jnp.bfloat16)
          for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (BATCH, WIDTH), jnp.bfloat16)

    @jax.jit
    def score(ws, x):
        h = x
        for i, w in enumerate(ws):
            h = jnp.dot(h, w, preferred_element_type=jnp.float32)
            if i == 1:
                h = symlog(h, variant)
            h = jax.nn.relu(h).astype(jnp.bfloat16)
        return h.astype(jnp.float32).sum(axis=-1)

    def step(carry):
        return score(ws, x)

    return step, score(ws, x), {"units": BATCH, "unit": "samples"}
