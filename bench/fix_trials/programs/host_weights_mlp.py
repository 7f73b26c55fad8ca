"""Serving an MLP classifier in raw JAX whose weights were loaded from a checkpoint as NumPy arrays and are passed
to the jitted forward as they are: every call copies all of them from the host to the device again before the
program can start, although they never change.

As its user wrote it: a 4-layer float32 MLP of width 2,048 (64 MiB of weights, kept as a list of NumPy arrays),
batches of 256 requests of 2,048 features. Variants:
  fixed   the weights put on the device once before the loop (jax.device_put(params)) and the device arrays passed
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference"
VARIANTS = ["before", "fixed"]
BATCH, WIDTH, LAYERS, CLASSES = size(256, 8), size(2048, 64), 4, 10


@jax.jit
def predict(params, x):
    for w in params[:-1]:
        x = jax.nn.relu(x @ w)
    return jnp.argmax(x @ params[-1], axis=-1)


def build(variant):
    rng = np.random.default_rng(5)
    dims = [WIDTH] * LAYERS + [CLASSES]
    params = [(rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)) for a, b in zip(dims, dims[1:])]
    x = jax.device_put(rng.standard_normal((BATCH, WIDTH), dtype=np.float32))
    if variant == "fixed":  # EDIT
        params = jax.device_put(params)  # EDIT: once, before the loop

    def step(carry):
        return predict(params, x)  # as written: NumPy weights copied to the device on every call

    return step, jnp.zeros((BATCH,), jnp.int32), {"units": BATCH, "unit": "requests"}
