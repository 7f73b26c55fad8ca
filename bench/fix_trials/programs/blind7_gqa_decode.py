"""Batched greedy decoding for a grouped-query-attention transformer (8 query heads share each key/value head).

The key/value cache holds a long prompt already prefilled; each step decodes one token for every sequence: the
layers attend over the fixed-size cache (masked past the current position), write the new keys and values in
place (the carry is donated), and pick the next token by argmax.

Variants:
  fixed: the queries are grouped per key/value head, and attention contracts them directly against the cache.
  expanded_cache: the cache stores keys and values already expanded to every query head.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (language, batched decoding)"
VARIANTS = ["before", "fixed", "expanded_cache"]
TRACE_STEPS = 3

BATCH = size(16, 2)
MAX_LEN = size(4096, 64)
PROMPT = MAX_LEN - size(256, 8)
DIM = size(2048, 64)
HEADS = size(16, 4)
KV_HEADS = 2
HEAD_DIM = DIM // HEADS
REP = HEADS // KV_HEADS
FFN = size(5632, 96)
LAYERS = size(8, 2)
VOCAB = size(32000, 128)
DTYPE = size(jnp.bfloat16, jnp.float32)  # float32 on the CPU so variants compare exactly


def init_params(key):
    ks = iter(jax.random.split(key, 4 + 6 * LAYERS))
    nrm = lambda shape, fan: (jax.random.normal(next(ks), shape, jnp.float32) / np.sqrt(fan)).astype(DTYPE)
    layers = [{"wq": nrm((DIM, DIM), DIM), "wk": nrm((DIM, KV_HEADS * HEAD_DIM), DIM),
               "wv": nrm((DIM, KV_HEADS * HEAD_DIM), DIM), "wo": nrm((DIM, DIM), DIM),
               "up": nrm((DIM, 2 * FFN), DIM), "down": nrm((FFN, DIM), FFN)} for _ in range(LAYERS)]
    return {"emb": nrm((VOCAB, DIM), 1.0), "head": nrm((DIM, VOCAB), DIM), "layers": layers}


def rms_norm(x):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6)).astype(DTYPE)


def attend(variant, q, ck, cv, pos):
    """q: (B, HEADS, HEAD_DIM); ck, cv: the layer's cache. Returns (B, HEADS, HEAD_DIM)."""
    valid = jnp.arange(MAX_LEN) <= pos
    if variant == "before":  # EDIT
        k = jnp.repeat(ck, REP, axis=1)  # (B, HEADS, T, HEAD_DIM)  # EDIT
        v = jnp.repeat(cv, REP, axis=1)  # EDIT
        s = jnp.einsum("bhd,bhtd->bht", q, k, preferred_element_type=jnp.float32)  # EDIT
        p = jax.nn.softmax(jnp.where(valid, s / np.sqrt(HEAD_DIM), -jnp.inf), -1)  # EDIT
        return jnp.einsum("bht,bhtd->bhd", p.astype(DTYPE), v)  # EDIT
    if variant == "fixed":  # EDIT
        qg = q.reshape(q.shape[0], KV_HEADS, REP, HEAD_DIM)  # EDIT
        s = jnp.einsum("bgrd,bgtd->bgrt", qg, ck, preferred_element_type=jnp.float32)  # EDIT
        p = jax.nn.softmax(jnp.where(valid, s / np.sqrt(HEAD_DIM), -jnp.inf), -1)  # EDIT
        return jnp.einsum("bgrt,bgtd->bgrd", p.astype(DTYPE), cv).reshape(q.shape)  # EDIT
    s = jnp.einsum("bhd,bhtd->bht", q, ck, preferred_element_type=jnp.float32)  # EDIT
    p = jax.nn.softmax(jnp.where(valid, s / np.sqrt(HEAD_DIM), -jnp.inf), -1)  # EDIT
    return jnp.einsum("bht,bhtd->bhd", p.astype(DTYPE), cv)  # EDIT


def decode_step(variant, params, carry):
    caches, token, pos, _ = carry
    b = token.shape[0]
    h = params["emb"][token]
    new_caches = []
    for lp, (ck, cv) in zip(params["layers"], caches):
        x = rms_norm(h)
        q = (x @ lp["wq"]).reshape(b, HEADS, HEAD_DIM)
        k = (x @ lp["wk"]).reshape(b, KV_HEADS, 1, HEAD_DIM)
        v = (x @ lp["wv"]).reshape(b, KV_HEADS, 1, HEAD_DIM)
        if variant == "expanded_cache":  # EDIT
            k, v = jnp.repeat(k, REP, axis=1), jnp.repeat(v, REP, axis=1)  # EDIT
        ck = jax.lax.dynamic_update_slice(ck, k, (0, 0, pos, 0))
        cv = jax.lax.dynamic_update_slice(cv, v, (0, 0, pos, 0))
        new_caches.append((ck, cv))
        h = h + attend(variant, q, ck, cv, pos).reshape(b, DIM) @ lp["wo"]
        gate, up = jnp.split(rms_norm(h) @ lp["up"], 2, -1)
        h = h + (jax.nn.silu(gate) * up) @ lp["down"]
    logits = rms_norm(h) @ params["head"]
    nxt = jnp.argmax(logits, -1).astype(jnp.int32)
    return new_caches, nxt, jnp.minimum(pos + 1, MAX_LEN - 1), logits.astype(jnp.float32)


def build(variant):
    params = init_params(jax.random.key(0))
    kv_heads = HEADS if variant == "expanded_cache" else KV_HEADS  # EDIT
    caches = []
    for i in range(LAYERS):
        kk, kv = jax.random.split(jax.random.key(100 + i))
        shape = (BATCH, KV_HEADS, MAX_LEN, HEAD_DIM)
        ck = jax.random.normal(kk, shape, jnp.float32).astype(DTYPE)  # the prefilled prompt's keys and values
        cv = jax.random.normal(kv, shape, jnp.float32).astype(DTYPE)
        caches.append((jnp.repeat(ck, kv_heads // KV_HEADS, axis=1), jnp.repeat(cv, kv_heads // KV_HEADS, axis=1)))
    token0 = jax.random.randint(jax.random.key(7), (BATCH,), 0, VOCAB)
    carry0 = (caches, token0, jnp.int32(PROMPT), jnp.zeros((BATCH, VOCAB), jnp.float32))
    decode = jax.jit(lambda p, c: decode_step(variant, p, c), donate_argnums=1)
    return (lambda carry: decode(params, carry)), carry0, {"units": BATCH, "unit": "tokens decoded"}


def result(carry):
    _, token, pos, logits = carry
    return token, pos, logits
