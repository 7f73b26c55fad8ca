"""Deep factorization machine for click-through rate on a tabular ads dataset with many categorical columns.

Every categorical column has its own embedding table (kept per column, as the feature config lists them). The
logit is the factorization-machine pairwise term of the column embeddings plus an MLP on their sum. One jitted,
donated train step per batch; Adam is written by hand.

Variants:
  fixed: the column tables are one (columns, vocab, dim) array, looked up with one gather.
  stack_in_step: the per-column tables stay separate parameters and are stacked inside the loss for one gather.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (tabular, click-through rate)"
VARIANTS = ["before", "fixed", "stack_in_step"]
TRACE_STEPS = 2

COLUMNS = size(256, 6)
VOCAB = size(64, 20)
EMB = size(128, 8)
HIDDEN = size(512, 32)
BATCH = size(256, 16)
LR, B1, B2 = 1e-3, 0.9, 0.999


def fm_logit(p, rows):
    """rows: (B, COLUMNS, EMB) column embeddings."""
    pooled = rows.sum(1)
    pairwise = 0.5 * jnp.sum(pooled * pooled - jnp.sum(rows * rows, 1), -1)
    h = jax.nn.relu(pooled @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    return pairwise + (h @ p["w3"])[:, 0]


def embed(variant, tables, ids):
    if variant == "before":  # EDIT
        return jnp.stack([tables[c][ids[:, c]] for c in range(COLUMNS)], 1)  # EDIT
    if variant == "stack_in_step":  # EDIT
        tables = jnp.stack(tables)  # EDIT
    return tables[jnp.arange(COLUMNS)[None, :], ids]  # (B, COLUMNS, EMB)


def loss_fn(variant, params, ids, clicks):
    logit = fm_logit(params["mlp"], embed(variant, params["tables"], ids))
    return jnp.mean(jnp.logaddexp(0.0, logit) - clicks * logit)


def adam(params, grads, m, v, t):
    m = jax.tree.map(lambda a, g: B1 * a + (1 - B1) * g, m, grads)
    v = jax.tree.map(lambda a, g: B2 * a + (1 - B2) * g * g, v, grads)
    c1, c2 = 1 - B1 ** t, 1 - B2 ** t
    params = jax.tree.map(lambda p, a, b: p - LR * (a / c1) / (jnp.sqrt(b / c2) + 1e-8), params, m, v)
    return params, m, v


def build(variant):
    ks = jax.random.split(jax.random.key(0), 8)
    all_tables = 0.02 * jax.random.normal(ks[0], (COLUMNS, VOCAB, EMB), jnp.float32)
    if variant == "fixed":  # EDIT
        tables = all_tables  # EDIT
    else:  # EDIT
        tables = [all_tables[c] for c in range(COLUMNS)]  # EDIT
    mlp = {"w1": jax.random.normal(ks[1], (EMB, HIDDEN)) / np.sqrt(EMB), "b1": jnp.zeros(HIDDEN),
           "w2": jax.random.normal(ks[2], (HIDDEN, HIDDEN)) / np.sqrt(HIDDEN), "b2": jnp.zeros(HIDDEN),
           "w3": jax.random.normal(ks[3], (HIDDEN, 1)) / np.sqrt(HIDDEN)}
    params = {"tables": tables, "mlp": mlp}
    zeros = jax.tree.map(jnp.zeros_like, params)
    # Skewed (Zipf-like) category ids, as real columns have; fixed batches cycled on the device.
    u = jax.random.uniform(ks[4], (8, BATCH, COLUMNS))
    ids_all = jnp.minimum((VOCAB * u ** 3).astype(jnp.int32), VOCAB - 1)
    clicks_all = (jax.random.uniform(ks[5], (8, BATCH)) < 0.2).astype(jnp.float32)

    def train_step(carry):
        params, m, v, t, _ = carry
        i = t % 8
        loss, grads = jax.value_and_grad(lambda p: loss_fn(variant, p, ids_all[i], clicks_all[i]))(params)
        params, m, v = adam(params, grads, m, v, (t + 1).astype(jnp.float32))
        return params, m, v, t + 1, loss

    step = jax.jit(train_step, donate_argnums=0)
    carry0 = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.int32(0), jnp.float32(0.0))
    return step, carry0, {"units": BATCH, "unit": "examples"}


def result(carry):
    params, _, _, _, loss = carry
    tables = params["tables"]
    return {"tables": jnp.stack(tables) if isinstance(tables, list) else tables, "mlp": params["mlp"], "loss": loss}
