"""Feature propagation over a graph in raw JAX, two hops at a time: the user forms the two-hop operator A @ A and
multiplies the node features by it, (A @ A) @ X. The features are thin (16 per node), so the n×n product costs n³
multiply-adds where A @ (A @ X) costs two n²·16 products.

As its user wrote it: 4,096 nodes, a dense normalised adjacency in float32, 16 features, the result passed through a
tanh and fed back as the next step's features. Variants:
  fixed   A @ (A @ X): the thin operand multiplied first, the n×n product never formed
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (graph propagation)"
VARIANTS = ["before", "fixed"]
NODES, FEATURES = size(4096, 256), 16


def build(variant):
    k = jax.random.split(jax.random.key(11), 2)
    adjacency = (jax.random.uniform(k[0], (NODES, NODES)) < 0.01).astype(jnp.float32)
    adjacency = adjacency / jnp.maximum(adjacency.sum(axis=1, keepdims=True), 1.0)
    features = jax.random.normal(k[1], (NODES, FEATURES), jnp.float32)

    @jax.jit
    def propagate(a, x):
        if variant == "fixed":  # EDIT
            return jnp.tanh(a @ (a @ x))  # EDIT
        return jnp.tanh((a @ a) @ x)  # as written: the two-hop operator, then the features

    def step(x):
        return propagate(adjacency, x)

    return step, features, {"units": NODES, "unit": "nodes"}
