"""Training a deep MLP in raw JAX whose layers are kept as a list of separate arrays (as they were initialised) and
stacked inside the jitted step so that jax.lax.scan can run them, as code moved from a Python loop over layers to a
scan often does.

As its user wrote it: 32 layers of 2,048 x 2,048, float32 (512 MiB of weights), batch 256, one SGD step per call.
Each step copies every layer into the stacked array, and the gradient comes back stacked and is split apart again.
Variants:
  fixed   the layers stacked once before training, kept and updated stacked
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (scan over layers)"
VARIANTS = ["before", "fixed"]
LAYERS, WIDTH, BATCH = size(32, 4), size(2048, 64), size(256, 8)
LR = 1e-3


def build(variant):
    keys = jax.random.split(jax.random.key(16), LAYERS + 2)
    layers = [jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / WIDTH ** 0.5 for k in keys[:LAYERS]]
    x = jax.random.normal(keys[-2], (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(keys[-1], (BATCH, WIDTH), jnp.float32)

    def loss(stacked, x, y):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, stacked)
        return jnp.mean((h - y) ** 2)

    if variant == "fixed":  # EDIT
        @jax.jit  # EDIT
        def train_step(stacked, x, y):  # EDIT
            value, grad = jax.value_and_grad(loss)(stacked, x, y)  # EDIT
            return stacked - LR * grad, value  # EDIT
        return (lambda carry: train_step(carry[0], x, y)), (jnp.stack(layers), jnp.float32(0)), \
            {"units": BATCH, "unit": "examples"}  # EDIT

    @jax.jit
    def train_step_list(layers, x, y):
        value, grads = jax.value_and_grad(lambda ls: loss(jnp.stack(ls), x, y))(layers)  # as written
        return [w - LR * g for w, g in zip(layers, grads)], value

    return (lambda carry: train_step_list(carry[0], x, y)), (layers, jnp.float32(0)), \
        {"units": BATCH, "unit": "examples"}
