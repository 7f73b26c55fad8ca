"""A surrogate-model regression trained in raw JAX: a float32 MLP whose matmuls ask for full precision
(precision=jax.lax.Precision.HIGHEST), as scientific codes ported from NumPy often do, with a hand-written Adam.

As its user wrote it: batch 4,096, 4 hidden layers of 4,096, tanh, float32 throughout. Variants:
  default   the precision argument removed (the TPU's default: one bf16 pass)
  high      precision=jax.lax.Precision.HIGH (three bf16 passes)
  bf16      parameters kept in float32, the matmul inputs cast to bfloat16 (float32 accumulation)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "default", "high", "bf16"]
BATCH, WIDTH, LAYERS, IN, OUT = size(4096, 64), size(4096, 64), 4, 256, 64


def matmul(x, w, variant):
    if variant == "default":  # EDIT
        return jnp.dot(x, w)
    if variant == "high":  # EDIT
        return jnp.dot(x, w, precision=jax.lax.Precision.HIGH)
    if variant == "bf16":  # EDIT
        return jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)  # as written


def build(variant):
    sizes = [IN] + [WIDTH] * LAYERS + [OUT]
    keys = jax.random.split(jax.random.key(6), len(sizes) + 1)
    params = [(jax.random.normal(k, (a, b), jnp.float32) / jnp.sqrt(a), jnp.zeros((b,), jnp.float32))
              for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    x = jax.random.normal(keys[-1], (BATCH, IN), jnp.float32)
    y = jnp.sin(x[:, :OUT])

    def loss_fn(params):
        h = x
        for i, (w, b) in enumerate(params):
            h = matmul(h, w, variant) + b
            if i < len(params) - 1:
                h = jnp.tanh(h)
        return jnp.mean((h - y) ** 2)

    @jax.jit
    def train_step(params, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(params)
        t = t + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        lr = 1e-3 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        params = jax.tree.map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + 1e-8), params, m, v)
        return params, m, v, t

    zeros = jax.tree.map(jnp.zeros_like, params)

    def step(carry):
        return train_step(*carry)

    return step, (params, zeros, zeros, jnp.zeros((), jnp.float32)), {"units": BATCH, "unit": "samples"}
