"""Host<->device transfers every step: the batch is put on the device and the result read back as numpy.

Problem: each step ``jax.device_put``s a 64 MiB numpy batch, runs a small jitted function on it and reads a 64 MiB
result back with ``np.asarray``. The device computes for a few hundred microseconds; the rest of the step is the
host<->device link. On a TPU the copies leave nothing on the device's op lines: they show only as host events (the
transfer manager's threads, the wait in ``np.asarray``). The right reading is host<->device transfers, whose fix
(keep data on the device, transfer once, prefetch the next batch while this one computes, read back only what is
logged) is not the fix for a blocking sync.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 10


def _rows() -> int:
    return pick(1024, 16384)  # x [rows, 1024] f32: 4 MiB on CPU, 64 MiB on an accelerator


@jax.jit
def scale_shift(x):
    return x * 1.0001 + 0.5


def setup():
    rng = np.random.default_rng(0)
    return rng.standard_normal((_rows(), 1024), dtype=np.float32), []


def step(state, i):
    batch, log = state
    x = jax.device_put(batch)
    y = np.asarray(scale_shift(x))
    log.append(float(y[0, 0]))
    del log[:-10]
    return batch, log


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
