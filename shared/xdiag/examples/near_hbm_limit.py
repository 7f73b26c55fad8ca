"""A compute-bound training step whose program holds ~86% of the device's memory (a large resident table).

Problem: a recommendation-style step: a bf16 embedding table sized to most of the device's memory (donated, so
XLA updates it in place), a gather of the batch's rows, and a bf16 MLP (d 4,096, 8 layers, batch 8,192) trained on
them with the sampled rows' gradients scattered back into the table. The arithmetic is healthy (large matrix
products); the risk is memory: the program's peak is ~86% of HBM, so a longer sequence, a bigger batch or a
fragmented heap ends in an out-of-memory error. Levers: shard or offload the table (host memory, another chip),
rematerialise activations (``jax.checkpoint``), smaller micro-batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8
TABLE_FRACTION = 0.80
"""The share of the device's memory the table takes (on a device that reports its limit); with the MLP's weights,
activations and gradients (~1 GiB) the program's peak is ~86% of a 16 GiB v5e."""
LAYERS = 8


def _sizes() -> tuple[int, int, int]:
    return pick((256, 512, 64), (8192, 4096, 2048))  # (batch, d_model, embedding dim)


def _table_rows(dim: int) -> int:
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    if not limit:
        return 4096  # a CPU reports no limit: a small table, the same program
    return int(limit * TABLE_FRACTION / (dim * 2)) // 1024 * 1024


def setup():
    batch, d, dim = _sizes()
    rows = _table_rows(dim)
    keys = iter(jax.random.split(jax.random.key(8), LAYERS + 4))
    table = jnp.zeros((rows, dim), jnp.bfloat16)
    proj = (jax.random.normal(next(keys), (dim, d)) / dim**0.5).astype(jnp.bfloat16)
    layers = [(jax.random.normal(next(keys), (d, d)) / d**0.5).astype(jnp.bfloat16) for _ in range(LAYERS)]
    target = jax.random.normal(next(keys), (batch, d), jnp.bfloat16)

    def loss(table_rows, proj, layers, target):
        h = table_rows @ proj
        for w in layers:
            h = jax.nn.relu(h @ w)
        return jnp.mean((h.astype(jnp.float32) - target) ** 2)

    def train_step(table, proj, layers, target, i):
        ids = jax.random.randint(jax.random.fold_in(jax.random.key(9), i), (batch,), 0, rows)
        rows_ = table[ids]
        value, (g_rows, g_proj, g_layers) = jax.value_and_grad(loss, argnums=(0, 1, 2))(rows_, proj, layers, target)
        table = table.at[ids].add(-1e-2 * g_rows.astype(table.dtype))
        proj = proj - 1e-3 * g_proj
        layers = [w - 1e-3 * g for w, g in zip(layers, g_layers)]
        return table, proj, layers, value

    return jax.jit(train_step, donate_argnums=(0, 1, 2)), (table, proj, layers), target


def step(state, i):
    train_step, (table, proj, layers), target = state
    table, proj, layers, _ = train_step(table, proj, layers, target, i)
    return train_step, (table, proj, layers), target


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
