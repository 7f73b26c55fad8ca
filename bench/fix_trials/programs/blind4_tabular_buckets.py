"""Batch scoring for a tabular click/credit model over quantile-bucketized numeric features, in raw JAX (float32).

Each of 64 numeric features is mapped to one of 256 buckets by its own 255 quantile boundaries (fitted offline on
the training data), each bucket id looks up a 16-wide embedding from that feature's table, and the concatenated
embeddings go through dense ReLU layers of 512 and 256 to a sigmoid score. Each step scores one batch of 65,536 rows
and returns the scores. Variants:
  fixed    the bucket search done with searchsorted's compare_all method
  sort     the bucket search done with searchsorted's sort method
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "batch inference (tabular)"
VARIANTS = ["before", "fixed", "sort"]
ROWS, FEATURES, BUCKETS, EMB = size(65536, 256), size(64, 8), size(256, 32), 16
HIDDEN1, HIDDEN2 = size(512, 32), size(256, 16)


def fit_boundaries(sample):
    """Per-feature quantiles of the training sample."""
    qs = np.linspace(0, 1, BUCKETS + 1)[1:-1]
    return np.quantile(sample, qs, axis=0).T.astype(np.float32)


def init_params(key, boundaries):
    k0, k1, k2, k3 = jax.random.split(key, 4)
    return {"bounds": jnp.asarray(boundaries),
            "tables": jax.random.normal(k0, (FEATURES, BUCKETS, EMB), jnp.float32) * 0.1,
            "w1": jax.random.normal(k1, (FEATURES * EMB, HIDDEN1), jnp.float32) / np.sqrt(FEATURES * EMB),
            "b1": jnp.zeros((HIDDEN1,)),
            "w2": jax.random.normal(k2, (HIDDEN1, HIDDEN2), jnp.float32) / np.sqrt(HIDDEN1),
            "b2": jnp.zeros((HIDDEN2,)),
            "w3": jax.random.normal(k3, (HIDDEN2, 1), jnp.float32) / np.sqrt(HIDDEN2)}


def bucketize(bounds, x, method):
    """bounds: (features, buckets - 1) sorted; x: (rows, features) -> (rows, features) bucket ids."""
    search = functools.partial(jnp.searchsorted, side="right", method=method)
    return jax.vmap(search, in_axes=(0, 1), out_axes=1)(bounds, x)


def score(params, x, method):
    ids = bucketize(params["bounds"], x, method)
    emb = params["tables"][jnp.arange(FEATURES)[None, :], ids]
    h = jax.nn.relu(emb.reshape(x.shape[0], -1) @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return jax.nn.sigmoid(h @ params["w3"])[:, 0]


def build(variant):
    rng = np.random.default_rng(3)
    mu, sigma = rng.normal(0, 1, FEATURES), rng.uniform(0.3, 2.0, FEATURES)  # skewed, per-feature shape
    params = init_params(jax.random.key(3), fit_boundaries(rng.lognormal(mu, sigma, (20000, FEATURES))))
    x = jnp.asarray(rng.lognormal(mu, sigma, (ROWS, FEATURES)).astype(np.float32))
    method = {"fixed": "compare_all", "sort": "sort"}.get(variant, "scan")  # EDIT
    fn = jax.jit(lambda p, xb: score(p, xb, method))

    def step(carry):
        params, x, _ = carry
        return params, x, fn(params, x)

    return step, (params, x, jnp.zeros((ROWS,))), {"units": ROWS, "unit": "rows"}
