"""Credit-default model training: an MLP on standardized tabular features, trained with Adam on a binary
cross-entropy, with a held-out validation loss tracked in the training state for the dashboard (logged every
LOG_EVERY steps).

Variants:
  fixed: the validation loss is computed under lax.cond only on steps that are a multiple of LOG_EVERY.
  host_eval: the validation loss is a separate jitted call made from the Python loop every LOG_EVERY steps.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (tabular credit risk)"
VARIANTS = ["before", "fixed", "host_eval"]
TRACE_STEPS = 4

N_TRAIN = size(262144, 512)
N_VAL = size(131072, 256)
BATCH = size(8192, 64)
F = size(256, 16)
WIDTH = size(1024, 32)
DEPTH = 4
LOG_EVERY = 100
LR = 1e-3


def init(key):
    dims = [F] + [WIDTH] * DEPTH + [1]
    ks = jax.random.split(key, len(dims) - 1)
    return [{"w": jax.random.normal(k, (a, b)) * np.sqrt(2.0 / a), "b": jnp.zeros(b)}
            for k, a, b in zip(ks, dims[:-1], dims[1:])]


def logits(params, x):
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return (x @ params[-1]["w"] + params[-1]["b"])[:, 0]


def bce(params, x, y):
    z = logits(params, x)
    return jnp.mean(jnp.maximum(z, 0) - z * y + jnp.log1p(jnp.exp(-jnp.abs(z))))


def adam(params, grads, m, v, t):
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
    c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
    params = jax.tree.map(lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), params, m, v)
    return params, m, v


def build(variant):
    kx, kw, kv, kp = jax.random.split(jax.random.key(3), 4)
    x = jax.random.normal(kx, (N_TRAIN, F))
    w_true = jax.random.normal(kw, (F,)) / np.sqrt(F)
    y = (x @ w_true + 0.3 * jax.random.normal(kv, (N_TRAIN,)) > 0).astype(jnp.float32)
    xv, yv = x[:N_VAL] * 1.01, y[:N_VAL]
    params = init(kp)
    zeros = jax.tree.map(jnp.zeros_like, params)
    n_batches = N_TRAIN // BATCH

    @jax.jit
    def train_step(state):
        params, m, v, t, val = state
        i = t % n_batches
        xb = jax.lax.dynamic_slice_in_dim(x, i * BATCH, BATCH)
        yb = jax.lax.dynamic_slice_in_dim(y, i * BATCH, BATCH)
        grads = jax.grad(bce)(params, xb, yb)
        params, m, v = adam(params, grads, m, v, (t + 1).astype(jnp.float32))
        if variant == "before":  # EDIT
            val = bce(params, xv, yv)  # EDIT
        elif variant == "fixed":  # EDIT
            val = jax.lax.cond(t % LOG_EVERY == 0, lambda: bce(params, xv, yv), lambda: val)  # EDIT
        return params, m, v, t + 1, val

    val_loss = jax.jit(lambda p: bce(p, xv, yv))  # EDIT

    calls = [0]

    def step(state):
        state = train_step(state)
        calls[0] += 1
        if variant == "host_eval" and calls[0] % LOG_EVERY == 1:  # EDIT
            state = state[:4] + (val_loss(state[0]),)  # EDIT
        return state

    state0 = (params, zeros, zeros, jnp.zeros((), jnp.int32), jnp.zeros(()))
    return step, state0, {"units": BATCH, "unit": "training rows"}


def result(state):
    return state[0]
