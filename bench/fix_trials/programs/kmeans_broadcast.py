"""A k-means step in raw JAX whose distances are built by broadcasting: ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
forms every point-centroid difference, n·k·d values on the vector units, before the sum over d keeps n·k of them.

As its user wrote it: 8,192 points of width 128, 1,024 centroids, float32; each step assigns every point to its
nearest centroid and moves the centroids to their points' means. Variants:
  fixed   the squared distances as |x|² + |c|² - 2 x @ c.T: one matmul
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (clustering)"
VARIANTS = ["before", "fixed"]
POINTS, WIDTH, CENTROIDS = size(8192, 512), size(128, 16), size(1024, 32)


def build(variant):
    k = jax.random.split(jax.random.key(2), 2)
    points = jax.random.normal(k[0], (POINTS, WIDTH), jnp.float32)
    centroids = jax.random.normal(k[1], (CENTROIDS, WIDTH), jnp.float32)

    @jax.jit
    def kmeans_step(x, c):
        if variant == "fixed":  # EDIT
            d2 = (x ** 2).sum(-1)[:, None] + (c ** 2).sum(-1)[None, :] - 2 * x @ c.T  # EDIT
        else:
            d2 = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)  # as written
        nearest = jnp.argmin(d2, axis=1)
        sums = jax.ops.segment_sum(x, nearest, num_segments=CENTROIDS)
        counts = jax.ops.segment_sum(jnp.ones((x.shape[0],)), nearest, num_segments=CENTROIDS)
        return jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts[:, None], 1.0), c)

    def step(c):
        return kmeans_step(points, c)

    return step, centroids, {"units": POINTS, "unit": "points"}
