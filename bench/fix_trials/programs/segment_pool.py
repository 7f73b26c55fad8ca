"""Message passing on a graph in raw JAX: each edge's message (a row of the source node's features) is summed into
its destination node with jax.ops.segment_sum over the edge list as the loader built it, in no order. The scatter-add
runs with indices_are_sorted=False, the default.

As its user wrote it: 32,768 nodes of 128 features, 1,048,576 edges, two rounds of messages per step, float32.
Variants:
  fixed   the edges sorted by destination once, where the graph is built, and indices_are_sorted=True
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (graph message passing)"
VARIANTS = ["before", "fixed"]
RTOL = 1e-4  # the sums add the same messages in another order
NODES, FEATURES, EDGES, ROUNDS = size(32768, 256), 128, size(1048576, 4096), 2


def build(variant):
    ks = jax.random.split(jax.random.key(11), 4)
    feats = jax.random.normal(ks[0], (NODES, FEATURES), jnp.float32)
    src = jax.random.randint(ks[1], (EDGES,), 0, NODES)
    dst = jax.random.randint(ks[2], (EDGES,), 0, NODES)
    w = jax.random.normal(ks[3], (FEATURES, FEATURES), jnp.float32) / FEATURES ** 0.5
    sorted_ids = variant == "fixed"  # EDIT
    if sorted_ids:  # EDIT
        order = jnp.argsort(dst)  # EDIT
        src, dst = src[order], dst[order]  # EDIT

    @jax.jit
    def propagate(h):
        for _ in range(ROUNDS):
            messages = h[src]
            h = jnp.tanh(jax.ops.segment_sum(messages, dst, num_segments=NODES,
                                             indices_are_sorted=sorted_ids) @ w)  # EDIT (as written: False)
        return h

    def step(carry):
        return propagate(carry[0]), carry[1] + 1

    return step, (feats, jnp.int32(0)), {"units": EDGES, "unit": "edges"}
