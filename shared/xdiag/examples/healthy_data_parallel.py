"""Healthy data parallelism on 2 devices: compute dominates, the gradient all-reduce is small.

Problem: none. The same data-parallel step as ``collective_dominated`` (per-device forward/backward over its batch
shard, gradients all-reduced with ``psum`` under ``shard_map``), but each device does a large matmul pass (8192 rows
× 512-wide weights on CPU) and all-reduces only its 1 MB weight gradient. The capture runs one XLA thread per
device, so the two devices do not take turns on a shared thread pool and wait for each other.

What a profile shows: on both devices (``device_ordinal`` 0..1 on the XLA threads) dot fusions fill nearly the
whole step; the all-reduce, waiting included, is a few percent of it. A diagnosis must stay OPTIMAL.
"""

from __future__ import annotations

from xdiag.examples import _data_parallel as data_parallel
from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6
DEVICES = 2


def setup():
    return data_parallel.setup(
        data_parallel.mesh_of(DEVICES), batch_per_device=pick(8192, 16384), width=pick(512, 4096),
        micro_batches=1, extra_grad_elements=0,
    )


step = data_parallel.step


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
