"""An image classifier trained in raw JAX whose augmentation follows a schedule: a strong blur for the first
epochs, an unsharp mask after, chosen inside the jitted step with jnp.where(step < WARMUP, blur(x), sharpen(x)).
jnp.where picks elements, so both augmentations run on every step and one result is thrown away.

As its user wrote it: 128 images of 128 x 128 x 3, both augmentations 15 x 15 depthwise convolutions, a strided
convolution stem and a dense head, plain SGD; the step counter rides in the carry. Variants:
  fixed   jax.lax.cond(step < WARMUP, blur, sharpen, x): only the scheduled augmentation runs
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, SIDE, TAPS, CLASSES, WARMUP = size(128, 4), size(128, 16), 15, 10, 1000
DN = ("NHWC", "HWIO", "NHWC")


def gaussian(sigma):
    r = jnp.arange(TAPS) - TAPS // 2
    g = jnp.exp(-0.5 * (r / sigma) ** 2)
    k = jnp.outer(g, g) / jnp.sum(g) ** 2
    return jnp.tile(k[:, :, None, None], (1, 1, 1, 3))  # one filter per colour channel


def depthwise(x, k):
    return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=DN, feature_group_count=3)


def blur(x):
    return depthwise(x, gaussian(3.0))


def sharpen(x):
    return x + 0.8 * (x - depthwise(x, gaussian(1.5)))


def build(variant):
    k = jax.random.split(jax.random.key(3), 4)
    params = {"stem": jax.random.normal(k[0], (4, 4, 3, 64), jnp.float32) / 7,
              "head": jax.random.normal(k[1], (64, CLASSES), jnp.float32) / 8}
    images = jax.random.uniform(k[2], (BATCH, SIDE, SIDE, 3), jnp.float32)
    labels = jax.random.randint(k[3], (BATCH,), 0, CLASSES)

    def loss_fn(params, x):
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, params["stem"], (4, 4), "VALID", dimension_numbers=DN))
        logits = h.mean(axis=(1, 2)) @ params["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    @jax.jit
    def train_step(params, step, images):
        if variant == "fixed":  # EDIT
            x = jax.lax.cond(step < WARMUP, blur, sharpen, images)
        else:
            x = jnp.where(step < WARMUP, blur(images), sharpen(images))  # as written
        loss, g = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), step + 1, loss

    def step(carry):
        params, n, _ = carry
        return train_step(params, n, images)

    return step, (params, jnp.zeros((), jnp.int32), jnp.zeros(())), {"units": BATCH, "unit": "images"}
