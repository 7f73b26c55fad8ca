"""``decode_streamed`` at batch 64: the same streamed weight reads serve 64 sequences (64x the FLOPs per byte)."""

from __future__ import annotations

from xdiag.examples import decode_streamed
from xdiag.examples._common import run_steps

DEFAULT_STEPS = decode_streamed.DEFAULT_STEPS
BATCH = 64
step = decode_streamed.step


def setup():
    return decode_streamed.make(BATCH)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
