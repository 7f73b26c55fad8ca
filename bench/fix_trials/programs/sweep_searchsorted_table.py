"""A premise measured, not a trial: jnp.searchsorted's three methods (scan, the default; compare_all; sort) over
sorted tables of several lengths, 16 features of 16,384 values each, one table per feature (vmapped). Variants
<method>_<length> for lengths 255, 1024 and 4096; the step returns the bucket ids' sum per feature."""
import functools

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "premise sweep (searchsorted methods by table length)"
LENGTHS = (255, 1024, 4096)
VARIANTS = [f"{m}_{n}" for n in LENGTHS for m in ("scan", "compare_all", "sort")]
ROWS, FEATURES = size(16384, 64), size(16, 2)


def build(variant):
    method, length = variant.rsplit("_", 1)
    length = int(length) if not size(False, True) else 31
    kb, kx = jax.random.split(jax.random.key(0))
    bounds = jnp.sort(jax.random.normal(kb, (FEATURES, length), jnp.float32), axis=-1)
    x = jax.random.normal(kx, (ROWS, FEATURES), jnp.float32)
    search = functools.partial(jnp.searchsorted, side="right", method=method)
    fn = jax.jit(lambda b, x: jax.vmap(search, in_axes=(0, 1), out_axes=1)(b, x).sum(axis=0))

    def step(carry):
        b, x, _ = carry
        return b, x, fn(b, x)

    return step, (bounds, x, jnp.zeros((FEATURES,), jnp.int32)), {"units": ROWS * FEATURES, "unit": "values"}
