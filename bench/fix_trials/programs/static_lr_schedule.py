"""Training an MLP classifier in raw JAX with a cosine learning-rate schedule whose rate is passed to the jitted
update as a static argument (static_argnames=("lr",)): every step's rate is a new value, so jax.jit traces and
compiles the update again on every step, with the same shapes.

As its user wrote it: a 4-layer float32 MLP of width 2,048 on batches of 256 inputs of 1,024 features, 10 classes,
SGD with the rate from a cosine schedule over 10,000 steps computed in Python. Variants:
  fixed   the rate passed as a traced argument (jnp.float32(lr), no static_argnames): one compile
"""
import math

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
TRACE_STEPS = 2  # every step compiles: a short trace keeps the capture small
VARIANTS = ["before", "fixed"]
BATCH, FEATURES, WIDTH, LAYERS, CLASSES = size(256, 8), size(1024, 16), size(2048, 32), 4, 10
PEAK_LR, TOTAL_STEPS = 1e-2, 10_000


def loss_fn(params, x, y):
    h = x
    for w in params[:-1]:
        h = jax.nn.relu(h @ w)
    logp = jax.nn.log_softmax(h @ params[-1])
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def update(params, x, y, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return [p - lr * g for p, g in zip(params, grads)], loss


def build(variant):
    dims = [FEATURES] + [WIDTH] * (LAYERS - 1) + [CLASSES]
    ks = jax.random.split(jax.random.key(4), LAYERS + 2)
    params = [jax.random.normal(k, (a, b), jnp.float32) / jnp.sqrt(a) for k, a, b in zip(ks, dims, dims[1:])]
    x = jax.random.normal(ks[-2], (BATCH, FEATURES), jnp.float32)
    y = jax.random.randint(ks[-1], (BATCH,), 0, CLASSES)
    if variant == "fixed":  # EDIT
        jitted = jax.jit(update)  # EDIT: the rate is traced
    else:
        jitted = jax.jit(update, static_argnames=("lr",))  # as written: the rate is static

    def step(carry):
        params, _, i = carry
        lr = PEAK_LR * 0.5 * (1 + math.cos(math.pi * i / TOTAL_STEPS))
        if variant == "fixed":  # EDIT
            lr = jnp.float32(lr)  # EDIT
        params, loss = jitted(params, x, y, lr=lr)
        return params, loss, i + 1

    return step, (params, jnp.zeros(()), 0), {"units": BATCH, "unit": "examples"}
