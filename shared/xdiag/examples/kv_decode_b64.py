"""``kv_decode`` at batch 64: the same weights read once per token serve 64 sequences (see kv_decode)."""

from __future__ import annotations

from xdiag.examples import kv_decode
from xdiag.examples._common import run_steps

DEFAULT_STEPS = kv_decode.DEFAULT_STEPS
BATCH = 64
step = kv_decode.step


def setup():
    # A quarter of kv_decode's context, so that 64 sequences' caches fit a 16 GiB chip beside the weights.
    return kv_decode.make(BATCH, ctx=max(kv_decode._sizes()["ctx"] // 4, 2 * kv_decode.NEW_TOKENS))


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
