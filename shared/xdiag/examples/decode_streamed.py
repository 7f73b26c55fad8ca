"""Batch-1 decoding with the layers under ``lax.scan``: stacked weights, each layer's slice streamed into VMEM.

Problem: as in ``kv_decode``, each generated token multiplies one activation row by every weight, so the loop
reads all the weights from HBM once per token at 2 FLOPs per weight byte. Here the layers are one ``lax.scan`` over
stacked weights (as MaxText and most JAX LLM code write them): XLA:TPU's memory-space assignment starts each
layer's weight slices on their way into VMEM (``copy-start``/``slice-start`` into ``S(1)`` arrays) while the
previous layer computes, and the matrix-vector fusions read VMEM. The HBM traffic is in those async copies, not in
the fusions; the loop runs at the HBM roof when the copies keep up. The cure is more tokens per weight read
(batching, speculative decoding) or fewer weight bytes (int8/fp8). ``decode_streamed_b64`` is the same model at
batch 64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps
from xdiag.examples.kv_decode import decode_step

DEFAULT_STEPS = 6
BATCH = 1
NEW_TOKENS = 16


def _sizes() -> dict:
    return pick(dict(d=256, layers=2, ctx=64), dict(d=1024, layers=24, ctx=512))


def make(batch: int):
    c = _sizes()
    d, layers, ctx = c["d"], c["layers"], c["ctx"]
    heads = max(d // 128, 1)
    hd = d // heads
    keys = iter(jax.random.split(jax.random.key(1), 6))

    def init(shape):
        return (jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(shape[-2])).astype(jnp.bfloat16)

    params = {"qkv": init((layers, d, 3 * d)), "o": init((layers, d, d)), "up": init((layers, d, 4 * d)),
              "down": init((layers, 4 * d, d))}
    cache = jnp.zeros((layers, 2, batch, ctx, heads, hd), jnp.bfloat16)

    @functools.partial(jax.jit, donate_argnums=1)
    def generate(params, cache, x, start):
        def one_token(t, carry):
            x, cache = carry
            pos = start + t

            def layer(x, inputs):
                p, kv = inputs
                q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
                q, k, v = (a.reshape(batch, heads, hd) for a in (q, k, v))
                kv = kv.at[0, :, pos].set(k).at[1, :, pos].set(v)
                s = jnp.einsum("bhd,bthd->bht", q, kv[0]).astype(jnp.float32) / jnp.sqrt(hd)
                s = jnp.where(jnp.arange(ctx) <= pos, s, -1e9)
                a = jnp.einsum("bht,bthd->bhd", jax.nn.softmax(s, -1).astype(x.dtype), kv[1]).reshape(batch, d)
                x = x + a @ p["o"]
                x = x + jax.nn.gelu(x @ p["up"]) @ p["down"]
                return x, kv

            x, cache = jax.lax.scan(layer, x, (params, cache))
            return x, cache

        return jax.lax.fori_loop(0, NEW_TOKENS, one_token, (x, cache))

    x = jax.random.normal(next(keys), (batch, d), jnp.bfloat16)
    return generate, params, cache, x


def setup():
    return make(BATCH)


def step(state, i):
    return decode_step(state, i, NEW_TOKENS)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
