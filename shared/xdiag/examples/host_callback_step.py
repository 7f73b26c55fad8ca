"""A host callback inside the compiled step (TPU: host send/recv traffic, not a collective).

Problem: the jitted step sends a 16 MiB activation to a numpy function with ``jax.pure_callback`` and waits for
its answer in the middle of the program. On a TPU the callback becomes ``send``/``recv`` (``-done``) ops to the host
in the step's program: the chip waits for the host's round trip, which dwarfs the step's own matmuls. On one chip
nothing is communicated between devices: the right reading is host-callback traffic (a host sync inside the
step), never "collective communication".

Fix: do the work in JAX (here: a tanh), or move the callback out of the step (``jax.debug.callback`` with
``ordered=False`` for logging, or once every N steps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 10


def _sizes() -> tuple[int, int]:
    return pick((256, 512), (2048, 2048))  # (batch, width): the callback moves batch*width f32 each way


def _host_squash(x: np.ndarray) -> np.ndarray:
    return np.tanh(np.asarray(x)).astype(np.float32)


@jax.jit
def train_step(w, x):
    h = jnp.dot(x, w)
    h = jax.pure_callback(_host_squash, jax.ShapeDtypeStruct(h.shape, jnp.float32), h)
    g = jnp.dot(x.T, h) / x.shape[0]
    return w - 1e-3 * g


def setup():
    batch, width = _sizes()
    kw, kx = jax.random.split(jax.random.key(0))
    return jax.random.normal(kw, (width, width)) / np.sqrt(width), jax.random.normal(kx, (batch, width))


def step(state, i):
    w, x = state
    return train_step(w, x), x


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
