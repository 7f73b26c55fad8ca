"""Quantum dynamics of a disordered chain with long-range hopping, in raw JAX (complex64).

The Hamiltonian H is real symmetric and dense: 4,096 sites on a ring, hopping 1/r^1.5 between every pair of sites
and random on-site energies. A block of 1,024 random-phase states (for the stochastic local density of states) is
propagated by psi <- exp(-i H dt) psi, each time step a 6th-order Taylor series of the propagator applied to the
block; each step advances 4 time steps of dt = 0.02 and returns the states and their mean site density. Variants:
  fixed     the propagator's generator kept real: H times the real and imaginary parts, recombined
  stacked   the same, as one real matmul of H with the real and imaginary parts side by side
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "scientific (quantum dynamics)"
VARIANTS = ["before", "fixed", "stacked"]
SITES, STATES, SUBSTEPS, ORDER, DT = size(4096, 64), size(1024, 8), size(4, 2), 6, 0.02


def hamiltonian():
    i = np.arange(SITES)
    r = np.abs(i[:, None] - i[None, :])
    r = np.minimum(r, SITES - r).astype(np.float64)
    hop = np.where(r > 0, 1.0 / np.maximum(r, 1.0) ** 1.5, 0.0)
    onsite = np.random.default_rng(1).uniform(-1.0, 1.0, SITES)
    return (-hop + np.diag(onsite)).astype(np.float32)


def build(variant):
    ham = jnp.asarray(hamiltonian())
    phases = jax.random.uniform(jax.random.key(4), (SITES, STATES), jnp.float32, 0, 2 * np.pi)
    psi = (jnp.exp(1j * phases) / np.sqrt(SITES)).astype(jnp.complex64)
    if variant in ("fixed", "stacked"):  # EDIT
        gen = DT * ham  # EDIT
    else:
        gen = (-1j * DT * ham).astype(jnp.complex64)

    def apply_gen(gen, v):
        if variant == "fixed":  # EDIT
            return jax.lax.complex(gen @ v.imag, -(gen @ v.real))  # EDIT
        if variant == "stacked":  # EDIT
            both = gen @ jnp.concatenate([v.real, v.imag], axis=1)  # EDIT
            return jax.lax.complex(both[:, v.shape[1]:], -both[:, :v.shape[1]])  # EDIT
        return gen @ v

    @jax.jit
    def propagate(gen, psi):
        for _ in range(SUBSTEPS):
            term, acc = psi, psi
            for k in range(1, ORDER + 1):
                term = apply_gen(gen, term) / k
                acc = acc + term
            psi = acc
        return psi, jnp.mean(jnp.abs(psi) ** 2, axis=1)

    def step(carry):
        psi, _ = carry
        return propagate(gen, psi)

    return step, (psi, jnp.zeros((SITES,), jnp.float32)), {"units": STATES * SUBSTEPS, "unit": "state-steps"}
