"""Credit-default model on tabular features: an MLP trained with SGD + momentum and a cosine learning-rate schedule,
minibatches cut from a feature matrix that stays on the device.

Variants:
  fixed: the learning rate is passed to the jitted step as an ordinary argument.
  lr_in_step: the jitted step computes the learning rate from the step counter.
"""
import functools
import math

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (tabular, credit risk)"
VARIANTS = ["before", "fixed", "lr_in_step"]
TRACE_STEPS = 2

ROWS = size(262144, 512)
FEATURES = size(96, 12)
WIDTH = size(512, 16)
BATCH = size(4096, 64)
TOTAL_STEPS = 20000
PEAK_LR, MOMENTUM = 0.05, 0.9


def cosine_lr(i):
    return PEAK_LR * 0.5 * (1.0 + math.cos(math.pi * i / TOTAL_STEPS))


def init_params():
    ks = jax.random.split(jax.random.key(3), 4)
    dims = [FEATURES, WIDTH, WIDTH, WIDTH, 1]
    return [(jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5, jnp.zeros((b,)))
            for k, a, b in zip(ks, dims[:-1], dims[1:])]


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    logit = (x @ w + b)[:, 0]
    return jnp.mean(jnp.logaddexp(0.0, logit) - y * logit)


def sgd_update(params, mom, x, y, lr):
    g = jax.grad(loss_fn)(params, x, y)
    mom = jax.tree.map(lambda m, gi: MOMENTUM * m + gi, mom, g)
    params = jax.tree.map(lambda p, m: p - lr * m, params, mom)
    return params, mom


def minibatch(data, labels, i):
    start = (i * BATCH) % ROWS
    return (jax.lax.dynamic_slice_in_dim(data, start, BATCH),
            jax.lax.dynamic_slice_in_dim(labels, start, BATCH))


@functools.partial(jax.jit, static_argnames=("lr",))  # EDIT
def train_step_static(params, mom, data, labels, i, lr):  # EDIT
    x, y = minibatch(data, labels, i)  # EDIT
    return sgd_update(params, mom, x, y, lr)  # EDIT


@jax.jit  # EDIT
def train_step_arg(params, mom, data, labels, i, lr):  # EDIT
    x, y = minibatch(data, labels, i)  # EDIT
    return sgd_update(params, mom, x, y, lr)  # EDIT


@jax.jit  # EDIT
def train_step_schedule(params, mom, data, labels, i):  # EDIT
    x, y = minibatch(data, labels, i)  # EDIT
    lr = PEAK_LR * 0.5 * (1.0 + jnp.cos(jnp.pi * i / TOTAL_STEPS))  # EDIT
    return sgd_update(params, mom, x, y, lr)  # EDIT


def build(variant):
    kx, kw = jax.random.split(jax.random.key(4))
    data = jax.random.normal(kx, (ROWS, FEATURES))
    labels = (data @ jax.random.normal(kw, (FEATURES,)) > 0.5).astype(jnp.float32)
    params = init_params()
    mom = jax.tree.map(jnp.zeros_like, params)

    def step(carry):
        params, mom, i = carry
        if variant == "before":
            params, mom = train_step_static(params, mom, data, labels, i, lr=cosine_lr(i))  # EDIT
        elif variant == "fixed":
            params, mom = train_step_arg(params, mom, data, labels, i, cosine_lr(i))  # EDIT
        else:
            params, mom = train_step_schedule(params, mom, data, labels, i)  # EDIT
        return params, mom, i + 1

    return step, (params, mom, 0), {"units": BATCH, "unit": "rows"}


def result(carry):
    return carry[0]
