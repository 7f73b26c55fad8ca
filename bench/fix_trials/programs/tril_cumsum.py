"""A sequence model trained in raw JAX whose causal running mean over time is written as a product with a
lower-triangular matrix of ones, jnp.tril(jnp.ones((T, T))) @ h, the way the formula reads on paper.

As its user wrote it: batch 32, sequence 4,096, width 512, float32; per step two dense layers around the running
mean, SGD. The triangular product costs 2*T*T*D FLOPs per sequence (and again in the backward pass) for a sum
that needs T*D additions. Variants:
  fixed   jnp.cumsum(h, axis=1)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, WIDTH = size(32, 2), size(4096, 64), size(512, 32)


def running_sum(h, variant):
    if variant == "fixed":  # EDIT
        return jnp.cumsum(h, axis=1)
    return jnp.tril(jnp.ones((SEQ, SEQ))) @ h  # as written


def build(variant):
    k = jax.random.split(jax.random.key(2), 4)
    params = {"w_in": jax.random.normal(k[0], (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH),
              "w_out": jax.random.normal(k[1], (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH)}
    x = jax.random.normal(k[2], (BATCH, SEQ, WIDTH), jnp.float32)
    y = jax.random.normal(k[3], (BATCH, SEQ, WIDTH), jnp.float32)
    counts = jnp.arange(1, SEQ + 1, dtype=jnp.float32)[:, None]

    def loss_fn(params):
        h = jnp.tanh(x @ params["w_in"])
        mean_so_far = running_sum(h, variant) / counts
        return jnp.mean((mean_so_far @ params["w_out"] - y) ** 2)

    @jax.jit
    def train_step(params):
        loss, g = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss

    def step(carry):
        return train_step(carry[0])

    return step, (params, jnp.zeros(())), {"units": BATCH * SEQ, "unit": "tokens"}
