"""Recompilation: a jitted step called with a new input shape every step.

Problem: the batch size changes every step (``BASE_BATCH + 8 * i``, as when
ragged data is not padded to a fixed set of shapes), so ``jax.jit`` misses
its cache and traces, lowers and XLA-compiles the step again each time.
Compilation, not the (small) training step, dominates.

What a profile shows: inside every ``train`` step annotation the ``python``
line has jax's trace/lower/compile path - ``$pjit.py ... cache_miss``,
``_pjit_call_impl_python``, ``$pxla.py ... compile``,
``$compiler.py ... compile_or_get_cached`` and the ``backend_compile_and_load``
event - taking ~90% of the step, and a compiler thread line
(``tf_PjRtCompilerThreadPool`` on CPU) shows ``PjRtCpuClient::Compile`` /
``CpuCompiler::RunBackend`` and the HLO pass pipeline each step. The
profile's metadata plane holds one ``jit_train_step`` HLO module per step
(a new program id each time); the step's own XLA ops take ~5% of the step.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import run_steps

DEFAULT_STEPS = 6
BASE_BATCH, FEATURES, HIDDEN = 64, 256, 512


def _loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    y = h @ params["w2"]
    return jnp.mean((y - x) ** 2)


@partial(jax.jit, donate_argnums=(0,))
def train_step(params, x):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss


def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "w2": jax.random.normal(k2, (HIDDEN, FEATURES)) / np.sqrt(HIDDEN),
    }
    return params, None


def step(state, i):
    params, _ = state
    batch = BASE_BATCH + 8 * i  # a shape never seen before -> recompile
    x = np.random.default_rng(i).standard_normal((batch, FEATURES), dtype=np.float32)
    params, loss = train_step(params, x)
    return params, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
