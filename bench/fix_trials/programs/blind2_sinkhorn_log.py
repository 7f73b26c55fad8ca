"""Entropic optimal transport (Sinkhorn iterations) between two point clouds, in raw JAX (float32).

Each step solves one transport problem: the squared-distance cost between 2,048 source and 2,048 target points in 64
dimensions, regularization 0.05, 400 Sinkhorn iterations inside one jitted function; the marginal error of every
iteration goes to the user's convergence log. The step returns the transport plan's scaling vectors and the
transport cost. Variants:
  fixed   the per-iteration errors kept in the loop state and handed to the log once per solve
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (optimal transport solve)"
VARIANTS = ["before", "fixed"]
N, M, DIM, ITERS, EPS = size(2048, 32), size(2048, 48), 64, size(400, 20), 0.05

CONVERGENCE_LOG = []


def log_error(i, err):
    CONVERGENCE_LOG.append((int(i), float(err)))
    del CONVERGENCE_LOG[:-1000]


def log_errors(errs):  # EDIT
    CONVERGENCE_LOG.extend(enumerate(errs.tolist()))  # EDIT
    del CONVERGENCE_LOG[:-1000]  # EDIT


def build(variant):
    kx, ky = jax.random.split(jax.random.key(5))
    xs = jax.random.normal(kx, (N, DIM), jnp.float32)
    ys = jax.random.normal(ky, (M, DIM), jnp.float32) + 0.3
    a = jnp.full((N,), 1.0 / N, jnp.float32)
    b = jnp.full((M,), 1.0 / M, jnp.float32)

    @jax.jit
    def sinkhorn(xs, ys, a, b):
        cost = jnp.sum((xs[:, None, :] - ys[None, :, :]) ** 2, -1)
        cost = cost / jnp.max(cost)
        kern = jnp.exp(-cost / EPS)

        def body(i, state):
            u, v, errs = state
            u = a / (kern @ v)
            kt_u = kern.T @ u
            err = jnp.sum(jnp.abs(v * kt_u - b))
            v = b / kt_u
            if variant == "fixed":  # EDIT
                errs = errs.at[i].set(err)  # EDIT
            else:
                jax.debug.callback(log_error, i, err)
            return u, v, errs

        u, v, errs = jax.lax.fori_loop(0, ITERS, body, (jnp.ones_like(a), jnp.ones_like(b), jnp.zeros(ITERS)))
        if variant == "fixed":  # EDIT
            jax.debug.callback(log_errors, errs)  # EDIT
        plan_cost = jnp.sum(u[:, None] * kern * v[None, :] * cost)
        return u, v, plan_cost

    def step(carry):
        xs, ys, a, b, _ = carry
        return xs, ys, a, b, sinkhorn(xs, ys, a, b)

    init = (jnp.ones((N,)), jnp.ones((M,)), jnp.zeros(()))
    return step, (xs, ys, a, b, init), {"units": 1, "unit": "transport problems"}
