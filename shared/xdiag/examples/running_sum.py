"""Cumulative sums along a long axis: the compiler's sliding-window reduction runs far below the memory roof.

Problem: ``jnp.cumsum`` over 16,384 elements of each of 4,096 rows (f32, 256 MiB in, 256 MiB out). XLA lowers a
cumulative sum to a ``reduce-window`` (a window the length of the axis), a kernel that rereads its input many times
and reaches a few percent of the HBM bandwidth; the op is "memory-bound" only in name: the cure is another
algorithm or kernel (``jax.lax.associative_scan``, a blocked scan, or cumsum over a shorter axis), not fusion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8


def _shape() -> tuple[int, int]:
    return pick((256, 1024), (4096, 16384))


@jax.jit
def normalised_running_sum(x):
    c = jnp.cumsum(x, axis=-1)
    return c / (1.0 + jnp.abs(c[:, -1:]))


def setup():
    return jax.random.normal(jax.random.key(0), _shape()), None


def step(state, i):
    x, _ = state
    return x, normalised_running_sum(x)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
