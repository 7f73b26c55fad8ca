"""Molecular dynamics of a Lennard-Jones argon cluster: velocity-Verlet integration with forces from the pair energy.

Positions are kept as (3, N) coordinate rows. Each step advances the cluster by SUBSTEPS Verlet substeps inside one
jitted function and records the potential energy of the last substep.

Variants:
  fixed: forces and energy come from jax.value_and_grad of the energy.
  jacrev: forces come from jax.jacrev of the energy; the energy is evaluated separately.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference / simulation (chemistry, molecular dynamics)"
VARIANTS = ["before", "fixed", "jacrev"]
TRACE_STEPS = 2

N_ATOMS = size(256, 27)
SUBSTEPS = size(8, 2)
DT = 1e-3
EPS, SIGMA = 1.0, 1.0


def pair_energy(pos):
    """Total Lennard-Jones energy of the cluster; pos is (3, N)."""
    d = pos[:, :, None] - pos[:, None, :]  # (3, N, N)
    r2 = jnp.sum(d * d, axis=0)
    off = ~jnp.eye(pos.shape[1], dtype=bool)
    inv6 = jnp.where(off, (SIGMA * SIGMA / jnp.where(off, r2, 1.0)) ** 3, 0.0)
    return 0.5 * jnp.sum(4.0 * EPS * (inv6 * inv6 - inv6))


def energy_and_forces(variant, pos):
    if variant == "before":  # EDIT
        forces = -jax.jacfwd(pair_energy)(pos)  # EDIT
        energy = pair_energy(pos)  # EDIT
    elif variant == "fixed":  # EDIT
        energy, grad = jax.value_and_grad(pair_energy)(pos)  # EDIT
        forces = -grad  # EDIT
    else:  # EDIT
        forces = -jax.jacrev(pair_energy)(pos)  # EDIT
        energy = pair_energy(pos)  # EDIT
    return energy, forces


def build(variant):
    side = round(N_ATOMS ** (1 / 3)) + 1
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), 0).reshape(3, -1)[:, :N_ATOMS]
    rng = np.random.default_rng(0)
    pos0 = jnp.asarray(1.15 * grid + 0.02 * rng.standard_normal(grid.shape), jnp.float32)
    vel0 = jnp.asarray(0.05 * rng.standard_normal(grid.shape), jnp.float32)
    _, f0 = energy_and_forces("fixed", pos0)

    @jax.jit
    def step(carry):
        pos, vel, force, _ = carry

        def substep(_, s):
            pos, vel, force, _ = s
            vel_half = vel + 0.5 * DT * force
            pos = pos + DT * vel_half
            energy, force = energy_and_forces(variant, pos)
            vel = vel_half + 0.5 * DT * force
            return pos, vel, force, energy

        return jax.lax.fori_loop(0, SUBSTEPS, substep, (pos, vel, force, jnp.float32(0.0)))

    carry0 = (pos0, vel0, f0, jnp.float32(0.0))
    return step, carry0, {"units": SUBSTEPS, "unit": "MD substeps"}
