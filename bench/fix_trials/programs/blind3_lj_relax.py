"""Structure relaxation of a Lennard-Jones cluster by nonlinear conjugate gradients, in raw JAX (float32).

The cluster has 256 atoms (a jittered cubic lattice). Each step is one Polak-Ribiere CG iteration: the energy's
gradient, the new search direction, and an exact quadratic step length along it, -g.d / (d' H d), from the energy's
curvature along the direction (the step is capped at 0.05 length units per atom). The step returns the new positions,
direction and gradient, and the energy. Variants:
  fixed   the curvature along the direction taken as one Hessian-vector product instead of from the full Hessian
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "scientific (energy minimization)"
VARIANTS = ["before", "fixed"]
ATOMS = size(256, 16)
SIGMA, EPSILON, MAX_MOVE = 1.0, 1.0, 0.05


def energy(x):
    n = x.shape[0]
    diff = x[:, None, :] - x[None, :, :]
    eye = jnp.eye(n, dtype=bool)
    r2 = jnp.sum(diff * diff, axis=-1) + eye  # 1 on the diagonal, masked out below
    inv6 = (SIGMA * SIGMA / r2) ** 3
    pair = 4.0 * EPSILON * (inv6 * inv6 - inv6)
    return 0.5 * jnp.sum(jnp.where(eye, 0.0, pair))


def lattice():
    side = int(np.ceil(ATOMS ** (1 / 3)))
    g = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:ATOMS]
    jitter = np.random.default_rng(0).normal(0, 0.05, g.shape)
    return jnp.asarray(g * 1.12 + jitter, jnp.float32)


def build(variant):
    x0 = lattice()
    grad_e = jax.grad(energy)

    @jax.jit
    def cg_step(x, d_prev, g_prev):
        g = grad_e(x)
        beta = jnp.maximum(0.0, jnp.vdot(g, g - g_prev) / jnp.maximum(jnp.vdot(g_prev, g_prev), 1e-12))
        d = -g + beta * d_prev
        if variant == "fixed":  # EDIT
            curv = jnp.vdot(d, jax.jvp(grad_e, (x,), (d,))[1])  # EDIT
        else:
            hess = jax.hessian(energy)(x).reshape(3 * ATOMS, 3 * ATOMS)
            curv = d.reshape(-1) @ hess @ d.reshape(-1)
        alpha = jnp.where(curv > 0, -jnp.vdot(g, d) / curv, 1e-3)
        alpha = jnp.minimum(alpha, MAX_MOVE / (jnp.max(jnp.abs(d)) + 1e-12))
        x = x + alpha * d
        return x, d, g, energy(x)

    def step(carry):
        x, d, g, _ = carry
        return cg_step(x, d, g)

    zeros = jnp.zeros_like(x0)
    return step, (x0, zeros, jnp.ones_like(x0), energy(x0)), {"units": 1, "unit": "CG iterations"}
