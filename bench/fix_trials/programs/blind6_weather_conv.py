"""Precipitation nowcasting on a regional lat-lon grid: a small fully-convolutional network maps the last few
radar/temperature/wind fields to the next precipitation field, trained with MSE and hand-written SGD.

Variants:
  fixed: each 3x3 convolution is one jax.lax.conv_general_dilated call.
  shifted_matmuls: each 3x3 convolution is a sum of nine matrix products, one per shifted copy of the padded input.
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (weather, precipitation nowcasting)"
VARIANTS = ["before", "fixed", "shifted_matmuls"]
TRACE_STEPS = 2
RTOL = 2e-3

BATCH = size(8, 2)
H, W = size(128, 12), size(256, 16)
IN_CH = 8
CH = size(64, 8)
LAYERS = 4
LR = 1e-3
DN = ("NHWC", "HWIO", "NHWC")


def conv_patches(x, w):  # EDIT
    p = jax.lax.conv_general_dilated_patches(x, (3, 3), (1, 1), "SAME", dimension_numbers=DN)  # EDIT
    return p @ jnp.transpose(w, (2, 0, 1, 3)).reshape(-1, w.shape[-1])  # EDIT


def conv_lax(x, w):  # EDIT
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DN)  # EDIT


def conv_shifted(x, w):  # EDIT
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))  # EDIT
    return sum(xp[:, i:i + x.shape[1], j:j + x.shape[2]] @ w[i, j] for i in range(3) for j in range(3))  # EDIT


def init_params():
    ks = jax.random.split(jax.random.key(6), LAYERS + 1)
    chans = [IN_CH] + [CH] * LAYERS
    convs = [(jax.random.normal(k, (3, 3, a, b)) * (9 * a) ** -0.5, jnp.zeros((b,)))
             for k, a, b in zip(ks[:-1], chans[:-1], chans[1:])]
    return {"convs": convs, "head": jax.random.normal(ks[-1], (CH, 1)) * CH ** -0.5}


def build(variant):
    conv = {"before": conv_patches, "fixed": conv_lax, "shifted_matmuls": conv_shifted}[variant]  # EDIT
    kx, ky = jax.random.split(jax.random.key(7))
    fields = jax.random.normal(kx, (BATCH, H, W, IN_CH))
    target = jax.nn.relu(jax.random.normal(ky, (BATCH, H, W, 1)))

    def loss_fn(params, x, y):
        for w, b in params["convs"]:
            x = jax.nn.gelu(conv(x, w) + b)
        return jnp.mean((x @ params["head"] - y) ** 2)

    @jax.jit
    def step(carry):
        params, _ = carry
        loss, g = jax.value_and_grad(loss_fn)(params, fields, target)
        return jax.tree.map(lambda p, gi: p - LR * gi, params, g), loss

    return step, (init_params(), jnp.zeros(())), {"units": BATCH, "unit": "samples"}
