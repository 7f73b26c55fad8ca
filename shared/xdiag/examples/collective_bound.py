"""Collective-bound: tiny per-device compute, large all-reduce / all-gather.

Problem: a data-parallel step sharded over every device (``shard_map`` over
a 1-D mesh; on CPU the capture forces 4 host devices with
``--xla_force_host_platform_device_count=4``) does a trivial amount of math
per device - one elementwise update of its shard - and then all-reduces a
large full-size "gradient" buffer (``jax.lax.psum``) and all-gathers the
updated shards (``jax.lax.all_gather``) every step. Communication volume is
tens of MB per step while compute is a single cheap pass, so the step time
is almost entirely collectives.

What a profile shows: for every device (``device_ordinal`` 0..3 on the XLA
threads on CPU; one GPU plane per device on GPU) the step is dominated by
the collectives: on CPU the ops ``psum_invariant.N`` (HLO opcode
``all-reduce``; the instruction is named after jax's primitive, so the
opcode must be read from the HLO module in the profile's metadata plane) and
``all_gather.N`` (opcode ``all-gather``) take ~90% of the XLA op time, with
``Rendezvous`` / ``Wait: pending_threads=k/4`` events inside them (devices
waiting for each other); NCCL AllReduce/AllGather kernels on GPU. Only small
elementwise fusions run in between.

Needs at least 2 devices. With a single device (e.g. one GPU) the
collectives would be compiled away, so :func:`setup` raises
``WorkloadSkipped``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xdiag.examples import WorkloadSkipped
from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 20
MAX_DEVICES = 4
AXIS = "d"

try:
    _shard_map = jax.shard_map
except AttributeError:  # older jax
    from jax.experimental.shard_map import shard_map as _shard_map


def _elements_per_device() -> int:
    # f32 elements all-reduced per device per step: 16 MB on CPU, 512 MB on GPU.
    return pick(1 << 22, 1 << 27)


def _make_step(mesh: Mesh):
    n = mesh.devices.size

    def per_device(grad, shard):
        # grad: this device's full-size local gradient; shard: its 1/n slice
        # of the parameters. Compute is one cheap elementwise pass each.
        grad = jax.lax.psum(grad * 0.5, AXIS) / n  # big all-reduce
        update = grad.reshape(n, -1)[jax.lax.axis_index(AXIS)]
        shard = shard - 1e-3 * update
        full = jax.lax.all_gather(shard, AXIS, tiled=True)  # big all-gather
        return grad + 1e-3 * full, shard

    mapped = _shard_map(
        per_device, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=(P(AXIS), P(AXIS))
    )
    return jax.jit(mapped, donate_argnums=(0, 1))


def setup():
    devices = jax.devices()[:MAX_DEVICES]
    if len(devices) < 2:
        raise WorkloadSkipped(
            f"needs >= 2 devices, found {len(jax.devices())} {jax.default_backend()} device(s); "
            "on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=4"
        )
    n = len(devices)
    mesh = Mesh(np.array(devices), (AXIS,))
    per = _elements_per_device()
    sharding = NamedSharding(mesh, P(AXIS))
    # Each device holds a full-size local gradient (per elements) and a 1/n
    # parameter shard (per/n elements).
    grads = jax.device_put(jnp.ones((n * per,), jnp.float32), sharding)
    params = jax.device_put(jnp.zeros((per,), jnp.float32), sharding)
    return _make_step(mesh), grads, params


def step(state, i):
    fn, grads, params = state
    grads, params = fn(grads, params)
    return fn, grads, params


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
