"""A training step that rematerialises every block although its activations fit many times over.

Problem: an MLP of tanh blocks, each under ``jax.checkpoint`` (the default policy saves nothing), so the backward
pass re-runs every block's forward matmul before differentiating it: about a third of the step's matmul work is
recomputation. The step's peak (weights, their gradients, one batch of activations per block) is a small part of
the device's memory: nothing needs the recomputation to fit.

What a profile shows: ops whose framework op carries ``rematted_computation`` (JAX's mark of what jax.checkpoint
recomputes) take a material share of op time, while the memory profile's peak sits far under the capacity.

Fix: drop jax.checkpoint on blocks whose activations fit, or give it a policy that saves the matmul outputs
(``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 10
LEARNING_RATE = 1e-3


def _sizes() -> tuple[int, int, int]:
    # (batch, width, blocks): ~0.1 s per step on a 2-core CPU; on a TPU v5e ~2 TFLOP a step, under 2 GiB of HBM.
    return pick((256, 512, 4), (8192, 4096, 8))


def _block(w, h):
    # Two products per block: the backward pass needs the inner one's output, which jax.checkpoint recomputes.
    return jnp.tanh(jnp.tanh(h @ w) @ w.T)


def _loss(weights, x):
    h = x
    for w in weights:
        h = jax.checkpoint(_block)(w, h)
    return jnp.mean(h**2)


@jax.jit
def train_step(weights, x):
    loss, grads = jax.value_and_grad(_loss)(weights, x)
    return [w - LEARNING_RATE * g for w, g in zip(weights, grads)], loss


def setup():
    batch, width, blocks = _sizes()
    dtype = pick(jnp.float32, jnp.bfloat16)
    keys = jax.random.split(jax.random.key(0), blocks + 1)
    weights = [(jax.random.normal(k, (width, width)) / jnp.sqrt(width)).astype(dtype) for k in keys[:-1]]
    return weights, jax.random.normal(keys[-1], (batch, width)).astype(dtype), None


def step(state, i):
    weights, x, _ = state
    weights, loss = train_step(weights, x)
    return weights, x, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
