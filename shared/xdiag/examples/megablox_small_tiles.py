"""A grouped matmul (megablox ``gmm``, Pallas) with 128x128x128 tiles: 4,096 tokens over 16 experts.

Problem: [4096,1024] tokens times 16 experts' [1024,2048] bf16 weights, in equal groups, with the library's
smallest tiling: each 128-wide tile re-reads its operands from HBM, so the kernel's own cost estimate puts it under
the ridge point, and it runs far below the HBM roof (28%). Larger tiles (512) re-read less and reach the MXU. The
step is one 1.5 ms call blocked on each time, so the host's turn between calls shows too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 6
TOKENS, D_MODEL, D_FF, EXPERTS = 4096, 1024, 2048, 16


def setup():
    require_tpu("megablox gmm")
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    sizes = jnp.full((EXPERTS,), TOKENS // EXPERTS, jnp.int32)
    keys = jax.random.split(jax.random.key(2), 2)
    x = jax.random.normal(keys[0], (TOKENS, D_MODEL), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (EXPERTS, D_MODEL, D_FF)) / 32).astype(jnp.bfloat16)
    grouped = jax.jit(lambda x, w: gmm(x, w, sizes, preferred_element_type=jnp.bfloat16, tiling=(128, 128, 128)))
    return grouped, (x, w), None


def step(state, i):
    grouped, arrays, _ = state
    return grouped, arrays, grouped(*arrays)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
