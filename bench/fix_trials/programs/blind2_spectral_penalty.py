"""Spectral normalization of a discriminator's dense layers (GAN training helper), in raw JAX (float32).

Each step takes the discriminator's weight matrices, computes each one's spectral norm (largest singular value),
returns the weights divided by it and the Lipschitz bound (the product of the norms) that the training loop logs.
As its user wrote it: 4 layers of 1,024 x 1,024. Variants:
  fixed   the largest singular value found by power iteration (40 matrix-vector rounds)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (weight normalization)"
VARIANTS = ["before", "fixed"]
LAYERS, D = 4, size(1024, 64)


def top_singular_value(w, iters=40):  # EDIT
    v = jnp.ones((w.shape[1],), w.dtype) / jnp.sqrt(w.shape[1])  # EDIT

    def body(_, v):  # EDIT
        v = w.T @ (w @ v)  # EDIT
        return v / jnp.linalg.norm(v)  # EDIT

    v = jax.lax.fori_loop(0, iters, body, v)  # EDIT
    return jnp.linalg.norm(w @ v)  # EDIT


def build(variant):
    ks = jax.random.split(jax.random.key(7), 3 * LAYERS)
    weights = []
    for i in range(LAYERS):
        bulk = jax.random.normal(ks[3 * i], (D, D), jnp.float32) / jnp.sqrt(D)
        u = jax.random.normal(ks[3 * i + 1], (D,), jnp.float32)
        v = jax.random.normal(ks[3 * i + 2], (D,), jnp.float32)
        spike = (3.0 + 0.5 * i) * jnp.outer(u / jnp.linalg.norm(u), v / jnp.linalg.norm(v))
        weights.append(bulk + spike)

    @jax.jit
    def spectral_normalize(weights):
        out, bound = [], 1.0
        for w in weights:
            if variant == "fixed":  # EDIT
                sigma = top_singular_value(w)  # EDIT
            else:
                sigma = jnp.linalg.norm(w, 2)
            out.append(w / sigma)
            bound = bound * sigma
        return out, bound

    def step(carry):
        weights, _ = carry
        return weights, spectral_normalize(weights)

    return step, (weights, ([jnp.zeros_like(w) for w in weights], jnp.zeros(()))), {"units": LAYERS,
                                                                                    "unit": "layers"}
