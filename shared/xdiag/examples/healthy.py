"""Healthy control: a compute-bound MLP training step.

Problem: none. One ``jax.jit`` holds the whole step - forward pass of a
tanh MLP (a few large matmuls), backward pass and SGD update - with
fresh parameter buffers each step (see train_step for why not donated). Steps run back to back with
no host work in between beyond launching the step.

What a profile shows: the device (the XLA threads on CPU, the GPU stream on
GPU) is busy for nearly the whole of every ``train`` step annotation, almost
all of it in matmul ops (dot / gemm / ``ynn_fusion`` on CPU, cuBLAS gemm
kernels on GPU) with a small share of elementwise tanh/update fusions; the
host issues one executable launch per step and otherwise waits. There are no
compiles, transfers or host callbacks inside the trace.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 15
LEARNING_RATE = 1e-3


def _sizes() -> tuple[int, int, int, int]:
    # (batch, d_in, d_hidden, layers): ~20 GFLOP, ~0.1 s/step on a 2-core
    # CPU; ~7 TFLOP, tens of ms/step on a large GPU.
    return pick((512, 512, 1536, 3), (4096, 4096, 8192, 4))


def _loss(params, x, y):
    h = x
    for w in params["hidden"]:
        h = jnp.tanh(h @ w)
    out = h @ params["out"]
    return jnp.mean((out - y) ** 2)


@jax.jit
def train_step(params, x, y):
    # Not donated: XLA:CPU protects a donated parameter that the backward pass still reads with a
    # whole-array copy (~5-20% of op time here), which would make this control less than healthy.
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return params, loss


def setup():
    batch, d_in, d_hidden, layers = _sizes()
    keys = jax.random.split(jax.random.key(0), layers + 3)
    dims = [d_in] + [d_hidden] * layers
    hidden = [
        jax.random.normal(keys[i], (dims[i], dims[i + 1]), jnp.float32) / jnp.sqrt(dims[i])
        for i in range(layers)
    ]
    params = {"hidden": hidden, "out": jax.random.normal(keys[layers], (d_hidden, d_in)) / jnp.sqrt(d_hidden)}
    x = jax.random.normal(keys[layers + 1], (batch, d_in), jnp.float32)
    y = jax.random.normal(keys[layers + 2], (batch, d_in), jnp.float32)
    return params, x, y, None


def step(state, i):
    params, x, y, _ = state
    params, loss = train_step(params, x, y)
    return params, x, y, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
