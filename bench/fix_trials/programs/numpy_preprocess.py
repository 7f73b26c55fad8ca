"""An image classifier trained in raw JAX whose input pipeline normalises and flips each batch with NumPy on the
host, in the training loop, before the jitted step: uint8 -> float32, /255, per-channel mean/std, horizontal flip.

As its user wrote it: batch 256 of 128 x 128 x 3 uint8 images from the loader, a patch-embedding MLP (16 x 16
patches, width 768), SGD. The host does several full passes over 12.6 M elements per step and ships 50 MB of
float32 to the device instead of 12.6 MB of uint8. Variants:
  fixed   the uint8 batch and the flip decisions passed to the jitted step; the same arithmetic in jnp there
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, SIDE, PATCH, WIDTH, CLASSES = size(256, 4), size(128, 32), 16, size(768, 32), 100
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def normalise_np(images, flip):  # as written, on the host
    x = images.astype(np.float32) / 255.0
    x = (x - MEAN) / STD
    return np.where(flip[:, None, None, None], x[:, :, ::-1, :], x)


def normalise_jnp(images, flip):  # EDIT: the same, inside the jitted step
    x = images.astype(jnp.float32) / 255.0
    x = (x - MEAN) / STD
    return jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)


def build(variant):
    rng = np.random.default_rng(0)
    loader = [rng.integers(0, 256, (BATCH, SIDE, SIDE, 3), dtype=np.uint8) for _ in range(4)]
    labels = [rng.integers(0, CLASSES, (BATCH,), dtype=np.int32) for _ in range(4)]
    k = jax.random.split(jax.random.key(9), 3)
    dim = PATCH * PATCH * 3
    params = {"patch": jax.random.normal(k[0], (dim, WIDTH), jnp.float32) / np.sqrt(dim),
              "mlp": jax.random.normal(k[1], (WIDTH, 2 * WIDTH), jnp.float32) / np.sqrt(WIDTH),
              "head": jax.random.normal(k[2], (2 * WIDTH, CLASSES), jnp.float32) / np.sqrt(2 * WIDTH)}

    def loss_fn(params, x, y):
        n = SIDE // PATCH
        p = x.reshape(BATCH, n, PATCH, n, PATCH, 3).transpose(0, 1, 3, 2, 4, 5).reshape(BATCH, n * n, -1)
        h = jax.nn.gelu(jax.nn.gelu(p @ params["patch"]) @ params["mlp"]).mean(axis=1)
        logits = h @ params["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    @jax.jit
    def train_step(params, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, g), loss

    @jax.jit
    def train_step_raw(params, images, flip, y):  # EDIT
        return train_step(params, normalise_jnp(images, flip), y)

    def step(carry):
        params, _, i = carry
        images, y = loader[i % len(loader)], labels[i % len(labels)]
        flip = rng.random(BATCH) < 0.5
        if variant == "fixed":  # EDIT
            params, loss = train_step_raw(params, images, flip, y)
        else:
            params, loss = train_step(params, normalise_np(images, flip), y)
        return params, loss, i + 1

    return step, (params, jnp.zeros(()), 0), {"units": BATCH, "unit": "images"}
