"""Fitting the hyperparameters of a Gaussian-process regressor in raw JAX: the negative log marginal likelihood of
an RBF-kernel GP with a noise term, minimised by gradient descent on the log length-scale, signal and noise.

As its user wrote it: 2,048 training points in 8 dimensions, float32; the likelihood is the textbook
0.5 y^T K^-1 y + 0.5 log|K| + const, with the inverse and the log-determinant from jnp.linalg. Variants:
  fixed   one Cholesky factorisation of K, used for both the solve and the log-determinant
"""
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from _size import size

FRAMEWORK, PHASE = "jax", "training (GP hyperparameters)"
VARIANTS = ["before", "fixed"]
N, DIMS, LR = size(2048, 64), 8, 1e-3


def build(variant):
    k1, k2 = jax.random.split(jax.random.key(9))
    x = jax.random.uniform(k1, (N, DIMS), jnp.float32, -2.0, 2.0)
    y = jnp.sin(x.sum(-1)) + 0.1 * jax.random.normal(k2, (N,), jnp.float32)

    def kernel(log_params):
        ell, sig, noise = jnp.exp(log_params)
        d2 = jnp.sum((x[:, None, :] - x[None, :, :]) ** 2, axis=-1)
        return sig ** 2 * jnp.exp(-0.5 * d2 / ell ** 2) + (noise ** 2 + 1e-4) * jnp.eye(N)

    def nll(log_params):
        K = kernel(log_params)
        if variant == "fixed":  # EDIT
            L = jnp.linalg.cholesky(K)  # EDIT
            alpha = jsl.cho_solve((L, True), y)  # EDIT
            logdet = 2.0 * jnp.sum(jnp.log(jnp.diag(L)))  # EDIT
        else:
            alpha = jnp.linalg.inv(K) @ y
            _, logdet = jnp.linalg.slogdet(K)
        return 0.5 * y @ alpha + 0.5 * logdet + 0.5 * N * jnp.log(2 * jnp.pi)

    @jax.jit
    def train_step(log_params):
        loss, g = jax.value_and_grad(nll)(log_params)
        return log_params - LR * g, loss

    def step(carry):
        return train_step(carry[0])

    return step, (jnp.log(jnp.array([1.0, 1.0, 0.3], jnp.float32)), jnp.zeros((), jnp.float32)), \
        {"units": N, "unit": "training points"}
