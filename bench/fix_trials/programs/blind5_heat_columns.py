"""Vertical heat diffusion in an ocean-column model (Crank-Nicolson), in raw JAX (float32).

Each of 1,024 water columns has 512 levels; the vertical diffusivity follows a mixed layer whose depth swings over
the day (strong mixing inside it, weak below the thermocline). The surface level is forced by a daily heating cycle
and the bottom level is insulated. Every time step rebuilds the Crank-Nicolson system for the current mixed-layer
depth and solves it for all columns at once. One step advances the columns by 4 time steps of 10 minutes; it
returns the temperature field and the model time. Variants:
  fixed      each time step's implicit system solved with the tridiagonal solver from its three diagonals
  cholesky   the implicit matrix (symmetric positive definite) solved by a Cholesky factorisation
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "simulation (science, ocean column model)"
VARIANTS = ["before", "fixed", "cholesky"]
TRACE_STEPS = 1
COLUMNS, LEVELS, SUBSTEPS = size(1024, 6), size(512, 32), size(4, 3)
DT, DZ, DAY = 600.0, 2.0, 86400.0


def diagonals(time):
    """Diagonals (sub, main, super) of the diffusion operator at this time, insulating top and bottom."""
    mixed_layer = 40.0 + 25.0 * jnp.sin(2 * np.pi * time / DAY)
    faces = jnp.arange(LEVELS + 1, dtype=jnp.float32) * DZ
    kappa = 1e-5 + 1e-2 * jnp.exp(-faces / mixed_layer)
    kappa = kappa.at[0].set(0.0).at[-1].set(0.0)
    lower, upper = kappa[:-1] / DZ ** 2, kappa[1:] / DZ ** 2
    return lower, -(lower + upper), upper


def build(variant):
    phase = jnp.linspace(0.0, 2 * np.pi, COLUMNS, endpoint=False)

    def implicit_solve(dl, d, du, rhs):
        if variant == "fixed":  # EDIT
            return jax.lax.linalg.tridiagonal_solve(dl, d, du, rhs)  # EDIT
        A = jnp.diag(d) + jnp.diag(dl[1:], -1) + jnp.diag(du[:-1], 1)
        if variant == "cholesky":  # EDIT
            return jax.scipy.linalg.solve(A, rhs, assume_a="pos")  # EDIT
        return jnp.linalg.solve(A, rhs)

    @jax.jit
    def advance(temp, time):
        def one(i, state):
            temp, time = state
            lo, mid, up = diagonals(time)
            a_dl, a_d, a_du = (-0.5 * DT * lo).at[0].set(0.0), 1.0 - 0.5 * DT * mid, (-0.5 * DT * up).at[-1].set(0.0)
            below = jnp.concatenate([temp[1:], temp[-1:]], axis=0)
            above = jnp.concatenate([temp[:1], temp[:-1]], axis=0)
            rhs = (2.0 - a_d)[:, None] * temp - a_dl[:, None] * above - a_du[:, None] * below
            heating = 2e-4 * DT * (1.0 + jnp.sin(2 * np.pi * time / DAY + phase))
            rhs = rhs.at[0].add(heating)
            return implicit_solve(a_dl, a_d, a_du, rhs), time + DT
        return jax.lax.fori_loop(0, SUBSTEPS, one, (temp, time))

    depth = jnp.arange(LEVELS, dtype=jnp.float32)[:, None] * DZ
    temp0 = 4.0 + 14.0 * jnp.exp(-depth / 150.0) + 0.1 * jnp.cos(phase)[None, :]

    def step(carry):
        return advance(*carry)

    return step, (temp0, jnp.zeros((), jnp.float32)), {"units": COLUMNS * SUBSTEPS, "unit": "column-steps"}
