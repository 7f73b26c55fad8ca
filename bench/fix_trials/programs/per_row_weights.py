"""A serving step in raw JAX that runs a batch of requests through a bfloat16 MLP one request at a time with
jax.lax.map, the per-request function written first and mapped afterwards.

As its user wrote it: 256 requests of width 4,096, 4 layers of 4,096 x 4,096 (128 MiB of weights). Each request
is a matrix-vector product per layer, so the weights are read from HBM once per request. Variants:
  fixed   the same function applied to the whole (256, 4,096) batch: one matmul per layer, weights read once
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference serving"
VARIANTS = ["before", "fixed"]
REQUESTS, WIDTH, LAYERS = size(256, 8), size(4096, 64), 4


def mlp(params, x):
    for w, b in params:
        x = jax.nn.relu(x @ w + b)
    return x


def build(variant):
    keys = jax.random.split(jax.random.key(4), LAYERS + 1)
    params = [(jax.random.normal(k, (WIDTH, WIDTH), jnp.bfloat16) / 64, jnp.zeros((WIDTH,), jnp.bfloat16))
              for k in keys[:-1]]
    requests = jax.random.normal(keys[-1], (REQUESTS, WIDTH), jnp.bfloat16)

    @jax.jit
    def serve(params, requests):
        if variant == "fixed":  # EDIT
            return mlp(params, requests)
        return jax.lax.map(lambda r: mlp(params, r), requests)  # as written

    def step(carry):
        return serve(params, requests)

    return step, serve(params, requests), {"units": REQUESTS, "unit": "requests"}
