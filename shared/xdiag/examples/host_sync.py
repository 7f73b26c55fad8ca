"""Host synchronisation: the step keeps pulling values back to the host.

Problem: the step is split into micro-steps, and after each one the Python
code reads results on the host - ``float(loss)`` for logging and
``np.asarray(params["w1"])`` / ``jax.device_get(grad_norm)`` for "monitoring"
- each a blocking device->host transfer that stalls the host until the device
has finished, so the host can never run ahead and queue work. Inside the
jitted update a ``jax.pure_callback`` also sends the gradients to a host
numpy function (gradient clipping done in numpy) and waits for its answer,
stalling the device in the middle of the program.

What a profile shows: per ``train`` step, four short ``jit_update``
executions, each followed on the ``python`` line by blocking reads
(``$array.py ... __float__``, ``$api.py ... device_get``, ``$numpy asarray``;
device-to-host transfer events as well on GPU). Inside each execution the
host callback is an HLO ``custom-call`` op named ``pure_callback.N`` that
runs the Python/numpy function (when it runs on the main thread it also
shows as ``$callback.py ... _wrapped_callback``); on CPU it takes ~80% of
all XLA op time, the real compute (``dot``/``ynn_fusion``) under 10%.
Device work is serialised behind the host at every micro-step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 15
MICRO_STEPS = 4
CALLBACK_ELEMENTS = 1 << 19  # gradient elements sent to the host callback (2 MB)


def _sizes() -> tuple[int, int]:
    return pick((64, 768), (1024, 4096))  # (batch, width)


def _host_clip_scale(grad: np.ndarray) -> np.ndarray:
    """Runs on the host, inside the jitted update: numpy gradient clipping."""
    g = np.asarray(grad, dtype=np.float64)
    norm = float(np.sqrt(np.sum(g * g)))
    p99 = float(np.percentile(np.abs(g), 99.0))  # adaptive threshold, host-only
    threshold = 10.0 * p99 * np.sqrt(g.size)
    return np.asarray(min(1.0, threshold / (norm + 1e-12)), dtype=np.float32)


def _loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - x) ** 2)


@jax.jit
def update(params, x):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    scale = jax.pure_callback(
        _host_clip_scale,
        jax.ShapeDtypeStruct((), jnp.float32),
        grads["w1"].reshape(-1)[:CALLBACK_ELEMENTS],
    )
    params = jax.tree.map(lambda p, g: p - 0.01 * scale * g, params, grads)
    grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    return params, loss, grad_norm


def setup():
    batch, width = _sizes()
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (width, width)) / np.sqrt(width),
        "w2": jax.random.normal(k2, (width, width)) / np.sqrt(width),
    }
    xs = list(jax.random.normal(k3, (MICRO_STEPS, batch, width)))
    return params, xs, []


def step(state, i):
    params, xs, log = state
    for k in range(MICRO_STEPS):
        params, loss, grad_norm = update(params, xs[k])
        # Blocking device->host reads, every micro-step:
        log.append(float(loss))
        log.append(float(jax.device_get(grad_norm)))
        w1_host = np.asarray(params["w1"])  # "monitoring": copy weights to host
        log.append(float(np.abs(w1_host).max()))
    del log[:-100]
    return params, xs, log


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
