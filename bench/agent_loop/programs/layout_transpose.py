"""An attention-style block: a per-head projection whose result the rest of the model reads in three layouts."""
from functools import partial

import jax
import jax.numpy as jnp

B, H, S, D = 8, 16, 512, 64  # batch, heads, sequence, head dim


@partial(jax.jit, donate_argnums=(0,))
def train_step(x, w):
    b, h, s, d = x.shape
    y = (jax.nn.relu(x).reshape(b * h * s, d) @ w).reshape(b, h, s, d)  # small per-head projection
    bshd = jnp.swapaxes(y, 1, 2)  # heads merged for an output projection
    bhds = jnp.swapaxes(y, 2, 3)  # "K^T" cache layout
    bdsh = jnp.transpose(y, (0, 3, 2, 1))  # channels-first
    return y, bshd, bhds, bdsh


def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (B, H, S, D), jnp.float32)
    w = jax.random.normal(k2, (D, D), jnp.float32) / jnp.sqrt(D)
    return x, w, None


def step(state, i):
    x, w, _ = state
    y, *views = train_step(x, w)
    return y, w, views


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
