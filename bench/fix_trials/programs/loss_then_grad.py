"""An MLP trained in raw JAX whose loop computes the loss with one jitted call and the gradient with another,
loss_fn(params, batch) then grad_fn(params, batch) with grad_fn = jax.jit(jax.grad(loss)): the gradient's call runs
the same forward pass again.

As its user wrote it: batch 1,024, a 4-layer float32 MLP of width 4,096, SGD applied by a third jitted call; the loss
stays on the device (it is logged elsewhere). Variants:
  fixed   loss, grads = jax.jit(jax.value_and_grad(loss))(params, batch): one forward pass per step
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, WIDTH, LAYERS, LR = size(1024, 8), size(4096, 32), size(4, 2), 1e-3


def loss(params, x, y):
    h = x
    for w in params[:-1]:
        h = jax.nn.relu(h @ w)
    return jnp.mean((h @ params[-1] - y) ** 2)


def build(variant):
    ks = jax.random.split(jax.random.key(9), LAYERS + 2)
    params = [jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH) for k in ks[:LAYERS]]
    x = jax.random.normal(ks[-2], (BATCH, WIDTH), jnp.float32)
    y = jax.random.normal(ks[-1], (BATCH, WIDTH), jnp.float32)
    loss_fn, grad_fn = jax.jit(loss), jax.jit(jax.grad(loss))
    value_and_grad_fn = jax.jit(jax.value_and_grad(loss))
    update = jax.jit(lambda params, grads: [p - LR * g for p, g in zip(params, grads)])

    def step(carry):
        params, _ = carry
        if variant == "fixed":  # EDIT
            value, grads = value_and_grad_fn(params, x, y)  # EDIT
        else:
            value = loss_fn(params, x, y)  # as written
            grads = grad_fn(params, x, y)
        return update(params, grads), value

    return step, (params, jnp.float32(0)), {"units": BATCH, "unit": "examples"}
