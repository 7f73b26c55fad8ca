"""Collective-dominated data parallelism on 8 devices: every device spends most of each step in all-reduce.

Problem: a data-parallel step over 8 devices (``--xla_force_host_platform_device_count=8`` on CPU) where each
device computes a small gradient (one 128-wide matmul pass on its shard) and all-reduces it together with a large
extra gradient buffer (4 M floats, e.g. embedding tables) for each of 4 micro-batches, inside a ``lax.scan``. The
communication volume per step dwarfs the math.

What a profile shows: on every device (``device_ordinal`` 0..7 on the XLA threads) the ``psum`` all-reduce ops
(with their rendezvous waits) take most of the step; they run inside the scan's ``while`` op, which encloses them
and must not turn their time into compute. Small dot/tanh fusions run in between.
"""

from __future__ import annotations

from xdiag.examples import _data_parallel as data_parallel
from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6
DEVICES = 8


def setup():
    return data_parallel.setup(
        data_parallel.mesh_of(DEVICES), batch_per_device=pick(64, 1024), width=pick(128, 1024),
        micro_batches=2, extra_grad_elements=pick(1 << 20, 1 << 26),
    )


step = data_parallel.step


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
