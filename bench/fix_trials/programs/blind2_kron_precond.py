"""Kronecker-factored gradient preconditioning (a Shampoo/K-FAC style optimizer step), in raw JAX (float32).

Each layer's gradient G (m x n) has a left factor L (m x m) and a right factor R (n x n), inverse roots kept by the
optimizer; the step applies the preconditioner (L kron R) to each layer's flattened gradient and updates the weights
with the result (lr 1e-3). As its user wrote it: 4 layers with 128 x 128 gradients. Variants:
  fixed   the preconditioner applied factor by factor, L @ G @ R^T
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (optimizer update)"
VARIANTS = ["before", "fixed"]
LAYERS, M, N, LR = 4, size(128, 8), size(128, 12), 1e-3


def build(variant):
    ks = iter(jax.random.split(jax.random.key(9), 5 * LAYERS))

    def spd(k, n):
        a = jax.random.normal(k, (n, n), jnp.float32) / jnp.sqrt(n)
        return a @ a.T / n + jnp.eye(n)

    weights = [jax.random.normal(next(ks), (M, N), jnp.float32) * 0.02 for _ in range(LAYERS)]
    grads = [jax.random.normal(next(ks), (M, N), jnp.float32) for _ in range(LAYERS)]
    lefts = [spd(next(ks), M) for _ in range(LAYERS)]
    rights = [spd(next(ks), N) for _ in range(LAYERS)]

    @jax.jit
    def apply_update(weights, grads, lefts, rights):
        new = []
        for w, g, l, r in zip(weights, grads, lefts, rights):
            if variant == "fixed":  # EDIT
                pg = l @ g @ r.T  # EDIT
            else:
                pg = (jnp.kron(l, r) @ g.reshape(-1)).reshape(g.shape)
            new.append(w - LR * pg)
        return new

    def step(carry):
        weights, grads, lefts, rights = carry
        return apply_update(weights, grads, lefts, rights), grads, lefts, rights

    return step, (weights, grads, lefts, rights), {"units": LAYERS, "unit": "layers"}
