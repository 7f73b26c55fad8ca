"""An image classifier trained in raw JAX whose training loop reads the loss back to the host after every step
(float(loss), to stop on a NaN and to keep a loss history), while its loader crops and flips each batch on the host
with NumPy. The read waits for the device to finish the step before the host starts the next batch, so the host's
work and the device's never overlap: asynchronous dispatch would run them side by side.

As its user wrote it: batch 512 of 72 x 72 x 3 uint8 images padded by 4 and cropped at random to 64 x 64 (one
NumPy slice per image), a 6-layer float32 MLP of width 8,192 over the flattened pixels, SGD. Variants:
  fixed   the loss kept on the device and read (and checked) once every 50 steps, as one array
"""
import math

import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, SIDE, PAD, WIDTH, LAYERS, CLASSES = size(512, 8), size(64, 8), 4, size(8192, 32), size(6, 2), 100
LOG_EVERY = 50


def augment(images, rng):  # the loader's host work: a random crop and a random flip per image
    out = np.empty((len(images), SIDE, SIDE, 3), np.uint8)
    ys, xs = rng.integers(0, 2 * PAD + 1, (2, len(images)))
    flips = rng.random(len(images)) < 0.5
    for j, img in enumerate(images):
        crop = img[ys[j]:ys[j] + SIDE, xs[j]:xs[j] + SIDE]
        out[j] = crop[:, ::-1] if flips[j] else crop
    return out


def build(variant):
    rng = np.random.default_rng(6)
    padded = [rng.integers(0, 256, (BATCH, SIDE + 2 * PAD, SIDE + 2 * PAD, 3), dtype=np.uint8) for _ in range(4)]
    labels = [rng.integers(0, CLASSES, (BATCH,), dtype=np.int32) for _ in range(4)]
    dims = [SIDE * SIDE * 3] + [WIDTH] * (LAYERS - 1) + [CLASSES]
    ks = jax.random.split(jax.random.key(8), LAYERS)
    params = [jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a) for k, a, b in zip(ks, dims, dims[1:])]

    def loss_fn(params, images, y):
        h = images.reshape(images.shape[0], -1).astype(jnp.float32) / 255.0
        for w in params[:-1]:
            h = jax.nn.relu(h @ w)
        logits = h @ params[-1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    @jax.jit
    def train_step(params, images, y):
        loss, g = jax.value_and_grad(loss_fn)(params, images, y)
        return [p - 0.01 * g for p, g in zip(params, g)], loss

    history = []

    def step(carry):
        params, _, i = carry
        images = augment(padded[i % len(padded)], rng)
        params, loss = train_step(params, images, labels[i % len(labels)])
        if variant == "fixed":  # EDIT: keep the loss on the device, read it every LOG_EVERY steps
            history.append(loss)
            if len(history) == LOG_EVERY:
                losses = np.asarray(jnp.stack(history))
                history.clear()
                if not np.isfinite(losses).all():
                    raise FloatingPointError("loss is not finite")
        else:  # as written
            value = float(loss)
            if not math.isfinite(value):
                raise FloatingPointError("loss is not finite")
            history.append(value)
        return params, loss, i + 1

    return step, (params, jnp.zeros(()), 0), {"units": BATCH, "unit": "images"}
