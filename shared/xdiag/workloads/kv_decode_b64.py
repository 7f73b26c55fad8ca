"""``kv_decode`` at batch 64: the same weights read once per token serve 64 sequences (see kv_decode)."""

from __future__ import annotations

from xdiag.workloads import kv_decode
from xdiag.workloads._common import run_steps

DEFAULT_STEPS = kv_decode.DEFAULT_STEPS
BATCH = 64
step = kv_decode.step


def setup():
    return kv_decode.make(BATCH)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
