"""Layout copies: the step materialises transposed copies of big 4-D tensors.

Problem: an attention-style block computes its activation in
``[batch, heads, seq, dim]`` (BHSD) layout with a small per-head projection
(a ``dim x dim`` matmul), but the surrounding code wants the same tensor in
other layouts - BSHD (heads merged for the output projection), BHDS (a
"K-transposed" cache) and BDSH (channels-first) - so each step returns
``jnp.swapaxes``/``jnp.transpose`` copies of it. A jit output must be a
dense row-major array, so XLA has to materialise every one of them as a
physical transpose that moves the whole tensor without changing a value.
(``jax.lax.optimization_barrier`` is not enough for this on XLA:CPU, which
removes barriers before layout assignment and then folds the permutations
into layouts, so the outputs are what pins them.)

What a profile shows: per step one small ``dot``-type op (``ynn_fusion`` on
CPU, a gemm on GPU) and a ``relu`` fusion (``maximum_bitcast_fusion``),
followed by the layout ops: on CPU three ``bitcast_transpose_fusion.N``
(HLO fusions of a single ``transpose``, ``op_name=jit(train_step)/transpose``)
and three ``wrapped_copy.N`` (HLO ``copy`` into the row-major output
layout); transpose/copy kernels on GPU. On CPU the layout ops take ~70-75% of
the step's XLA op time, the matmul <10%.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 15


def _shape() -> tuple[int, int, int, int]:
    # [batch, heads, seq, dim]: 4M f32 elements (16 MB) on CPU, 64M on GPU.
    return pick((8, 16, 512, 64), (32, 32, 1024, 64))


@partial(jax.jit, donate_argnums=(0,))
def train_step(x, w):
    b, h, s, d = x.shape
    y = (jax.nn.relu(x).reshape(b * h * s, d) @ w).reshape(b, h, s, d)  # small per-head projection
    bshd = jnp.swapaxes(y, 1, 2)  # heads merged for an output projection
    bhds = jnp.swapaxes(y, 2, 3)  # "K^T" cache layout
    bdsh = jnp.transpose(y, (0, 3, 2, 1))  # channels-first
    return y, bshd, bhds, bdsh


def setup():
    b, h, s, d = _shape()
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (b, h, s, d), jnp.float32)
    w = jax.random.normal(k2, (d, d), jnp.float32) / jnp.sqrt(d)
    return x, w, None


def step(state, i):
    x, w, _ = state
    y, *views = train_step(x, w)
    return y, w, views


@partial(jax.jit, donate_argnums=(0,))
def train_step_fixed(x, w):
    """The fix: the other layouts are consumed inside the jit (here by the reductions that use them), so XLA folds
    each permutation into its consumer's indexing instead of materialising a transposed copy as an output."""
    b, h, s, d = x.shape
    y = (jax.nn.relu(x).reshape(b * h * s, d) @ w).reshape(b, h, s, d)
    bshd = jnp.swapaxes(y, 1, 2)
    bhds = jnp.swapaxes(y, 2, 3)
    bdsh = jnp.transpose(y, (0, 3, 2, 1))
    return y, (bshd.sum(axis=1), bhds.sum(axis=3), bdsh.sum(axis=3))


def fixed_step(state, i):
    """`step` with the fix applied (for before/after comparisons: `python -m xdiag.examples NAME --fixed`)."""
    x, w, _ = state
    y, views = train_step_fixed(x, w)
    return y, w, views


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
