"""Host offload: activations kept in pinned host memory, copied to the device and back inside every step.

Problem: the step's three 64 MiB inputs live in ``pinned_host`` memory (memory space S(5) in the HLO); the jitted
step copies them to HBM, runs a little elementwise work and copies the results back to host memory. The program's
time is the ``copy-start``/``copy-done`` pairs between memory spaces over the host link; compute is a few percent.
On-chip prefetches (``copy-start`` to S(1)) are something else: they appear in almost every TPU program and are
not host traffic.

Fix: keep the buffers on the device if they fit (they do here), offload fewer/smaller buffers or less often, or
give the copies a longer compute phase to hide behind.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples import WorkloadSkipped
from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8
BUFFERS = 3


def _rows() -> int:
    return pick(512, 16384)  # each buffer [rows, 1024] f32


def _shardings():
    device = jax.devices()[0]
    kinds = {m.kind for m in device.addressable_memories()}
    if "pinned_host" not in kinds:
        raise WorkloadSkipped(f"{device.platform} device has no pinned_host memory (has {sorted(kinds)})")
    single = jax.sharding.SingleDeviceSharding
    return single(device, memory_kind="device"), single(device, memory_kind="pinned_host")


def setup():
    on_device, on_host = _shardings()

    @jax.jit
    def offloaded_step(buffers):
        out = []
        for b in buffers:
            d = jax.device_put(b, on_device)  # host -> HBM inside the program
            out.append(jax.device_put(jnp.tanh(d) * 0.5 + 0.1, on_host))  # HBM -> host
        return out

    keys = jax.random.split(jax.random.key(0), BUFFERS)
    buffers = [jax.device_put(jax.random.normal(k, (_rows(), 1024)), on_host) for k in keys]
    return offloaded_step, buffers


def step(state, i):
    offloaded_step, buffers = state
    return offloaded_step, offloaded_step(buffers)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
