"""Training a small classifier on randomly cropped, flipped and normalised images built on the host each step."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

BATCH, CHANNELS, SIZE, CROP = 96, 3, 36, 32
FEATURES = CHANNELS * CROP * CROP
HIDDEN, CLASSES = 256, 10


def _preprocess_sample(image: np.ndarray, rng: np.random.Generator) -> list[float]:
    """Random crop + flip, then per-pixel normalisation."""
    top, left = rng.integers(0, SIZE - CROP + 1, size=2)
    crop = image[:, top : top + CROP, left : left + CROP]
    if rng.random() < 0.5:
        crop = crop[:, :, ::-1]
    pixels = crop.ravel().tolist()
    mean = sum(pixels) / len(pixels)
    var = sum([(p - mean) * (p - mean) for p in pixels]) / len(pixels)
    inv_std = 1.0 / (var + 1e-6) ** 0.5
    return [((p - mean) * inv_std) * 0.5 + 0.5 * ((p - mean) * inv_std) ** 3 / 6.0 for p in pixels]


def make_batch(i: int) -> tuple[np.ndarray, np.ndarray]:
    """Input pipeline for step i."""
    rng = np.random.default_rng(i)
    images = rng.integers(0, 256, size=(BATCH, CHANNELS, SIZE, SIZE), dtype=np.uint8)
    images = images.astype(np.float32) / 255.0
    rows = [_preprocess_sample(images[b], rng) for b in range(BATCH)]
    x = np.asarray(rows, dtype=np.float32)
    y = rng.integers(0, CLASSES, size=BATCH).astype(np.int32)
    return x, y


def _loss(params, x, y):
    h = jax.nn.relu(x @ params["w1"])
    logits = h @ params["w2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


@partial(jax.jit, donate_argnums=(0,))
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
    }
    return params, None


def step(state, i):
    params, _ = state
    x, y = make_batch(i)
    params, loss = train_step(params, x, y)
    return params, loss


if __name__ == "__main__":  # python PROGRAM.py OUT_DIR: 2 warm-up steps, then 10 profiled steps into OUT_DIR
    import sys

    state = setup()
    for k in range(2):
        state = step(state, k)
    jax.block_until_ready(state)
    jax.profiler.start_trace(sys.argv[1])
    for k in range(10):
        with jax.profiler.StepTraceAnnotation("train", step_num=k):
            state = step(state, k)
            jax.block_until_ready(state)
    jax.profiler.stop_trace()
