"""Straggler by compute: 2 processes (``jax.distributed``, gloo), the last one's device runs ~20x the others'
matmul chain each step; the other waits for it inside every all-reduce. See ``_distributed``.

What a profile shows (one ``*.xplane.pb`` per process in one session folder): equal step times on both hosts;
on the fast host the ``psum`` all-reduce takes most of the step; on the slow host dot/tanh fusions fill the step
and its all-reduce is short: it arrives last at every instance.
"""

from __future__ import annotations

from xdiag.examples import _distributed
from xdiag.examples._distributed import DEFAULT_STEPS, step  # noqa: F401 (the workload interface)


def setup():
    return _distributed.setup("compute")


def run(steps: int = DEFAULT_STEPS) -> None:
    _distributed.run(setup, steps)
