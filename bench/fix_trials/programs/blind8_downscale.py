"""Statistical downscaling of weather fields: coarse reanalysis fields (1 degree) are interpolated bilinearly onto
the 0.25 degree grid and a small convolutional network learns the residual to high-resolution targets; trained
with SGD on the mean squared error.

Variants:
  fixed: the bilinear interpolation is done as two small interpolation-matrix contractions (rows, then columns).
  image_resize: the interpolation is done with jax.image.resize (method "linear").
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.ndimage import map_coordinates

from _size import size

FRAMEWORK, PHASE = "jax", "training (weather downscaling)"
VARIANTS = ["before", "fixed", "image_resize"]
TRACE_STEPS = 2

BATCH = size(4, 2)
CH = size(8, 2)
HC, WC = size(180, 12), size(360, 24)
UP = 4
HF, WF = HC * UP, WC * UP
MID = size(32, 4)
LR = 1e-2


def src_coords(n_out, n_in):
    return (np.arange(n_out) + 0.5) * n_in / n_out - 0.5


def interp_matrix(n_out, n_in):
    """Linear interpolation weights (n_out, n_in), coordinates clamped to the edge samples."""
    c = np.clip(src_coords(n_out, n_in), 0, n_in - 1)
    lo = np.floor(c).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    w = c - lo
    m = np.zeros((n_out, n_in), np.float32)
    m[np.arange(n_out), lo] += 1 - w
    m[np.arange(n_out), hi] += w
    return jnp.asarray(m)


def upsample(x, variant):
    """(B, C, HC, WC) -> (B, C, HF, WF) bilinear."""
    if variant == "before":  # EDIT
        yy, xx = np.meshgrid(src_coords(HF, HC), src_coords(WF, WC), indexing="ij")  # EDIT
        coords = [jnp.asarray(yy, jnp.float32), jnp.asarray(xx, jnp.float32)]  # EDIT
        one = lambda f: map_coordinates(f, coords, order=1, mode="nearest")  # EDIT
        return jax.vmap(jax.vmap(one))(x)  # EDIT
    if variant == "image_resize":  # EDIT
        return jax.image.resize(x, (BATCH, CH, HF, WF), method="linear")  # EDIT
    return jnp.einsum("hi,bcij,wj->bchw", interp_matrix(HF, HC), x, interp_matrix(WF, WC))  # EDIT


def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")


def model(p, coarse, variant):
    up = upsample(coarse, variant)
    h = jax.nn.gelu(conv(up, p["w1"]) + p["b1"][:, None, None])
    return up + conv(h, p["w2"])


def build(variant):
    k = jax.random.split(jax.random.key(11), 4)
    p = {"w1": jax.random.normal(k[0], (MID, CH, 3, 3)) / np.sqrt(9 * CH), "b1": jnp.zeros(MID),
         "w2": jax.random.normal(k[1], (CH, MID, 3, 3)) * 0.1 / np.sqrt(9 * MID)}
    coarse = jax.random.normal(k[2], (BATCH, CH, HC, WC))
    fine = jax.random.normal(k[3], (BATCH, CH, HF, WF)) * 0.3 + jnp.repeat(jnp.repeat(coarse, UP, 2), UP, 3)

    @jax.jit
    def step(carry):
        p, coarse = carry
        loss_fn = lambda p: jnp.mean((model(p, coarse, variant) - fine) ** 2)
        g = jax.grad(loss_fn)(p)
        return jax.tree.map(lambda a, b: a - LR * b, p, g), jnp.roll(coarse, 1, axis=3)

    return step, (p, coarse), {"units": BATCH, "unit": "samples"}


def result(carry):
    return carry[0]
