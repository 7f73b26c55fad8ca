"""A mixture-of-experts feed-forward layer on JAX's Pallas grouped matmul (megablox ``gmm``), forward and backward.

Healthy: 8,192 tokens routed to 8 experts (uneven groups, as a router leaves them), d_model 2,048, expert hidden
size 4,096, bf16, 512-wide tiles. Per step the up and down grouped products and their backward are
2·T·D·F·2 FLOPs forward and twice that backward (~0.82 TFLOP), on MXU-bound kernels. The kernels' own cost
estimates are what a profile reader sees of them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from xdiag.examples._common import run_steps
from xdiag.examples._pallas_tpu import require_tpu

DEFAULT_STEPS = 8
TOKENS, D_MODEL, D_FF, EXPERTS = 8192, 2048, 4096, 8
TILING = (512, 512, 512)


def setup():
    require_tpu("megablox gmm")
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    sizes = np.array([1536, 512, 1024, 1024, 768, 1280, 1024, 1024], np.int32)  # sums to TOKENS, tile multiples
    assert sizes.sum() == TOKENS and len(sizes) == EXPERTS
    group_sizes = jnp.asarray(sizes)
    keys = jax.random.split(jax.random.key(6), 4)
    x = jax.random.normal(keys[0], (TOKENS, D_MODEL), jnp.bfloat16)
    w_up = (jax.random.normal(keys[1], (EXPERTS, D_MODEL, D_FF)) / D_MODEL**0.5).astype(jnp.bfloat16)
    w_down = (jax.random.normal(keys[2], (EXPERTS, D_FF, D_MODEL)) / D_FF**0.5).astype(jnp.bfloat16)
    target = jax.random.normal(keys[3], (TOKENS, D_MODEL), jnp.float32)

    def loss(w_up, w_down, x, target):
        h = jax.nn.gelu(gmm(x, w_up, group_sizes, preferred_element_type=jnp.bfloat16, tiling=TILING))
        y = gmm(h, w_down, group_sizes, preferred_element_type=jnp.float32, tiling=TILING)
        return jnp.mean((y - target) ** 2)

    @jax.jit
    def train_step(w_up, w_down, x, target):
        value, (g_up, g_down) = jax.value_and_grad(loss, argnums=(0, 1))(w_up, w_down, x, target)
        return w_up - 1e-3 * g_up.astype(w_up.dtype), w_down - 1e-3 * g_down.astype(w_down.dtype), value

    return train_step, (w_up, w_down), (x, target)


def step(state, i):
    train_step, (w_up, w_down), batch = state
    w_up, w_down, _ = train_step(w_up, w_down, *batch)
    return train_step, (w_up, w_down), batch


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
