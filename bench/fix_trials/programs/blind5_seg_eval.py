"""Evaluation of a semantic-segmentation network (Pascal-Context, 60 classes) by mean IoU, in raw JAX (float32).

The network is a small fully convolutional encoder-decoder: three 3x3 convolution stages (64, 128, 256 channels,
stride 2 in the first two), a 1x1 class head and a bilinear upsampling of the logits to the input size. Each
step segments one batch of 8 images of 256x256 with their label maps (held on the device) and adds every class's
pixel intersection and union between prediction and label to the running totals, from which the evaluation reports
the mean IoU at the end. It returns the running totals. Variants:
  fixed      the per-class intersections and unions counted by one jitted function, brought back as one array each
  bincount   the counts read off a confusion matrix built with bincount in one jitted function
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "evaluation (semantic segmentation)"
VARIANTS = ["before", "fixed", "bincount"]
TRACE_STEPS = 1
BATCH, HW, CLASSES = size(8, 2), size(256, 16), size(60, 5)
CHANNELS = (64, 128, 256)


def init_params(key):
    keys = jax.random.split(key, len(CHANNELS) + 1)
    p, cin = {}, 3
    for i, (k, c) in enumerate(zip(keys, CHANNELS)):
        p[f"conv{i}"] = jax.random.normal(k, (3, 3, cin, c), jnp.float32) / np.sqrt(9 * cin)
        cin = c
    p["head"] = jax.random.normal(keys[-1], (1, 1, cin, CLASSES), jnp.float32) / np.sqrt(cin)
    return p


@jax.jit
def predict(p, images):
    h = images
    for i in range(len(CHANNELS)):
        stride = 2 if i < 2 else 1
        h = jax.nn.relu(jax.lax.conv_general_dilated(h, p[f"conv{i}"], (stride, stride), "SAME",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC")))
    logits = jax.lax.conv_general_dilated(h, p["head"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    logits = jax.image.resize(logits, (images.shape[0], HW, HW, CLASSES), "bilinear")
    return jnp.argmax(logits, axis=-1)


@jax.jit  # EDIT
def class_counts(pred, labels):  # EDIT
    classes = jnp.arange(CLASSES)  # EDIT
    p, l = pred[..., None] == classes, labels[..., None] == classes  # EDIT
    return jnp.sum(p & l, axis=(0, 1, 2)), jnp.sum(p | l, axis=(0, 1, 2))  # EDIT


@jax.jit  # EDIT
def class_counts_bincount(pred, labels):  # EDIT
    conf = jnp.bincount((labels * CLASSES + pred).ravel(), length=CLASSES * CLASSES).reshape(CLASSES, CLASSES)  # EDIT
    inter = jnp.diagonal(conf)  # EDIT
    return inter, conf.sum(0) + conf.sum(1) - inter  # EDIT


def build(variant):
    kp, kx = jax.random.split(jax.random.key(3))
    params = init_params(kp)
    images = jax.random.normal(kx, (BATCH, HW, HW, 3), jnp.float32)
    labels = np.array(predict(params, images))
    rng = np.random.default_rng(0)
    noise = rng.random(labels.shape) < 0.3
    labels[noise] = rng.integers(0, CLASSES, int(noise.sum()))
    labels = jnp.asarray(labels)

    def step(carry):
        inter, union = carry
        pred = predict(params, images)
        if variant in ("fixed", "bincount"):  # EDIT
            counts = class_counts if variant == "fixed" else class_counts_bincount  # EDIT
            i, u = counts(pred, labels)  # EDIT
            return inter + np.asarray(i), union + np.asarray(u)  # EDIT
        inter, union = inter.copy(), union.copy()
        for c in range(CLASSES):
            p, l = pred == c, labels == c
            inter[c] += int(jnp.sum(p & l))
            union[c] += int(jnp.sum(p | l))
        return inter, union

    zeros = np.zeros(CLASSES, np.int64)
    return step, (zeros, zeros.copy()), {"units": BATCH, "unit": "images"}
