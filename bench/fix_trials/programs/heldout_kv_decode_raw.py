"""Greedy token-by-token generation with a decoder-only transformer in raw JAX (bf16), using a preallocated
key/value cache (batch, heads, positions, head dim) that each step writes its new keys and values into.

As its user wrote it: batch 32, cache of 4,096 positions, 4 layers, width 2,048, 16 heads of 128, vocabulary
32,768; attention over the whole cache with the positions not yet written masked out. One program step generates
one token for every sequence. Variants:
  fixed   the cache passed to the jitted decode step with donate_argnums
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (decode)"
VARIANTS = ["before", "fixed"]
BATCH, MAXLEN, LAYERS, D, HEADS, VOCAB = size(32, 2), size(4096, 64), size(4, 2), size(2048, 64), size(16, 4), \
    size(32768, 256)
DH = D // HEADS


def rms_norm(x, g):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(jnp.bfloat16)


def decode_step(params, cache, token, pos):
    x = params["embed"][token]  # (B, D)
    valid = jnp.arange(MAXLEN) <= pos
    new_cache = []
    for p, (kc, vc) in zip(params["layers"], cache):
        h = rms_norm(x, p["ln1"])
        q, k, v = (a.reshape(BATCH, HEADS, DH) for a in jnp.split(h @ p["wqkv"], 3, axis=-1))
        kc = kc.at[:, :, pos].set(k)
        vc = vc.at[:, :, pos].set(v)
        new_cache.append((kc, vc))
        s = jnp.einsum("bhd,bhtd->bht", q, kc, preferred_element_type=jnp.float32) / jnp.sqrt(DH)
        s = jnp.where(valid[None, None], s, -1e9)
        a = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        x = x + jnp.einsum("bht,bhtd->bhd", a, vc).reshape(BATCH, D) @ p["wo"]
        h = rms_norm(x, p["ln2"])
        x = x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
    logits = jnp.dot(rms_norm(x, params["ln_f"]), params["unembed"], preferred_element_type=jnp.float32)
    return new_cache, jnp.argmax(logits, axis=-1).astype(jnp.int32), (pos + 1) % MAXLEN


def build(variant):
    ks = iter(jax.random.split(jax.random.key(17), 6 * LAYERS + 8))

    def w(shape):
        return (jax.random.normal(next(ks), shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)

    params = {"embed": w((VOCAB, D)), "unembed": w((D, VOCAB)), "ln_f": jnp.ones((D,), jnp.float32),
              "layers": [{"ln1": jnp.ones((D,), jnp.float32), "ln2": jnp.ones((D,), jnp.float32),
                          "wqkv": w((D, 3 * D)), "wo": w((D, D)), "w1": w((D, 4 * D)), "w2": w((4 * D, D))}
                         for _ in range(LAYERS)]}
    prompt_len = MAXLEN // 2
    fill = jnp.arange(MAXLEN)[None, None, :, None] < prompt_len
    cache = [tuple(jnp.where(fill, jax.random.normal(next(ks), (BATCH, HEADS, MAXLEN, DH), jnp.bfloat16), 0)
                   for _ in range(2)) for _ in range(LAYERS)]
    token = jax.random.randint(next(ks), (BATCH,), 0, VOCAB)

    if variant == "fixed":  # EDIT
        fn = jax.jit(decode_step, donate_argnums=(1,))  # EDIT
    else:
        fn = jax.jit(decode_step)

    def step(carry):
        cache, token, pos = carry
        return fn(params, cache, token, pos)

    return step, (cache, token, jnp.int32(prompt_len)), {"units": BATCH, "unit": "tokens"}
