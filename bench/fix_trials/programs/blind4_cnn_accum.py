"""Fine-tuning a small CIFAR-style convolutional classifier with gradient accumulation, in raw JAX (float32).

The network has four 3x3 convolutions (32, 64, 64, 128 channels; stride 2 after the first two), each followed by a
learned per-channel scale and shift and a ReLU, global average pooling, a dense layer of 256 and a 10-way head.
Each step takes one global batch of 256 images, runs it as 8 micro-batches of 32 (the accumulation the training
script was configured with), averages their gradients and applies one momentum-SGD update. It returns the new
parameters, the momentum and the step's mean loss. Variants:
  fixed       the micro-batch loop run as a lax.scan inside one jitted accumulation function
  fullbatch   one gradient of the whole 256-image batch (the mean loss over the same images)
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (image classification)"
VARIANTS = ["before", "fixed", "fullbatch"]
GLOBAL, ACCUM, HW = size(256, 8), size(8, 4), size(32, 8)
MICRO = GLOBAL // ACCUM
CHANNELS, DENSE, CLASSES, LR, MOMENTUM = (32, 64, 64, 128), size(256, 32), 10, 0.05, 0.9


def init_params(key):
    keys = jax.random.split(key, len(CHANNELS) + 2)
    params, cin = {}, 3
    for i, (k, c) in enumerate(zip(keys, CHANNELS)):
        params[f"conv{i}"] = jax.random.normal(k, (3, 3, cin, c), jnp.float32) / np.sqrt(9 * cin)
        params[f"scale{i}"] = jnp.ones((c,), jnp.float32)
        params[f"shift{i}"] = jnp.zeros((c,), jnp.float32)
        cin = c
    params["dense_w"] = jax.random.normal(keys[-2], (cin, DENSE), jnp.float32) / np.sqrt(cin)
    params["dense_b"] = jnp.zeros((DENSE,), jnp.float32)
    params["head_w"] = jax.random.normal(keys[-1], (DENSE, CLASSES), jnp.float32) / np.sqrt(DENSE)
    params["head_b"] = jnp.zeros((CLASSES,), jnp.float32)
    return params


def forward(params, x):
    for i in range(len(CHANNELS)):
        stride = 2 if i in (1, 2) else 1
        x = jax.lax.conv_general_dilated(x, params[f"conv{i}"], (stride, stride), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x * params[f"scale{i}"] + params[f"shift{i}"])
    x = x.mean(axis=(1, 2))
    x = jax.nn.relu(x @ params["dense_w"] + params["dense_b"])
    return x @ params["head_w"] + params["head_b"]


def loss_fn(params, x, y):
    logits = forward(params, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


grad_fn = jax.jit(jax.value_and_grad(loss_fn))


@jax.jit
def sgd_update(params, momentum, grads):
    momentum = jax.tree.map(lambda m, g: MOMENTUM * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - LR * m, params, momentum)
    return params, momentum


@jax.jit  # EDIT
def accumulated_grads(params, images, labels):  # EDIT
    xs = images.reshape(ACCUM, MICRO, *images.shape[1:]), labels.reshape(ACCUM, MICRO)  # EDIT
    def body(acc, batch):  # EDIT
        loss, g = jax.value_and_grad(loss_fn)(params, *batch)  # EDIT
        return jax.tree.map(jnp.add, acc, g), loss  # EDIT
    grads, losses = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), xs)  # EDIT
    return jax.tree.map(lambda g: g / ACCUM, grads), losses.mean()  # EDIT


def build(variant):
    kp, kx, ky = jax.random.split(jax.random.key(10), 3)
    params = init_params(kp)
    momentum = jax.tree.map(jnp.zeros_like, params)
    images = jax.random.normal(kx, (GLOBAL, HW, HW, 3), jnp.float32)
    labels = jax.random.randint(ky, (GLOBAL,), 0, CLASSES)

    def step(carry):
        params, momentum, _ = carry
        if variant == "fixed":  # EDIT
            grads, loss = accumulated_grads(params, images, labels)  # EDIT
        elif variant == "fullbatch":  # EDIT
            loss, grads = grad_fn(params, images, labels)  # EDIT
        else:
            grads, losses = None, []
            for i in range(ACCUM):
                xb, yb = images[i * MICRO:(i + 1) * MICRO], labels[i * MICRO:(i + 1) * MICRO]
                loss, g = grad_fn(params, xb, yb)
                grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
                losses.append(loss)
            grads = jax.tree.map(lambda g: g / ACCUM, grads)
            loss = sum(losses) / ACCUM
        params, momentum = sgd_update(params, momentum, grads)
        return params, momentum, loss

    return step, (params, momentum, jnp.zeros(())), {"units": GLOBAL, "unit": "images"}
