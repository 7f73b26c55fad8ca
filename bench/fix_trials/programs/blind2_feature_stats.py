"""Feature standardization for a linear-probe pipeline, in raw JAX (float32).

Each step takes a block of embedding vectors (one row per sample), computes the per-feature mean and sample standard
deviation over the block, and returns the standardized features together with the statistics (the caller keeps them
to standardize its evaluation set the same way). As its user wrote it: blocks of 32,768 samples of 4,096 features.
Variants:
  fixed   the per-feature spread computed directly along the sample axis
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "preprocessing (feature statistics)"
VARIANTS = ["before", "fixed"]
N, F = size(32768, 256), size(4096, 64)


def build(variant):
    kx, ks = jax.random.split(jax.random.key(3))
    scale = jnp.exp(jax.random.normal(ks, (F,), jnp.float32))
    feats = jax.random.normal(kx, (N, F), jnp.float32) * scale + 0.5

    @jax.jit
    def standardize(x):
        mean = jnp.mean(x, axis=0)
        if variant == "fixed":  # EDIT
            std = jnp.std(x, axis=0, ddof=1)  # EDIT
        else:
            std = jnp.sqrt(jnp.diag(jnp.cov(x, rowvar=False)))
        z = (x - mean) / (std + 1e-6)
        return z, mean, std

    def step(carry):
        x, _ = carry
        return x, standardize(x)

    out = (jnp.zeros((N, F), jnp.float32), jnp.zeros((F,), jnp.float32), jnp.zeros((F,), jnp.float32))
    return step, (feats, out), {"units": N, "unit": "samples"}
