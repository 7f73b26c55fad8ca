"""A tabular classifier trained in raw JAX from NumPy features with 64-bit floats switched on, as a script ported
from NumPy/SciPy often starts: jax.config.update("jax_enable_x64", True) for accuracy, the features and weights
made with NumPy (float64 by default), so every op of the step runs in float64.

As its user wrote it: 16,384 rows of 512 features, one hidden layer of 1,024, a logistic loss, plain SGD, the
features standardised inside the step. Variants:
  fixed   float32: 64-bit floats left off, the NumPy arrays cast with .astype(np.float32) where they enter
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
RTOL = 1e-3  # float32 rounds what float64 kept
ROWS, FEATURES, HIDDEN = size(16384, 256), size(512, 32), size(1024, 64)


def build(variant):
    jax.config.update("jax_enable_x64", variant != "fixed")  # EDIT (as written: 64-bit floats on)
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, FEATURES)) * rng.uniform(0.5, 4.0, FEATURES) + rng.uniform(-2, 2, FEATURES)
    labels = (features[:, :8].sum(axis=1) > 0).astype(np.float64)
    params = {"w1": rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES),
              "w2": rng.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN)}
    if variant == "fixed":  # EDIT
        features, labels = features.astype(np.float32), labels.astype(np.float32)
        params = {k: v.astype(np.float32) for k, v in params.items()}
    features, labels, params = jnp.asarray(features), jnp.asarray(labels), jax.tree.map(jnp.asarray, params)

    def loss_fn(params):
        x = (features - features.mean(axis=0)) / (features.std(axis=0) + 1e-6)
        logits = (jnp.tanh(x @ params["w1"]) @ params["w2"])[:, 0]
        return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits)

    @jax.jit
    def train_step(params):
        loss, g = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss

    def step(carry):
        return train_step(carry[0])

    return step, (params, jnp.zeros((), features.dtype)), {"units": ROWS, "unit": "rows"}
