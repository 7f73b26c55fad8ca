"""Linear-probe fine-tuning of a pretrained MLP feature extractor on a 1,000-class task, in raw JAX (float32).

The backbone (6 dense GELU layers of width 2,048, loaded from a pretraining run) is frozen and only the linear head
is trained: the trainer keeps one float "trainable" flag per parameter leaf (1.0 head, 0.0 backbone) as arrays, so
the same compiled step serves every freeze schedule of the sweep, and applies SGD as p - lr * flag * grad. Each step
trains on one batch of 8,192 precomputed input vectors and returns the updated parameters and the loss. Variants:
  fixed   the backbone's features cut from differentiation (the frozen part's gradients never computed)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (linear probe)"
VARIANTS = ["before", "fixed"]
BATCH, D, LAYERS, CLASSES = size(8192, 32), size(2048, 64), size(6, 2), size(1000, 10)
LR = 0.05


def init_params(key):
    keys = jax.random.split(key, LAYERS + 1)
    backbone = [{"w": jax.random.normal(k, (D, D), jnp.float32) / jnp.sqrt(D), "b": jnp.zeros((D,), jnp.float32)}
                for k in keys[:-1]]
    head = {"w": jax.random.normal(keys[-1], (D, CLASSES), jnp.float32) * 0.01, "b": jnp.zeros((CLASSES,), jnp.float32)}
    return {"backbone": backbone, "head": head}


def build(variant):
    kp, kx, ky = jax.random.split(jax.random.key(3), 3)
    params = init_params(kp)
    trainable = {"backbone": jax.tree.map(lambda _: jnp.float32(0.0), params["backbone"]),
                 "head": jax.tree.map(lambda _: jnp.float32(1.0), params["head"])}
    x = jax.random.normal(kx, (BATCH, D), jnp.float32)
    y = jax.random.randint(ky, (BATCH,), 0, CLASSES)

    def loss_fn(params, x, y):
        h = x
        for layer in params["backbone"]:
            h = jax.nn.gelu(h @ layer["w"] + layer["b"])
        if variant == "fixed":  # EDIT
            h = jax.lax.stop_gradient(h)  # EDIT
        logits = h @ params["head"]["w"] + params["head"]["b"]
        picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    @jax.jit
    def train_step(params, trainable, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params = jax.tree.map(lambda p, g, m: p - LR * m * g, params, grads, trainable)
        return params, loss

    def step(carry):
        params, trainable, x, y, _ = carry
        params, loss = train_step(params, trainable, x, y)
        return params, trainable, x, y, loss

    return step, (params, trainable, x, y, jnp.zeros(())), {"units": BATCH, "unit": "samples"}
