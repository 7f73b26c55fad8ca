"""A training loop without step annotations whose batches are augmented on the host in numpy each iteration.

Problem: every iteration builds a batch in numpy (random crops and flips, ~tens of ms of host work), converts it with
``jnp.asarray`` and normalises it in small separate jitted programs before the jitted train step: one iteration is
several programs, and the device idles while the host augments. Without annotations the step is the repeating
unit of the whole program sequence (augment, convert, normalise, train), not one program's executions.

Fix: a prefetching input pipeline (tf.data / grain with workers, or a background thread with ``device_put`` one
batch ahead), augmentation on the device, or fewer host-side conversions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8
STEP_MARKERS = False  # the capture leaves out step annotations, as many real loops do


def _sizes() -> tuple[int, int, int]:
    return pick((16, 32, 256), (256, 64, 2048))  # (batch, image side, hidden)


@jax.jit
def normalise(images):
    return (images - jnp.mean(images)) / (jnp.std(images) + 1e-6)


@jax.jit
def one_hot(labels):
    return jax.nn.one_hot(labels, 10)


@jax.jit
def train_step(w, images, targets):
    def loss(w):
        h = jnp.tanh(images @ w[0])
        return jnp.mean((h @ w[1] - targets) ** 2)

    return [p - 1e-3 * g for p, g in zip(w, jax.grad(loss)(w))]


def _augment(rng: np.random.Generator, pool: np.ndarray, batch: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    # Vectorised numpy (a few large array ops, as a real input pipeline's transforms are), not a Python loop per image.
    idx = rng.integers(0, pool.shape[0], batch)
    y, x = rng.integers(0, pool.shape[1] - side, 2)
    images = pool[idx, y:y + side, x:x + side]
    flip = rng.random(batch) < 0.5
    images[flip] = images[flip, :, ::-1]
    images = images + rng.normal(0.0, 0.05, images.shape).astype(np.float32)  # noise augmentation
    images = np.clip(images * rng.uniform(0.8, 1.2, (batch, 1, 1, 1)).astype(np.float32), -3, 3)
    return images, rng.integers(0, 10, batch)


def setup():
    batch, side, hidden = _sizes()
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((64, side + 16, side + 16, 3), dtype=np.float32)
    k1, k2 = jax.random.split(jax.random.key(0))
    w = [jax.random.normal(k1, (side * side * 3, hidden)) / 100, jax.random.normal(k2, (hidden, 10)) / 10]
    return w, rng, pool, batch, side


def step(state, i):
    w, rng, pool, batch, side = state
    images, labels = _augment(rng, pool, batch, side)
    # Flattened before the transfer: a 4-D f32 batch is re-tiled on the host on its way to a TPU (the runtime's
    # Linearize/Transpose work, ~190 ms per 12 MiB batch measured on a v5e), which would hide the augmentation.
    w = train_step(w, normalise(jnp.asarray(images.reshape(batch, -1))), one_hot(jnp.asarray(labels)))
    return w, rng, pool, batch, side


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
