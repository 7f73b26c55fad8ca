"""Gaussian-process model selection for a sensor-field regression: score a grid of RBF length-scales by the exact
log marginal likelihood of the observed readings, to pick the kernel before fitting.

Variants:
  fixed: the kernel system is handled through a Cholesky factor (solve and log-determinant from it).
  lu: the kernel system is handled through jnp.linalg.slogdet and jnp.linalg.solve.
"""
import math

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (geostatistics, GP model selection)"
VARIANTS = ["before", "fixed", "lu"]
TRACE_STEPS = 2
RTOL = 2e-3

N = size(1024, 48)        # observed sensor readings
G = size(4, 3)            # length-scales scored per call
NOISE = 0.3               # observation noise variance


def make_data():
    kx, kn = jax.random.split(jax.random.key(0))
    x = jax.random.uniform(kx, (N, 3), minval=-2.0, maxval=2.0)
    y = jnp.sin(2.0 * x[:, 0]) * jnp.cos(x[:, 1]) + 0.3 * x[:, 2] + 0.2 * jax.random.normal(kn, (N,))
    return x, y


def rbf_kernel(x, lengthscale):
    sq = jnp.sum(x * x, axis=1)
    d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    return jnp.exp(-0.5 * d2 / lengthscale ** 2) + NOISE * jnp.eye(x.shape[0])


def log_marginal(x, y, lengthscale, variant):
    k = rbf_kernel(x, lengthscale)
    if variant == "before":
        w, v = jnp.linalg.eigh(k)  # EDIT
        alpha = v @ ((v.T @ y) / w)  # EDIT
        logdet = jnp.sum(jnp.log(w))  # EDIT
    elif variant == "fixed":
        chol = jnp.linalg.cholesky(k)  # EDIT
        alpha = jax.scipy.linalg.cho_solve((chol, True), y)  # EDIT
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))  # EDIT
    else:
        logdet = jnp.linalg.slogdet(k)[1]  # EDIT
        alpha = jnp.linalg.solve(k, y)  # EDIT
    return -0.5 * y @ alpha - 0.5 * logdet - 0.5 * x.shape[0] * math.log(2 * math.pi)


def build(variant):
    x, y = make_data()
    grid = jnp.exp(jnp.linspace(jnp.log(0.2), jnp.log(3.0), G))

    @jax.jit
    def score(carry):
        x, y, _ = carry
        lml = jax.vmap(lambda ls: log_marginal(x, y, ls, variant))(grid)
        return x, y, lml

    return score, (x, y, jnp.zeros((G,))), {"units": G, "unit": "length-scales scored"}


def result(carry):
    return carry[2]
