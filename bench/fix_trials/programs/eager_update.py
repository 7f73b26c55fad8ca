"""A deep MLP trained in raw JAX whose gradient is jitted but whose hand-written Adam update runs eagerly:
jax.tree.map of plain jnp expressions outside any jit, over every parameter leaf.

As its user wrote it: 24 layers of 512 x 512 (48 leaves: weights and biases), batch 1,024, float32. Each leaf's
update is about a dozen small ops, each dispatched on its own: ~600 dispatches per step for work the device does in
well under a millisecond. Variants:
  fixed   the same update function under jax.jit (one dispatch)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
LAYERS, WIDTH, BATCH = size(24, 4), size(512, 32), size(1024, 16)
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


def adam(params, grads, m, v, t):
    t = t + 1
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, grads)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, grads)
    m_hat = jax.tree.map(lambda m: m / (1 - B1 ** t), m)
    v_hat = jax.tree.map(lambda v: v / (1 - B2 ** t), v)
    params = jax.tree.map(lambda p, m, v: p - LR * m / (jnp.sqrt(v) + EPS), params, m_hat, v_hat)
    return params, m, v, t


def build(variant):
    keys = jax.random.split(jax.random.key(6), LAYERS + 2)
    params = [{"w": jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH),
               "b": jnp.zeros((WIDTH,), jnp.float32)} for k in keys[:LAYERS]]
    x = jax.random.normal(keys[-2], (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(keys[-1], (BATCH, WIDTH), jnp.float32)

    def loss_fn(params):
        h = x
        for layer in params:
            h = h + jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean((h - y) ** 2)

    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    update = jax.jit(adam) if variant == "fixed" else adam  # EDIT

    def step(carry):
        params, m, v, t, _ = carry
        loss, grads = grad_fn(params)
        params, m, v, t = update(params, grads, m, v, t)
        return params, m, v, t, loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    return step, (params, zeros, zeros, jnp.zeros((), jnp.float32), jnp.zeros(())), {"units": BATCH, "unit": "samples"}
