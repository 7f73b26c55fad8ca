"""A residual MLP trained in raw JAX whose layers fold their bias into the weight matrix, as code ported from a
textbook writes it: a column of ones appended to each layer's input, x1 = [x, 1], and one weight of 129 rows. Every
layer's input is then 129 wide, which a TPU lays out along 128-lane tiles as 256: half of each such array, and of
each matmul's contraction, is padding.

As its user wrote it: batch 65,536, 128 features, 6 layers of 128 with the bias row folded in, float32, plain SGD.
Variants:
  fixed   the same weights used as x @ w[:128] + w[128]: the bias added after the matmul, no 129th column
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
RTOL = 1e-4
BATCH, WIDTH, LAYERS = size(65536, 256), 128, 6
LR = 1e-3


def build(variant):
    ks = jax.random.split(jax.random.key(3), LAYERS + 2)
    params = [jax.random.normal(k, (WIDTH + 1, WIDTH), jnp.float32) / WIDTH ** 0.5 for k in ks[:LAYERS]]
    x = jax.random.normal(ks[-2], (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(ks[-1], (BATCH, WIDTH), jnp.float32)

    def layer(h, w):
        if variant == "fixed":  # EDIT
            return h @ w[:WIDTH] + w[WIDTH]  # EDIT
        ones = jnp.ones((h.shape[0], 1), h.dtype)
        return jnp.concatenate([h, ones], axis=1) @ w  # as written: the bias as a 129th input column

    def loss_fn(params):
        h = x
        for w in params:
            h = h + jnp.tanh(layer(h, w))
        return jnp.mean(jnp.square(h - y))

    @jax.jit
    def train_step(params):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return [w - LR * g for w, g in zip(params, grads)], loss

    def step(carry):
        return train_step(carry[0])

    return step, (params, jnp.float32(0)), {"units": BATCH, "unit": "samples"}
