"""Training a small MLP classifier in raw JAX with a hand-written SGD-with-momentum update and a cosine
learning-rate schedule computed in Python for each step.

As its user wrote it: batch 1,024 of 784-pixel inputs, 2 hidden layers of 1,024, 10 classes, float32; the update
function takes the step's learning rate as a keyword and is jitted where it is called. Variants:
  fixed   the update jitted once at definition, the learning rate passed as an ordinary array argument
"""
import functools
import math

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, IN, HIDDEN, CLASSES, TOTAL_STEPS = size(1024, 32), 784, size(1024, 64), 10, 10_000


def lr_at(i):
    return 0.05 * 0.5 * (1 + math.cos(math.pi * i / TOTAL_STEPS))


def loss_fn(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    logits = h @ params[-1][0] + params[-1][1]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, CLASSES), axis=-1))


def update(params, momentum, x, y, lr):
    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, g)
    params = jax.tree.map(lambda p, m: p - lr * m, params, momentum)
    return params, momentum, loss


update_jit = jax.jit(update)  # EDIT


def build(variant):
    sizes = [IN, HIDDEN, HIDDEN, CLASSES]
    ks = jax.random.split(jax.random.key(1), len(sizes) + 1)
    params = [(jax.random.normal(k, (a, b), jnp.float32) * jnp.sqrt(2.0 / a), jnp.zeros((b,), jnp.float32))
              for k, a, b in zip(ks, sizes[:-1], sizes[1:])]
    x = jax.random.uniform(ks[-2], (BATCH, IN), jnp.float32)
    y = jax.random.randint(ks[-1], (BATCH,), 0, CLASSES)
    momentum = jax.tree.map(jnp.zeros_like, params)

    def step(carry):
        params, momentum, i, _ = carry
        lr = lr_at(i)
        if variant == "fixed":  # EDIT
            params, momentum, loss = update_jit(params, momentum, x, y, jnp.float32(lr))  # EDIT
        else:
            params, momentum, loss = jax.jit(functools.partial(update, lr=lr))(params, momentum, x, y)
        return params, momentum, i + 1, loss

    return step, (params, momentum, 0, jnp.zeros((), jnp.float32)), {"units": BATCH, "unit": "samples"}
