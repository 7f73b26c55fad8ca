"""A ResNet-style convolutional network's training step (bf16, NHWC, batch norm, residual blocks) in one jit.

Problem: none beyond the model's nature. Convolutions fused with their normalisation and activation dominate; the
early layers (few channels, large images) have low arithmetic intensity and run against the HBM roof rather than the
matmul roof, which is inherent to the layer shapes, not a defect: a reading should call them memory-bound at a
good fraction of their roof, not "passes a fused program would not make".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8


def _sizes() -> dict:
    return pick(dict(batch=8, image=32, widths=(16, 32)), dict(batch=256, image=224, widths=(64, 128, 256, 512)))


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _bn_relu(x, scale):
    mean = jnp.mean(x.astype(jnp.float32), (0, 1, 2), keepdims=True)
    var = jnp.var(x.astype(jnp.float32), (0, 1, 2), keepdims=True)
    return jax.nn.relu(((x - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * scale)


def _loss(params, images, labels):
    x = _conv(images, params["stem"], 2)
    for stage in params["stages"]:
        x = _bn_relu(_conv(x, stage["down"], 2), stage["s0"])
        y = _bn_relu(_conv(x, stage["a"]), stage["s1"])
        x = x + _bn_relu(_conv(y, stage["b"]), stage["s2"])
    logits = jnp.mean(x, (1, 2)).astype(jnp.float32) @ params["head"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(labels.shape[0]), labels])


def setup():
    c = _sizes()
    keys = iter(jax.random.split(jax.random.key(0), 4 * len(c["widths"]) + 4))

    def init(shape):
        fan_in = shape[0] * shape[1] * shape[2]
        return (jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(fan_in)).astype(jnp.bfloat16)

    widths = c["widths"]
    stages, cin = [], widths[0]
    for w in widths:
        stages.append({"down": init((3, 3, cin, w)), "a": init((3, 3, w, w)), "b": init((3, 3, w, w)),
                       "s0": jnp.ones((w,), jnp.bfloat16), "s1": jnp.ones((w,), jnp.bfloat16),
                       "s2": jnp.ones((w,), jnp.bfloat16)})
        cin = w
    params = {"stem": init((7, 7, 3, widths[0])), "stages": stages,
              "head": jax.random.normal(next(keys), (widths[-1], 1000)) / 100}
    images = jax.random.normal(next(keys), (c["batch"], c["image"], c["image"], 3), jnp.bfloat16)
    labels = jax.random.randint(next(keys), (c["batch"],), 0, 1000)

    @jax.jit
    def train_step(params, images, labels):
        loss, grads = jax.value_and_grad(_loss)(params, images, labels)
        return jax.tree.map(lambda w, g: w - 1e-3 * g.astype(w.dtype), params, grads), loss

    return train_step, params, images, labels, None


def step(state, i):
    train_step, params, images, labels, _ = state
    params, loss = train_step(params, images, labels)
    return train_step, params, images, labels, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
