"""Candidate ranking for a feed: a deep scorer rates every (user, candidate item) pair of a request batch.

Each user has a dense context vector (history, device, locale features); each request brings a slate of candidate
items with their embeddings. The scorer is an MLP over the user context joined with the item embedding; the step
returns the top-scoring candidates' scores and indices for every user.

Variants:
  fixed: the first layer is applied to the user context and to the item embeddings separately and the two summed.
  split_concat: the pair features are built with jnp.concatenate on broadcast views before the first layer.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (recommendation ranking)"
VARIANTS = ["before", "fixed", "split_concat"]
TRACE_STEPS = 3

B = size(256, 4)        # users per request batch
A = size(512, 8)        # candidates per user
DU = size(1024, 32)     # user context width
DI = size(64, 8)        # item embedding width
H1, H2 = size(512, 16), size(256, 8)
K = size(32, 4)


def init(key):
    k = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k[0], (DU + DI, H1)) / np.sqrt(DU + DI), "b1": jnp.zeros(H1),
            "w2": jax.random.normal(k[1], (H1, H2)) / np.sqrt(H1), "b2": jnp.zeros(H2),
            "w3": jax.random.normal(k[2], (H2,)) / np.sqrt(H2)}


def first_layer(p, user, items, variant):
    if variant == "before":  # EDIT
        pairs = jnp.concatenate([jnp.repeat(user[:, None, :], A, axis=1), items], axis=-1)  # EDIT
        return pairs.reshape(B * A, DU + DI) @ p["w1"] + p["b1"]  # EDIT
    if variant == "split_concat":  # EDIT
        pairs = jnp.concatenate([jnp.broadcast_to(user[:, None, :], (B, A, DU)), items], axis=-1)  # EDIT
        return pairs.reshape(B * A, DU + DI) @ p["w1"] + p["b1"]  # EDIT
    hu = user @ p["w1"][:DU]  # EDIT
    hi = items @ p["w1"][DU:]  # EDIT
    return (hu[:, None, :] + hi + p["b1"]).reshape(B * A, H1)  # EDIT


def build(variant):
    ku, ki, kp = jax.random.split(jax.random.key(0), 3)
    params = init(kp)
    user = jax.random.normal(ku, (B, DU))
    items = jax.random.normal(ki, (B, A, DI))

    @jax.jit
    def step(carry):
        user, items, _, _ = carry
        h = jax.nn.relu(first_layer(params, user, items, variant))
        h = jax.nn.relu(h @ params["w2"] + params["b2"])
        scores = (h @ params["w3"]).reshape(B, A)
        top, idx = jax.lax.top_k(scores, K)
        # next request batch: users drift slightly (keeps each step's work live)
        return user * 0.999 + 1e-3 * top.mean(), items, top, idx

    carry0 = (user, items, jnp.zeros((B, K)), jnp.zeros((B, K), jnp.int32))
    return step, carry0, {"units": B * A, "unit": "scored pairs"}


def result(carry):
    return carry[0], carry[2]
