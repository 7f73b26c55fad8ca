"""Defect detection on a factory line: a small ConvNeXt-style network (depthwise 7x7 conv, layer norm, 4x
pointwise expansion with GELU, projection, residual) scores batches of camera tiles; the step returns per-tile
defect logits.

Variants:
  fixed: weights and input tiles are held in bfloat16 (the network runs in bfloat16; the logits come out float32).
  bf16_weights: the weights are held in bfloat16; the input tiles stay float32.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (vision: industrial defect detection)"
VARIANTS = ["before", "fixed", "bf16_weights"]
TRACE_STEPS = 3
RTOL = 5e-2

BATCH = size(128, 2)
HW = size(64, 8)
C = size(128, 8)
BLOCKS = size(6, 2)
CLASSES = 8
PARAM_DTYPE = {"before": jnp.float32, "fixed": jnp.bfloat16, "bf16_weights": jnp.bfloat16}  # EDIT
INPUT_DTYPE = {"before": jnp.float32, "fixed": jnp.bfloat16, "bf16_weights": jnp.float32}  # EDIT


def init(key):
    ks = jax.random.split(key, 3 * BLOCKS + 2)
    p = {"stem": jax.random.normal(ks[0], (4, 4, 3, C)) / np.sqrt(48),
         "head": jax.random.normal(ks[1], (C, CLASSES)) / np.sqrt(C), "blocks": []}
    for i in range(BLOCKS):
        p["blocks"].append({"dw": jax.random.normal(ks[2 + 3 * i], (7, 7, 1, C)) / 7.0,
                            "up": jax.random.normal(ks[3 + 3 * i], (C, 4 * C)) / np.sqrt(C),
                            "down": jax.random.normal(ks[4 + 3 * i], (4 * C, C)) * 0.1 / np.sqrt(4 * C),
                            "g": jnp.ones(C), "b": jnp.zeros(C)})
    return p


def layer_norm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-6) * g + b


def forward(p, x):
    dn = ("NHWC", "HWIO", "NHWC")
    x = jax.lax.conv_general_dilated(x, p["stem"].astype(x.dtype), (4, 4), "VALID",
                                     dimension_numbers=("NCHW", "HWIO", "NHWC"))
    for b in p["blocks"]:
        h = jax.lax.conv_general_dilated(x, b["dw"].astype(x.dtype), (1, 1), "SAME", dimension_numbers=dn,
                                         feature_group_count=C)
        h = layer_norm(h, b["g"], b["b"])
        x = x + jax.nn.gelu(h @ b["up"]) @ b["down"]
    return (x.mean((1, 2)) @ p["head"]).astype(jnp.float32)


def build(variant):
    params = jax.tree.map(lambda a: a.astype(PARAM_DTYPE[variant]), init(jax.random.key(21)))
    tiles = jax.random.uniform(jax.random.key(22), (BATCH, 3, 4 * HW, 4 * HW)).astype(INPUT_DTYPE[variant])

    @jax.jit
    def step(carry):
        x, _ = carry
        return jnp.roll(x, 1, axis=0), forward(params, x)

    return step, (tiles, jnp.zeros((BATCH, CLASSES))), {"units": BATCH, "unit": "tiles"}


def result(carry):
    return carry[1]
