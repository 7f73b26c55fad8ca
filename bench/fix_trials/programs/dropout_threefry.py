"""An MLP trained in raw JAX with dropout after every hidden layer, its masks drawn with jax.random.bernoulli from a
key folded with the step number, as JAX's tutorials write dropout. The default generator, threefry2x32, computes
each mask's bits with 20 rounds of integer hashing on the vector units: with bfloat16 matmuls the masks' bits cost
about as much as the matmuls.

As its user wrote it: batch 2,048, width 4,096, 4 hidden layers in bfloat16, dropout 0.1, plain SGD. Variants:
  fixed   the key made with impl="rbg" (XLA's RngBitGenerator draws the bits); the masks differ, not their rate
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
RTOL = 0.05  # other masks: the loss moves by the noise dropout adds, not by a changed computation
BATCH, WIDTH, LAYERS = size(2048, 64), size(4096, 128), 4
RATE, LR = 0.1, 1e-2


def result(carry):
    return carry[2]  # the loss: the masks, and so the parameters' updates, differ by design


def build(variant):
    ks = jax.random.split(jax.random.key(0), LAYERS + 2)
    params = [(jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / WIDTH ** 0.5).astype(jnp.bfloat16)
              for k in ks[:LAYERS]]
    x = jax.random.normal(ks[-2], (BATCH, WIDTH), jnp.bfloat16)
    y = jax.random.normal(ks[-1], (BATCH, WIDTH), jnp.bfloat16)
    if variant == "fixed":  # EDIT
        key = jax.random.key(42, impl="rbg")  # EDIT
    else:
        key = jax.random.key(42)  # as written: the default generator, threefry2x32

    def loss_fn(params, key):
        h = x
        for layer, w in enumerate(params):
            h = jax.nn.relu(h @ w)
            keep = jax.random.bernoulli(jax.random.fold_in(key, layer), 1.0 - RATE, h.shape)
            h = jnp.where(keep, h / (1.0 - RATE), 0).astype(jnp.bfloat16)
        return jnp.mean(jnp.square(h.astype(jnp.float32) - y.astype(jnp.float32)))

    @jax.jit
    def train_step(params, step, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(key, step))
        return [w - LR * g for w, g in zip(params, grads)], step + 1, loss

    def step(carry):
        return train_step(carry[0], carry[1], key)

    return step, (params, jnp.int32(0), jnp.float32(0)), {"units": BATCH, "unit": "samples"}
