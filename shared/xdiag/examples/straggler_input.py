"""Straggler by input: 2 processes (``jax.distributed``, gloo), the last one prepares each batch on its host for
~30 ms before its step; the other waits for it inside every all-reduce. See ``_distributed``.

What a profile shows (one ``*.xplane.pb`` per process in one session folder): equal step times on both hosts;
on the fast host the ``psum`` all-reduce takes most of the step (it arrives first and waits); on the slow host
the step is mostly time with no device op (host_other) and its all-reduce is short: it arrives last at every
instance.
"""

from __future__ import annotations

from xdiag.examples import _distributed
from xdiag.examples._distributed import DEFAULT_STEPS, step  # noqa: F401 (the workload interface)


def setup():
    return _distributed.setup("input")


def run(steps: int = DEFAULT_STEPS) -> None:
    _distributed.run(setup, steps)
