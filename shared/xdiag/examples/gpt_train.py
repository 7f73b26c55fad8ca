"""A GPT-style decoder's training step (bf16, causal attention, MLP, SGD) in one jit, its attention materialised.

Embedding, 4 pre-norm decoder blocks (d_model 1024, 8 heads of 128, MLP 4x), tied output projection, cross-entropy,
backward pass and update; the matmuls run near the roof. Problem: attention as einsum + softmax + einsum writes each
layer's [16, 8, 1024, 1024] scores to HBM and back (34% of op time on a v5e): bytes a fused kernel never moves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xdiag.examples._common import pick, run_steps

DEFAULT_STEPS = 8


def _sizes() -> dict:
    return pick(
        dict(vocab=1024, d=128, heads=2, layers=2, seq=128, batch=4),
        dict(vocab=16384, d=1024, heads=8, layers=4, seq=1024, batch=16),
    )


def _rms_norm(x):
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True) + 1e-6).astype(x.dtype)


def _block(p, x, heads):
    b, s, d = x.shape
    h = _rms_norm(x)
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads).astype(x.dtype)
    mask = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(mask, scores.astype(jnp.float32), -1e9)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1).astype(x.dtype), v).reshape(b, s, d)
    x = x + attn @ p["proj"]
    return x + jax.nn.gelu(_rms_norm(x) @ p["up"]) @ p["down"]


def _loss(params, tokens, heads):
    x = params["embed"][tokens[:, :-1]]
    for p in params["blocks"]:
        x = _block(p, x, heads)
    logits = (_rms_norm(x) @ params["embed"].T).astype(jnp.float32)
    targets = tokens[:, 1:]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))


def setup():
    c = _sizes()
    d = c["d"]
    keys = iter(jax.random.split(jax.random.key(0), 4 * c["layers"] + 2))

    def init(shape):
        return (jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)

    params = {
        "embed": init((c["vocab"], d)),
        "blocks": [
            {"qkv": init((d, 3 * d)), "proj": init((d, d)), "up": init((d, 4 * d)), "down": init((4 * d, d))}
            for _ in range(c["layers"])
        ],
    }
    tokens = jax.random.randint(next(keys), (c["batch"], c["seq"] + 1), 0, c["vocab"])

    @jax.jit
    def train_step(params, tokens):
        loss, grads = jax.value_and_grad(_loss)(params, tokens, c["heads"])
        return jax.tree.map(lambda w, g: w - 1e-3 * g.astype(w.dtype), params, grads), loss

    return train_step, params, tokens, None


def step(state, i):
    train_step, params, tokens, _ = state
    params, loss = train_step(params, tokens)
    return train_step, params, tokens, loss


def run(steps: int = DEFAULT_STEPS) -> None:
    run_steps(setup, step, steps)
