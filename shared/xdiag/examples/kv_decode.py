"""Autoregressive decoding with a KV cache under ``lax.fori_loop`` (one program generates 32 tokens).

Problem: at batch 1 each generated token multiplies one activation row by every weight matrix: the loop streams
all the weights (~0.8 GB bf16) from HBM once per token and does 2 FLOPs per weight byte. The loop body runs at the
HBM bandwidth roof; nothing is wasted per pass, and the cure is not fusion but more tokens per weight read
(batching requests, speculative decoding) or fewer bytes per weight (int8/fp8 weights). ``kv_decode_b64`` is the
same model at batch 64: 64x the FLOPs for the same weight bytes.

The loop (``while``) wraps every op of its body: its own time is only the loop's control, not its body's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 6
BATCH = 1
NEW_TOKENS = 32


def _sizes() -> dict:
    return pick(dict(d=256, layers=2, ctx=128), dict(d=2048, layers=8, ctx=1024))


def make(batch: int, ctx: int | None = None, sizes: dict | None = None):
    c = sizes or _sizes()
    d, layers, ctx = c["d"], c["layers"], ctx or c["ctx"]
    heads = d // 128 if d >= 128 else 1
    keys = iter(jax.random.split(jax.random.key(0), 4 * layers + 2))

    def init(shape):
        return (jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)

    params = [{"qkv": init((d, 3 * d)), "o": init((d, d)), "up": init((d, 4 * d)), "down": init((4 * d, d))}
              for _ in range(layers)]
    cache = jnp.zeros((layers, 2, batch, ctx, heads, d // heads), jnp.bfloat16)

    @functools.partial(jax.jit, donate_argnums=1)
    def generate(params, cache, x, start):
        def one_token(t, carry):
            x, cache = carry
            pos = start + t
            for li, p in enumerate(params):
                q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
                q, k, v = (a.reshape(batch, heads, d // heads) for a in (q, k, v))
                cache = cache.at[li, 0, :, pos].set(k).at[li, 1, :, pos].set(v)
                keys_, values = cache[li, 0], cache[li, 1]
                s = jnp.einsum("bhd,bthd->bht", q, keys_).astype(jnp.float32) / jnp.sqrt(d // heads)
                s = jnp.where(jnp.arange(ctx) <= pos, s, -1e9)
                a = jnp.einsum("bht,bthd->bhd", jax.nn.softmax(s, -1).astype(x.dtype), values).reshape(batch, d)
                x = x + a @ p["o"]
                x = x + jax.nn.gelu(x @ p["up"]) @ p["down"]
            return x, cache

        return jax.lax.fori_loop(0, NEW_TOKENS, one_token, (x, cache))

    x = jax.random.normal(next(keys), (batch, d), jnp.bfloat16)
    return generate, params, cache, x


def setup():
    return make(BATCH)


def decode_step(state, i, new_tokens: int):
    """One call of a `generate` built like make()'s: `new_tokens` tokens from a start that walks the cache."""
    generate, params, cache, x = state
    ctx = cache.shape[3]
    start = (i * new_tokens) % (ctx - new_tokens)
    x, cache = generate(params, cache, x, start)
    return generate, params, cache, x


def step(state, i):
    return decode_step(state, i, NEW_TOKENS)


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
