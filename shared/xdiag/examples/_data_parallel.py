"""Helpers for the data-parallel workloads: one step of a tanh MLP on each device's shard of the batch,
gradients averaged over the devices with ``jax.lax.psum`` (``shard_map`` over a 1-D mesh)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xdiag.examples import WorkloadSkipped

AXIS = "d"
LEARNING_RATE = 1e-3

try:
    _shard_map = jax.shard_map
except AttributeError:  # older jax
    from jax.experimental.shard_map import shard_map as _shard_map


def mesh_of(devices_wanted: int) -> Mesh:
    devices = jax.devices()[:devices_wanted]
    if len(devices) < 2:
        raise WorkloadSkipped(
            f"needs >= 2 devices, found {len(jax.devices())} {jax.default_backend()} device(s); "
            f"on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={devices_wanted}"
        )
    return Mesh(np.array(devices), (AXIS,))


def _loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def make_step(mesh: Mesh, micro_batches: int, extra_grad_elements: int):
    """A jitted data-parallel step: per device, `micro_batches` forward/backward passes over its shard inside a
    `lax.scan`, each all-reducing its gradient (plus `extra_grad_elements` more gradient values, e.g. the
    embedding tables of a large model) before the update."""

    def per_device(w, extra, x):
        def micro(carry, xb):
            w, extra = carry
            g = jax.grad(_loss)(w, xb)
            g, g_extra = jax.lax.psum((g, extra * 0.5), AXIS)  # the all-reduce sits inside the scan's while loop
            return (w - LEARNING_RATE * g, extra - LEARNING_RATE * g_extra), None

        (w, extra), _ = jax.lax.scan(micro, (w, extra), x.reshape(micro_batches, -1, x.shape[-1]))
        return w, extra

    mapped = _shard_map(
        per_device, mesh=mesh, in_specs=(P(), P(), P(AXIS)), out_specs=(P(), P()), check_vma=False
    )
    return jax.jit(mapped)


def setup(mesh: Mesh, batch_per_device: int, width: int, micro_batches: int, extra_grad_elements: int):
    n = mesh.devices.size
    key = jax.random.key(0)
    w = jax.device_put(jax.random.normal(key, (width, width), jnp.float32) / np.sqrt(width), NamedSharding(mesh, P()))
    extra = jax.device_put(jnp.ones((max(extra_grad_elements, 1),), jnp.float32), NamedSharding(mesh, P()))
    x = jax.device_put(
        jax.random.normal(key, (n * batch_per_device, width), jnp.float32), NamedSharding(mesh, P(AXIS))
    )
    return make_step(mesh, micro_batches, extra_grad_elements), w, extra, x


def step(state, i):
    fn, w, extra, x = state
    w, extra = fn(w, extra, x)
    return fn, w, extra, x
