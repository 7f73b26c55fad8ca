"""Candidate retrieval serving for a two-tower recommender, in raw JAX (float32).

The item tower maps each catalog item's 512 content features through dense ReLU layers of 1,024 and 1,024 to a
128-wide unit embedding; the user tower maps a request's 256 features the same way. Each step serves one batch of 256
requests against a catalog of 196,608 items: it scores every item by inner product and returns the 50 best item ids
and scores per request, as the candidate generator hands them to the ranker. Variants:
  fixed      the catalog embeddings computed once when the server starts and passed to the scoring function
  chunked    the top 50 taken in two stages: per chunk of 2,048 items, then over the chunks' winners
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "serving (retrieval)"
VARIANTS = ["before", "fixed", "chunked"]
REQUESTS, ITEMS, CHUNK = size(256, 8), size(196608, 4096), size(2048, 512)
ITEM_FEATS, USER_FEATS, HIDDEN, EMB, TOPK = size(512, 32), size(256, 16), size(1024, 64), size(128, 16), 50


def dense_init(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a), "b": jnp.zeros((b,), jnp.float32)}
            for k, a, b in zip(keys, sizes[:-1], sizes[1:])]


def tower(layers, x):
    for i, layer in enumerate(layers):
        x = x @ layer["w"] + layer["b"]
        if i < len(layers) - 1:
            x = jax.nn.relu(x)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def top_candidates(scores, chunked):
    if chunked:  # EDIT
        r = scores.shape[0]  # EDIT
        vals, idx = jax.lax.top_k(scores.reshape(r, -1, CHUNK), TOPK)  # EDIT
        idx = idx + (jnp.arange(scores.shape[1] // CHUNK) * CHUNK)[None, :, None]  # EDIT
        best, pos = jax.lax.top_k(vals.reshape(r, -1), TOPK)  # EDIT
        return best, jnp.take_along_axis(idx.reshape(r, -1), pos, axis=1)  # EDIT
    return jax.lax.top_k(scores, TOPK)


@jax.jit
def retrieve(params, user_x, item_x):
    users = tower(params["user"], user_x)
    items = tower(params["item"], item_x)
    return top_candidates(users @ items.T, False)


@jax.jit  # EDIT
def retrieve_cached(params, user_x, item_emb):  # EDIT
    users = tower(params["user"], user_x)  # EDIT
    return top_candidates(users @ item_emb.T, False)  # EDIT


@jax.jit  # EDIT
def retrieve_chunked(params, user_x, item_x):  # EDIT
    users = tower(params["user"], user_x)  # EDIT
    items = tower(params["item"], item_x)  # EDIT
    return top_candidates(users @ items.T, True)  # EDIT


def build(variant):
    ku, ki, kx, ky = jax.random.split(jax.random.key(44), 4)
    params = {"user": dense_init(ku, [USER_FEATS, HIDDEN, HIDDEN, EMB]),
              "item": dense_init(ki, [ITEM_FEATS, HIDDEN, HIDDEN, EMB])}
    item_x = jax.random.normal(kx, (ITEMS, ITEM_FEATS), jnp.float32)
    user_x = jax.random.normal(ky, (REQUESTS, USER_FEATS), jnp.float32)
    catalog = item_x
    if variant == "fixed":  # EDIT
        catalog = jax.jit(tower)(params["item"], item_x)  # EDIT
    serve = {"fixed": retrieve_cached, "chunked": retrieve_chunked}.get(variant, retrieve)  # EDIT

    def step(carry):
        params, user_x, _ = carry
        scores, ids = serve(params, user_x, catalog)
        return params, user_x, (scores, ids)

    empty = (jnp.zeros((REQUESTS, TOPK), jnp.float32), jnp.zeros((REQUESTS, TOPK), jnp.int32))
    return step, (params, user_x, empty), {"units": REQUESTS, "unit": "requests"}
