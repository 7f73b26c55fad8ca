"""A gravitational N-body simulation in raw JAX: velocity-Verlet integration with softened all-pairs forces.

Positions and velocities are stored coordinate-major, shape (3, N). The force and the Verlet update are one jitted
function; a step of the program advances the system by one output interval (500 integration sub-steps) and then
records the total energy. As its user wrote it: 512 bodies in 3D, float32, dt = 1e-3. Variants:
  fixed   the sub-step loop moved inside one jitted function (jax.lax.fori_loop)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "simulation"
VARIANTS = ["before", "fixed"]
N, SUBSTEPS, DT, EPS = size(512, 64), size(500, 10), 1e-3, 1e-2


def accelerations(pos, mass):
    d = pos[:, None, :] - pos[:, :, None]  # (3, i, j): from body i to body j
    r2 = jnp.sum(d * d, axis=0) + EPS * EPS
    inv_r3 = r2 ** -1.5
    return jnp.sum(d * (mass[None, :] * inv_r3)[None], axis=-1)


@jax.jit
def verlet(pos, vel, acc, mass):
    vel = vel + 0.5 * DT * acc
    pos = pos + DT * vel
    acc = accelerations(pos, mass)
    vel = vel + 0.5 * DT * acc
    return pos, vel, acc


@jax.jit
def energy(pos, vel, mass):
    d = pos[:, None, :] - pos[:, :, None]
    r = jnp.sqrt(jnp.sum(d * d, axis=0) + EPS * EPS)
    pot = -jnp.sum(jnp.triu(mass[:, None] * mass[None, :] / r, 1))
    return 0.5 * jnp.sum(mass[None, :] * vel * vel) + pot


@jax.jit  # EDIT
def advance(pos, vel, acc, mass):  # EDIT
    return jax.lax.fori_loop(0, SUBSTEPS, lambda _, s: verlet(*s, mass), (pos, vel, acc))  # EDIT


def build(variant):
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    pos = jax.random.normal(k1, (3, N), jnp.float32)
    vel = 0.1 * jax.random.normal(k2, (3, N), jnp.float32)
    mass = jax.random.uniform(k3, (N,), jnp.float32, 0.5, 1.5) / N
    acc = accelerations(pos, mass)

    def step(carry):
        pos, vel, acc, _ = carry
        if variant == "fixed":  # EDIT
            pos, vel, acc = advance(pos, vel, acc, mass)  # EDIT
        else:
            for _ in range(SUBSTEPS):
                pos, vel, acc = verlet(pos, vel, acc, mass)
        return pos, vel, acc, energy(pos, vel, mass)

    return step, (pos, vel, acc, jnp.zeros((), jnp.float32)), {"units": SUBSTEPS, "unit": "integration steps"}
