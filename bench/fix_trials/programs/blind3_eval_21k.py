"""Evaluation of an image classifier with a 21,843-class head (ImageNet-21k labels), in raw JAX (float32).

The model scores precomputed 2,048-wide image features with 3 dense GELU layers of 2,048 and the 21,843-way head.
Each step evaluates one batch of 2,048 images against its labels (held on the host, as the evaluation loader yields
them) and adds the batch's top-1 hits to the running count, the way the evaluation loop reports accuracy at the end.
The step returns the running count. Variants:
  fixed   the top-1 class taken on the device, so only the predicted class ids come back to the host
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "evaluation (classification)"
VARIANTS = ["before", "fixed"]
BATCH, D, LAYERS, CLASSES = size(2048, 16), size(2048, 32), size(3, 2), size(21843, 50)


def init_params(key):
    keys = jax.random.split(key, LAYERS + 1)
    layers = [{"w": jax.random.normal(k, (D, D), jnp.float32) / jnp.sqrt(D), "b": jnp.zeros((D,), jnp.float32)}
              for k in keys[:-1]]
    head = {"w": jax.random.normal(keys[-1], (D, CLASSES), jnp.float32) / jnp.sqrt(D),
            "b": jnp.zeros((CLASSES,), jnp.float32)}
    return {"layers": layers, "head": head}


@jax.jit
def predict(params, x):
    h = x
    for layer in params["layers"]:
        h = jax.nn.gelu(h @ layer["w"] + layer["b"])
    return h @ params["head"]["w"] + params["head"]["b"]


@jax.jit  # EDIT
def predict_top1(params, x):  # EDIT
    return jnp.argmax(predict(params, x), axis=-1)  # EDIT


def build(variant):
    kp, kx = jax.random.split(jax.random.key(21))
    params = init_params(kp)
    x = jax.random.normal(kx, (BATCH, D), jnp.float32)
    labels = np.asarray(predict(params, x)).argmax(-1)
    labels[::3] = np.random.default_rng(0).integers(0, CLASSES, labels[::3].shape)  # about 2/3 correct

    def step(carry):
        params, x, hits = carry
        if variant == "fixed":  # EDIT
            top1 = np.asarray(predict_top1(params, x))  # EDIT
        else:
            top1 = np.asarray(predict(params, x)).argmax(axis=-1)
        hits = hits + int(np.sum(top1 == labels))
        return params, x, hits

    return step, (params, x, 0), {"units": BATCH, "unit": "images"}
