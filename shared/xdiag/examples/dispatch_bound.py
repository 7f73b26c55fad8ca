"""Dispatch-bound: un-jitted, op-by-op JAX code on small arrays.

Problem: the step is written as plain eager ``jnp`` code - a Python loop of
~160 tiny elementwise ops on 64x64 arrays, never wrapped in ``jax.jit``.
Every op is dispatched on its own (Python -> jax -> a cached one-op XLA
executable -> device), so per-op dispatch overhead, not math, sets the step
time.

What a profile shows: each ``train`` step contains ~160 separate
``PjitFunction(...)`` / ``ExecuteHelperOnSingleDevice`` launches on the
``python`` line, each followed by a one-op XLA module (``jit_multiply``,
``jit_add``, ``jit_tanh`` ... each with a single microsecond-scale op such as
``wrapped_multiply``/``wrapped_tanh``) on the XLA threads or GPU stream. The
device ops add up to a small fraction of the step; the rest is host
dispatch time between them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps

DEFAULT_STEPS = 20
SIZE = 64
BLOCKS = 40  # 4 eager ops per block


def setup():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, (SIZE, SIZE))
    w = jax.random.normal(k2, (SIZE, SIZE)) * 0.1
    b = jax.random.normal(k3, (SIZE, SIZE)) * 0.1
    return x, w, b


def step(state, i):
    x, w, b = state
    # Each line is a separate eager dispatch: nothing here is jitted.
    for _ in range(BLOCKS):
        x = jnp.multiply(x, w)
        x = jnp.add(x, b)
        x = jnp.tanh(x)
        x = jnp.subtract(x, b)
    return x, w, b


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
