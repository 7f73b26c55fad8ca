"""Ensemble forecast of a tracer on a doubly periodic 2-D grid: advection-diffusion with explicit Euler steps.

The spatial operator is assembled once from 1-D finite-difference matrices (central advection, second-difference
diffusion) for x and y. Each step advances every ensemble member by SUBSTEPS time steps inside one jitted function
and perturbs the members with a little noise.

Variants:
  fixed: the operator is applied as the two 1-D matrices along each grid axis.
  stencil: the operator is applied as a five-point stencil with jnp.roll.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference / simulation (weather, ensemble tracer transport)"
VARIANTS = ["before", "fixed", "stencil"]
TRACE_STEPS = 3

NY, NX = size(64, 8), size(64, 12)
MEMBERS = size(32, 3)
SUBSTEPS = size(100, 4)
NU, UX, UY, DT = 1.0, 0.6, -0.3, 0.1


def periodic_1d(n, u):
    """Advection-diffusion operator along one periodic axis (grid spacing 1)."""
    eye = np.eye(n)
    up, down = np.roll(eye, 1, axis=1), np.roll(eye, -1, axis=1)  # up @ f = f[i+1], down @ f = f[i-1]
    return NU * (up - 2 * eye + down) - u * 0.5 * (up - down)


def build(variant):
    lx, ly = periodic_1d(NX, UX), periodic_1d(NY, UY)
    if variant == "before":  # EDIT
        ops = jnp.asarray(np.kron(np.eye(NY), lx) + np.kron(ly, np.eye(NX)), jnp.float32)  # EDIT
        tendency = lambda op, f: (f.reshape(MEMBERS, NY * NX) @ op.T).reshape(f.shape)  # EDIT
    elif variant == "fixed":  # EDIT
        ops = (jnp.asarray(lx, jnp.float32), jnp.asarray(ly, jnp.float32))  # EDIT
        tendency = lambda op, f: f @ op[0].T + jnp.einsum("yz,bzx->byx", op[1], f)  # EDIT
    else:  # EDIT
        ops = ()  # EDIT

        def tendency(_, f):  # EDIT
            xp, xm = jnp.roll(f, -1, 2), jnp.roll(f, 1, 2)  # EDIT
            yp, ym = jnp.roll(f, -1, 1), jnp.roll(f, 1, 1)  # EDIT
            return NU * (xp + xm + yp + ym - 4 * f) - 0.5 * UX * (xp - xm) - 0.5 * UY * (yp - ym)  # EDIT

    y, x = np.meshgrid(np.arange(NY), np.arange(NX), indexing="ij")
    blob = np.exp(-((x - NX / 3) ** 2 + (y - NY / 2) ** 2) / (0.02 * NX * NY))
    rng = np.random.default_rng(0)
    field0 = jnp.asarray(blob[None] * (1 + 0.1 * rng.standard_normal((MEMBERS, 1, 1))), jnp.float32)

    @jax.jit
    def advance(ops, field, key):
        key, kn = jax.random.split(key)
        field = jax.lax.fori_loop(0, SUBSTEPS, lambda _, f: f + DT * tendency(ops, f), field)
        return field + 1e-3 * jax.random.normal(kn, field.shape), key

    def step(carry):
        return advance(ops, *carry)

    return step, (field0, jax.random.key(2)), {"units": MEMBERS * SUBSTEPS, "unit": "member time steps"}


def result(carry):
    return carry[0]
