"""Per-patch least-squares fits in raw JAX: for each of 256 image patches, the 64 coefficients of a basis that best
explain its 512 pixels, solved with jnp.linalg.pinv(a) @ b, as NumPy code ported to JAX often reads. The basis has
full column rank, so the SVD inside pinv computes singular values nothing needs.

As its user wrote it: 256 systems of 512 x 64, float32. Variants:
  fixed   q, r = jnp.linalg.qr(a); x = jax.scipy.linalg.solve_triangular(r, q^T b)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (least squares)"
VARIANTS = ["before", "fixed"]
RTOL = 1e-3  # QR and SVD round differently
SYSTEMS, ROWS, COLS = size(256, 4), size(512, 48), size(64, 12)


def build(variant):
    ka, kb = jax.random.split(jax.random.key(2))
    a = jax.random.normal(ka, (SYSTEMS, ROWS, COLS), jnp.float32)
    b = jax.random.normal(kb, (SYSTEMS, ROWS), jnp.float32)

    @jax.jit
    def fit(a, b):
        if variant == "fixed":  # EDIT
            q, r = jnp.linalg.qr(a)  # EDIT
            rhs = jnp.einsum("sji,sj->si", q, b)[..., None]  # EDIT
            return jax.scipy.linalg.solve_triangular(r, rhs)[..., 0]  # EDIT
        return jnp.einsum("sij,sj->si", jnp.linalg.pinv(a), b)  # as written

    def step(carry):
        return fit(a, b + carry[1]), carry[1] + 1e-3

    return step, (jnp.zeros((SYSTEMS, COLS), jnp.float32), jnp.float32(0)), {"units": SYSTEMS, "unit": "systems"}
