"""A model server in raw JAX whose loop calls the jitted model once per request (batch 1) and reads each response
back before the next, as a first request handler is often written.

As its user wrote it: 64 pending requests per step, each a 2,048-wide feature vector, through a bfloat16 MLP of 8
layers (2,048 -> 8,192 -> 2,048, 268 MB of weights); every call reads all the weights for one row. Variants:
  fixed   the pending requests stacked into one (64, 2,048) batch, one call, one read of the results
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference serving"
VARIANTS = ["before", "fixed"]
PENDING, WIDTH, HIDDEN, LAYERS = size(64, 4), size(2048, 32), size(8192, 128), size(8, 2)


def build(variant):
    ks = jax.random.split(jax.random.key(14), 2 * LAYERS)
    params = [((jax.random.normal(ks[2 * i], (WIDTH, HIDDEN), jnp.float32) / WIDTH ** 0.5).astype(jnp.bfloat16),
               (jax.random.normal(ks[2 * i + 1], (HIDDEN, WIDTH), jnp.float32) / HIDDEN ** 0.5).astype(jnp.bfloat16))
              for i in range(LAYERS)]
    rng = np.random.default_rng(1)
    queue = [rng.standard_normal((PENDING, WIDTH)).astype(np.float32) for _ in range(4)]

    @jax.jit
    def model(params, x):
        h = x.astype(jnp.bfloat16)
        for up, down in params:
            h = h + jax.nn.relu(h @ up) @ down
        return h.astype(jnp.float32).mean(axis=-1)

    def step(carry):
        i, _ = carry
        requests = queue[i % len(queue)]
        if variant == "fixed":  # EDIT
            responses = np.asarray(model(params, requests))
        else:
            responses = np.array([np.asarray(model(params, r[None]))[0] for r in requests])  # as written
        return i + 1, responses

    return step, (0, np.zeros(PENDING, np.float32)), {"units": PENDING, "unit": "requests"}
