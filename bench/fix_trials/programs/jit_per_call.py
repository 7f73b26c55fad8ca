"""Training an MLP classifier in raw JAX whose loop wraps the update in jax.jit on every step: the step is written
as jax.jit(lambda params, x, y: update(params, x, y, LR))(params, x, y), so each step makes a new function object,
and jax.jit, which keeps its compiled programs with the function it wraps, traces, lowers and compiles the same
program again on every call.

As its user wrote it: a 4-layer float32 MLP of width 2,048 on batches of 256 inputs of 1,024 features, 10 classes,
SGD. Variants:
  fixed   the update jitted once before the loop (jax.jit(update)) and called with the learning rate as an argument
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
TRACE_STEPS = 2  # every step compiles: a short trace keeps the capture small
VARIANTS = ["before", "fixed"]
BATCH, FEATURES, WIDTH, LAYERS, CLASSES = size(256, 8), size(1024, 16), size(2048, 32), 4, 10
LR = 1e-2


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
    ks = jax.random.split(jax.random.key(3), LAYERS + 2)
    params = [jax.random.normal(k, (a, b), jnp.float32) / jnp.sqrt(a) for k, a, b in zip(ks, dims, dims[1:])]
    x = jax.random.normal(ks[-2], (BATCH, FEATURES), jnp.float32)
    y = jax.random.randint(ks[-1], (BATCH,), 0, CLASSES)
    jitted = jax.jit(update)  # EDIT: made once, before the loop

    def step(carry):
        params, _ = carry
        if variant == "fixed":  # EDIT
            return jitted(params, x, y, LR)  # EDIT
        return jax.jit(lambda params, x, y: update(params, x, y, LR))(params, x, y)  # as written: jitted per call

    return step, (params, jnp.zeros(())), {"units": BATCH, "unit": "examples"}
