"""An implicit heat-diffusion simulation in raw JAX: each time step solves for the new field with Jacobi
iterations, each iteration a small jitted function called from a Python loop, and the residual read back with
float() after every iteration to test convergence.

As its user wrote it: a 512 x 512 float32 grid, at most 50 Jacobi iterations per time step, tolerance 1e-6 (not
reached in 50, so every time step runs all 50). Each iteration is ~1 MiB of stencil work, so a time step is 50
dispatches and 50 device-to-host reads. Variants:
  fixed   the iterations in jax.lax.while_loop inside one jitted function (same test, same cap), the residual
          read once per time step
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "simulation"
VARIANTS = ["before", "fixed"]
N, ITERS, TOL, ALPHA = size(512, 32), 50, 1e-6, 0.2


def jacobi(u, rhs):
    nb = (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1))
    new = (rhs + ALPHA * nb) / (1 + 4 * ALPHA)
    return new, jnp.max(jnp.abs(new - u))


def build(variant):
    u0 = jax.random.uniform(jax.random.key(5), (N, N), jnp.float32)
    jacobi_step = jax.jit(jacobi)

    @jax.jit
    def solve(u, rhs):  # the fixed variant's loop, on the device
        def cond(c):
            return (c[2] < ITERS) & (c[1] > TOL)

        def body(c):
            u, _, i = c
            u, res = jacobi(u, rhs)
            return u, res, i + 1

        return jax.lax.while_loop(cond, body, (u, jnp.inf, 0))

    def step(carry):
        rhs, _ = carry
        if variant == "fixed":  # EDIT
            u, res, _ = solve(rhs, rhs)
            return u, float(res)
        u = rhs
        for _ in range(ITERS):  # as written
            u, res = jacobi_step(u, rhs)
            if float(res) < TOL:
                break
        return u, float(res)

    return step, (u0, 0.0), {"units": 1, "unit": "time steps"}
