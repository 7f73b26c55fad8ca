"""Batch inference of a tabular-embedding MLP classifier whose weights come from a NumPy checkpoint, in raw JAX.

The checkpoint is a dict of float32 NumPy arrays (as saved by the training job); each step scores one batch of 8,192
feature vectors of width 4,096 through 8 dense layers of 4,096 (GELU) and a 1,000-way head, returning the class
probabilities. Variants:
  fixed   the checkpoint's arrays placed on the device once, when the model is loaded
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (batch scoring)"
VARIANTS = ["before", "fixed"]
BATCH, D, LAYERS, CLASSES = size(8192, 32), size(4096, 64), size(8, 2), size(1000, 10)


def load_checkpoint():
    rng = np.random.default_rng(0)
    layers = [{"w": (rng.standard_normal((D, D), np.float32) / np.sqrt(D)).astype(np.float32),
               "b": np.zeros((D,), np.float32)} for _ in range(LAYERS)]
    head = {"w": (rng.standard_normal((D, CLASSES), np.float32) / np.sqrt(D)).astype(np.float32),
            "b": np.zeros((CLASSES,), np.float32)}
    return {"layers": layers, "head": head}


def build(variant):
    params = load_checkpoint()
    if variant == "fixed":  # EDIT
        params = jax.device_put(params)  # EDIT
    x = jax.random.normal(jax.random.key(1), (BATCH, D), jnp.float32)

    @jax.jit
    def predict(params, x):
        h = x
        for layer in params["layers"]:
            h = jax.nn.gelu(h @ layer["w"] + layer["b"])
        logits = h @ params["head"]["w"] + params["head"]["b"]
        return jax.nn.softmax(logits, axis=-1)

    def step(carry):
        x, _ = carry
        return x, predict(params, x)

    return step, (x, jnp.zeros((BATCH, CLASSES), jnp.float32)), {"units": BATCH, "unit": "samples"}
