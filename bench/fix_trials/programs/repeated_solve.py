"""A Gaussian-process posterior in raw JAX that solves the same kernel system once per right-hand side: a jitted
per-target function, jnp.linalg.solve(K, b), called for each target in a Python loop, so K is LU-factored again on
every call. (The same call mapped inside one jit with jax.lax.map is not this case: XLA hoists the factorisation
out of the loop.)

As its user wrote it: 512 training points (K is 512 x 512, symmetric positive definite), 16 targets, float32.
Variants:
  fixed   K factored once (jax.scipy.linalg.lu_factor) and all 16 right-hand sides solved at once (lu_solve)
  cho     the same with the Cholesky factorisation, K being positive definite (cho_factor / cho_solve)
"""
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from _size import size

FRAMEWORK, PHASE = "jax", "inference (Gaussian process)"
VARIANTS = ["before", "fixed", "cho"]
POINTS, TARGETS, DIM = size(512, 32), size(16, 4), 8


def build(variant):
    k = jax.random.split(jax.random.key(11), 2)
    x = jax.random.normal(k[0], (POINTS, DIM), jnp.float32)
    y = jax.random.normal(k[1], (POINTS, TARGETS), jnp.float32)

    @jax.jit
    def kernel(x, lengthscale):
        d2 = jnp.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)
        return jnp.exp(-0.5 * d2 / lengthscale ** 2) + 0.1 * jnp.eye(POINTS)

    @jax.jit
    def weights_for(kmat, b):  # as written: one target
        return jnp.linalg.solve(kmat, b)

    @jax.jit
    def weights_all(kmat, y):  # EDIT
        if variant == "cho":
            return jsl.cho_solve(jsl.cho_factor(kmat), y)
        return jsl.lu_solve(jsl.lu_factor(kmat), y)

    def step(carry):
        _, lengthscale = carry
        kmat = kernel(x, lengthscale)
        if variant in ("fixed", "cho"):  # EDIT
            return weights_all(kmat, y), lengthscale
        return jnp.stack([weights_for(kmat, y[:, j]) for j in range(TARGETS)], axis=1), lengthscale

    return step, (y, jnp.float32(1.5)), {"units": TARGETS, "unit": "right-hand sides"}
