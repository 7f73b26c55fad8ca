"""A dense-prediction head in raw JAX (a 3x3 convolution, a 1x1 classifier, log-softmax over the classes) run over
a whole feature map, of which the step then keeps one window: the per-pixel class log-probabilities of a region of
interest, cut out with jax.lax.dynamic_slice at an offset given with the batch.

As its user wrote it: batch 32 feature maps of 160 x 160 x 256 (NHWC, bfloat16), a 3x3 convolution 256 -> 256 with
ReLU, a 1x1 convolution to 150 classes, a 40 x 40 window kept (1/16 of the positions). Variants:
  fixed   the window (with the 3x3 convolution's one-pixel border) cut from the features first and the head run on
          it alone (VALID padding), which gives the same values
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (dense prediction, region of interest)"
VARIANTS = ["before", "fixed"]
BATCH, SIDE, CH, CLASSES, WINDOW = size(32, 2), size(160, 32), size(256, 16), size(150, 10), size(40, 8)
DN = ("NHWC", "HWIO", "NHWC")


def head(p, x, padding):
    y = jax.lax.conv_general_dilated(x, p["w1"], (1, 1), padding, dimension_numbers=DN,
                                     preferred_element_type=jnp.float32)
    y = jax.nn.relu(y + p["b1"]).astype(jnp.bfloat16)
    logits = jax.lax.conv_general_dilated(y, p["w2"], (1, 1), "VALID", dimension_numbers=DN,
                                          preferred_element_type=jnp.float32) + p["b2"]
    return jax.nn.log_softmax(logits, axis=-1)


def build(variant):
    ks = jax.random.split(jax.random.key(5), 4)
    p = {"w1": (jax.random.normal(ks[0], (3, 3, CH, CH), jnp.float32) / jnp.sqrt(9 * CH)).astype(jnp.bfloat16),
         "b1": jnp.zeros((CH,), jnp.float32),
         "w2": (jax.random.normal(ks[1], (1, 1, CH, CLASSES), jnp.float32) / jnp.sqrt(CH)).astype(jnp.bfloat16),
         "b2": jnp.zeros((CLASSES,), jnp.float32)}
    feats = jax.random.normal(ks[2], (BATCH, SIDE, SIDE, CH), jnp.bfloat16)
    offset = jnp.array([SIDE // 3, SIDE // 2], jnp.int32)  # the region's top-left corner, inside the map

    @jax.jit
    def region_logprobs(p, feats, offset):
        if variant == "fixed":  # EDIT
            crop = jax.lax.dynamic_slice(feats, (0, offset[0] - 1, offset[1] - 1, 0),  # EDIT
                                         (BATCH, WINDOW + 2, WINDOW + 2, CH))  # EDIT
            return head(p, crop, "VALID")  # EDIT
        logp = head(p, feats, "SAME")
        return jax.lax.dynamic_slice(logp, (0, offset[0], offset[1], 0), (BATCH, WINDOW, WINDOW, CLASSES))

    def step(carry):
        return region_logprobs(p, feats, offset)

    return step, region_logprobs(p, feats, offset), {"units": BATCH, "unit": "images"}
