"""Data parallelism across processes (``jax.distributed`` on 127.0.0.1, gloo CPU collectives) with one slow
process: the building block of the straggler workloads.

Each process owns one device. A step computes a local gradient on its device (a chain of ``reps`` dependent
256×256 matmuls, in its own jitted program), then all processes all-reduce their gradients (``psum`` under
``shard_map`` over a mesh spanning every process) and update. The last process is the straggler: either its host
spends extra time preparing its input before the step (``slow="input"``: Python/numpy work, no device op), or
its device does several times the others' compute (``slow="compute"``). The others wait for it inside the
all-reduce, so every process has the same step time.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xdiag.examples._common import run_steps
from xdiag.examples._data_parallel import AXIS, LEARNING_RATE, _shard_map

DEFAULT_STEPS = 5
WIDTH = 256
BASE_REPS = 10
SLOW_COMPUTE_REPS = 200  # ~20x the others' work: tens of ms of skew even on an idle machine
SLOW_INPUT_S = 0.03  # the slow process's host prepares its batch for this long before each step


@jax.jit
def _local_grad(w, x, reps):
    def body(i, g):
        return jnp.tanh(g @ w)

    return jax.lax.fori_loop(0, reps, body, x)


def _input_batch(seconds: float) -> np.ndarray:
    """Host-side batch preparation that takes `seconds` of Python/numpy time (no device op runs meanwhile)."""
    deadline = time.perf_counter() + seconds
    batch = np.ones((WIDTH, WIDTH), np.float32)
    while time.perf_counter() < deadline:
        batch = np.tanh(batch) * 1.0001
    return batch


def setup(slow: str):
    processes, me = jax.process_count(), jax.process_index()
    mesh = Mesh(np.array(jax.devices()), (AXIS,))
    sharding = NamedSharding(mesh, P(AXIS))
    device = jax.local_devices()[0]
    is_slow = me == processes - 1 and processes > 1

    def update(w, g):
        return w - LEARNING_RATE * jax.lax.psum(g, AXIS)

    update = jax.jit(_shard_map(update, mesh=mesh, in_specs=(P(AXIS), P(AXIS)), out_specs=P(AXIS)))
    w_local = jax.device_put(jnp.eye(WIDTH, dtype=jnp.float32), device)
    w = jax.make_array_from_single_device_arrays((processes * WIDTH, WIDTH), sharding, [w_local])
    reps = SLOW_COMPUTE_REPS if (is_slow and slow == "compute") else BASE_REPS
    input_s = SLOW_INPUT_S if (is_slow and slow == "input") else 0.0
    return {"update": update, "sharding": sharding, "device": device, "reps": reps, "input_s": input_s, "w": w,
            "shape": (processes * WIDTH, WIDTH)}


def step(state, i):
    batch = jax.device_put(_input_batch(state["input_s"]), state["device"])
    g = _local_grad(state["w"].addressable_data(0), batch, state["reps"])
    grads = jax.make_array_from_single_device_arrays(state["shape"], state["sharding"], [g])
    state["w"] = state["update"](state["w"], grads)
    return state


def run(setup, steps: int) -> None:
    run_steps(setup, step, steps)  # one process here: no straggler; the capture starts several of them
