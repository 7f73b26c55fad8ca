"""``kv_decode`` with a smaller model (d_model 1024, 8 layers, 200 MB of bf16 weights): XLA:TPU's memory-space
assignment prefetches the weight tiles into VMEM with async copies (``copy-start``/``slice-start`` into ``S(1)``)
while the previous products run, so the matrix-vector fusions read VMEM and the HBM traffic is in the copies.

Problem: as in ``kv_decode``, batch-1 decoding streams every weight once per token at 2 FLOPs per weight byte; the
loop runs at the HBM roof. Its HBM bytes are the copies', not the fusions'.
"""

from __future__ import annotations

from xdiag.examples import kv_decode
from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = kv_decode.DEFAULT_STEPS
step = kv_decode.step


def setup():
    return kv_decode.make(1, sizes=pick(dict(d=256, layers=2, ctx=128), dict(d=1024, layers=8, ctx=512)))


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
