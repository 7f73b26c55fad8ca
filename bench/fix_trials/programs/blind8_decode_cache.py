"""Greedy decoding for a chat model: a decoder-only transformer (bfloat16 weights) generates one token per step for
a batch of conversations against a preallocated key/value cache (positions past the current one are masked); the
step updates the cache in place and returns the next tokens and their logits.

Variants:
  fixed: the key/value cache is held in bfloat16.
  bf16_cache_f32_attn: the cache is held in bfloat16 and converted to float32 for the attention products.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (language: chat decoding)"
VARIANTS = ["before", "fixed", "bf16_cache_f32_attn"]
TRACE_STEPS = 4
RTOL = 3e-2

BATCH = size(16, 2)
CTX = size(4096, 32)
LAYERS = size(4, 2)
D = size(2048, 32)
HEADS = size(16, 4)
DH = D // HEADS
VOCAB = size(32000, 64)
BF = jnp.bfloat16
CACHE_DTYPE = {"before": jnp.float32, "fixed": BF, "bf16_cache_f32_attn": BF}  # EDIT


def init(key):
    ks = jax.random.split(key, 1 + 4 * LAYERS)
    n = lambda k, s, fan: (jax.random.normal(k, s) / np.sqrt(fan)).astype(BF)
    layers = [{"qkv": n(ks[1 + 4 * i], (D, 3 * D), D), "o": n(ks[2 + 4 * i], (D, D), D),
               "up": n(ks[3 + 4 * i], (D, 4 * D), D), "down": n(ks[4 + 4 * i], (4 * D, D), 4 * D)}
              for i in range(LAYERS)]
    return {"emb": n(ks[0], (VOCAB, D), 1.0), "layers": layers}


def rms(x):
    return x * jax.lax.rsqrt(jnp.mean(x.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-6).astype(x.dtype)


def attend(q, k, v, pos, variant):
    if variant == "bf16_cache_f32_attn":  # EDIT
        k, v, q = k.astype(jnp.float32), v.astype(jnp.float32), q.astype(jnp.float32)  # EDIT
    s = jnp.einsum("bhd,bthd->bht", q.astype(k.dtype), k, preferred_element_type=jnp.float32) / np.sqrt(DH)
    s = jnp.where(jnp.arange(CTX)[None, None, :] <= pos, s, -1e30)
    w = jax.nn.softmax(s, -1)
    return jnp.einsum("bht,bthd->bhd", w.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(BF)


def build(variant):
    params = init(jax.random.key(5))
    cdt = CACHE_DTYPE[variant]
    kc = (jax.random.normal(jax.random.key(6), (LAYERS, 2, BATCH, CTX, HEADS, DH)) * 0.5).astype(BF).astype(cdt)
    pos0 = jnp.asarray(CTX // 2, jnp.int32)
    tok0 = jax.random.randint(jax.random.key(7), (BATCH,), 0, VOCAB)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(carry):
        cache, tok, pos, _ = carry
        x = params["emb"][tok]
        for i, lp in enumerate(params["layers"]):
            q, k, v = jnp.split(rms(x) @ lp["qkv"], 3, -1)
            new = jnp.stack([k, v]).reshape(2, BATCH, 1, HEADS, DH).astype(cdt)
            cache = jax.lax.dynamic_update_slice(cache, new[None], (i, 0, 0, pos, 0, 0))
            a = attend(q.reshape(BATCH, HEADS, DH), cache[i, 0], cache[i, 1], pos, variant)
            x = x + a.reshape(BATCH, D) @ lp["o"]
            x = x + jax.nn.gelu(rms(x) @ lp["up"]) @ lp["down"]
        logits = jnp.dot(rms(x), params["emb"].T, preferred_element_type=jnp.float32)
        return cache, jnp.argmax(logits, -1), (pos + 1) % CTX, logits

    carry0 = (kc, tok0, pos0, jnp.zeros((BATCH, VOCAB), jnp.float32))
    return step, carry0, {"units": BATCH, "unit": "tokens"}


def result(carry):
    return carry[3]
