"""Charged-particle tracking in a magnetic-mirror trap: a million test ions are pushed with the Boris scheme through
an analytic mirror field plus a radial electric field; one call advances the ensemble by 16 substeps.

Variants:
  fixed: positions and velocities are kept as (3, N) arrays, one row per component.
  components: positions and velocities are kept as three separate (N,) arrays per quantity.
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "simulation (plasma physics, particle pusher)"
VARIANTS = ["before", "fixed", "components"]
TRACE_STEPS = 3
RTOL = 2e-3

N = size(1 << 20, 256)
SUBSTEPS = 16
DT = 2e-3
QM = 1.0                 # charge / mass
B0, MIRROR, E0 = 5.0, 0.4, 0.5


def fields(x, y, z):
    """Mirror field B = B0 (1 + k z^2) z_hat - B0 k z (x, y) and a radial electric field, per component."""
    bz = B0 * (1.0 + MIRROR * z * z)
    bx, by = -B0 * MIRROR * z * x, -B0 * MIRROR * z * y
    ex, ey, ez = E0 * x, E0 * y, jnp.zeros_like(z)
    return (bx, by, bz), (ex, ey, ez)


def boris(x, v, axis):
    """One Boris step for stacked components along `axis` (x, v: (N, 3) with axis=1 or (3, N) with axis=0)."""
    comp = lambda a: [jnp.take(a, i, axis=axis) for i in range(3)]  # noqa: E731
    b, e = fields(*comp(x))
    b, e = jnp.stack(b, axis=axis), jnp.stack(e, axis=axis)
    v_minus = v + 0.5 * QM * DT * e
    t = 0.5 * QM * DT * b
    s = 2.0 * t / (1.0 + jnp.sum(t * t, axis=axis, keepdims=True))
    v_prime = v_minus + jnp.cross(v_minus, t, axis=axis)
    v_new = v_minus + jnp.cross(v_prime, s, axis=axis) + 0.5 * QM * DT * e
    return x + DT * v_new, v_new


def cross3(a, b):  # EDIT
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])  # EDIT


def boris_components(x, v):  # EDIT
    b, e = fields(*x)  # EDIT
    v_minus = tuple(vi + 0.5 * QM * DT * ei for vi, ei in zip(v, e))  # EDIT
    t = tuple(0.5 * QM * DT * bi for bi in b)  # EDIT
    f = 2.0 / (1.0 + sum(ti * ti for ti in t))  # EDIT
    s = tuple(f * ti for ti in t)  # EDIT
    v_prime = tuple(a + c for a, c in zip(v_minus, cross3(v_minus, t)))  # EDIT
    v_new = tuple(a + c + 0.5 * QM * DT * ei for a, c, ei in zip(v_minus, cross3(v_prime, s), e))  # EDIT
    return tuple(xi + DT * vi for xi, vi in zip(x, v_new)), v_new  # EDIT


def initial_state():
    kx, kv = jax.random.split(jax.random.key(11))
    x = jax.random.normal(kx, (N, 3)) * jnp.array([0.5, 0.5, 1.0])
    v = jax.random.normal(kv, (N, 3))
    return x, v


def build(variant):
    x, v = initial_state()
    if variant == "fixed":
        x, v = x.T, v.T  # EDIT
    elif variant == "components":
        x, v = tuple(x.T), tuple(v.T)  # EDIT

    @jax.jit
    def step(carry):
        def body(_, xv):
            if variant == "before":
                return boris(*xv, axis=1)  # EDIT
            if variant == "fixed":
                return boris(*xv, axis=0)  # EDIT
            return boris_components(*xv)  # EDIT
        return jax.lax.fori_loop(0, SUBSTEPS, body, carry)

    return step, (x, v), {"units": N * SUBSTEPS, "unit": "particle pushes"}


def result(carry):
    x, v = carry
    if isinstance(x, tuple):  # EDIT
        return jnp.stack(x, 1), jnp.stack(v, 1)  # EDIT
    if x.shape[0] == 3:  # EDIT
        return x.T, v.T  # EDIT
    return x, v
