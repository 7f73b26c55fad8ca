"""Training step of a wide float32 MLP regressor with a hand-written Adam update, in raw JAX.

The model maps 4,096 input features through 4 dense layers of 4,096 (tanh) to 256 targets; the loss is mean squared
error; each step computes the gradients of one batch of 4,096 samples and applies Adam (lr 1e-4) to all parameters,
everything in one jitted function. Variants:
  fixed   the matmuls at the default precision of the chip (single bfloat16 pass, float32 accumulation)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, D, LAYERS, OUT = size(4096, 32), size(4096, 64), 4, size(256, 8)
LR, B1, B2 = 1e-4, 0.9, 0.999


def build(variant):
    precision = jax.lax.Precision.HIGHEST
    if variant == "fixed":  # EDIT
        precision = jax.lax.Precision.DEFAULT  # EDIT
    ks = iter(jax.random.split(jax.random.key(2), LAYERS + 4))
    dims = [D] * (LAYERS + 1) + [OUT]
    params = [{"w": jax.random.normal(next(ks), (i, o), jnp.float32) / jnp.sqrt(i), "b": jnp.zeros((o,))}
              for i, o in zip(dims[:-1], dims[1:])]
    x = jax.random.normal(next(ks), (BATCH, D), jnp.float32)
    y = jax.random.normal(next(ks), (BATCH, OUT), jnp.float32)

    def forward(params, x):
        for p in params[:-1]:
            x = jnp.tanh(jnp.dot(x, p["w"], precision=precision) + p["b"])
        return jnp.dot(x, params[-1]["w"], precision=precision) + params[-1]["b"]

    def loss_fn(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    @jax.jit
    def train_step(params, m, v, t, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        t = t + 1
        m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, grads)
        v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, grads)
        mhat_scale, vhat_scale = 1 / (1 - B1 ** t), 1 / (1 - B2 ** t)
        params = jax.tree.map(lambda p, m, v: p - LR * (m * mhat_scale) / (jnp.sqrt(v * vhat_scale) + 1e-8),
                              params, m, v)
        return params, m, v, t, loss

    def step(carry):
        params, m, v, t, x, y, _ = carry
        params, m, v, t, loss = train_step(params, m, v, t, x, y)
        return params, m, v, t, x, y, loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    carry = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32), x, y, jnp.zeros(()))
    return step, carry, {"units": BATCH, "unit": "samples"}
