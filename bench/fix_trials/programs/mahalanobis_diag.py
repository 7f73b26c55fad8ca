"""Per-example Mahalanobis distances in raw JAX, written as the diagonal of a product: jnp.diag((X - mu) @ P @
(X - mu).T) with P the inverse covariance. The whole n×n product is formed to read its n diagonal elements.

As its user wrote it: 8,192 examples of width 512 in float32, scored against one Gaussian's mean and precision,
every step. Variants:
  fixed   jnp.einsum('ij,ji->i', (X - mu) @ P, (X - mu).T): only the diagonal is computed
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (anomaly scoring)"
VARIANTS = ["before", "fixed"]
EXAMPLES, WIDTH = size(8192, 256), size(512, 32)


def build(variant):
    k = jax.random.split(jax.random.key(5), 3)
    x = jax.random.normal(k[0], (EXAMPLES, WIDTH), jnp.float32)
    mu = jax.random.normal(k[1], (WIDTH,), jnp.float32) / 10
    half = jax.random.normal(k[2], (WIDTH, WIDTH), jnp.float32) / WIDTH
    precision = half @ half.T + jnp.eye(WIDTH)

    @jax.jit
    def score(x, mu, precision):
        centred = x - mu
        if variant == "fixed":  # EDIT
            return jnp.einsum('ij,ji->i', centred @ precision, centred.T)  # EDIT
        return jnp.diag(centred @ precision @ centred.T)  # as written

    def step(carry):
        return score(x, mu, precision)

    return step, score(x, mu, precision), {"units": EXAMPLES, "unit": "examples"}
