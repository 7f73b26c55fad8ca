"""Greedy token-by-token generation with an 8-layer decoder-only language model, raw JAX with a bfloat16 policy.

The model (width 2,048, 16 heads, MLP 8,192, vocabulary 32,000, tied embeddings, RMSNorm, rotary-free learned
positions) keeps its checkpoint parameters in float32 and computes in bfloat16 under a mixed-precision policy, as
it was trained. A key/value cache in bfloat16 holds 1,024 positions for a batch of 8 sequences whose 256-token
prompts are already in it. Each step decodes one token for every sequence: it embeds the last tokens, attends over
the cache, writes the new keys and values, and picks the next tokens greedily. Variants:
  fixed    the parameters cast to bfloat16 once when the server loads them, the decode step computing with those
  donate   the cache buffers donated to the jitted decode step
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "serving (autoregressive decode)"
VARIANTS = ["before", "fixed", "donate"]
BATCH, LAYERS, WIDTH, HEADS, MLP = size(8, 2), size(8, 2), size(2048, 64), size(16, 4), size(8192, 128)
VOCAB, MAXLEN, PROMPT = size(32000, 97), size(1024, 64), size(256, 16)
HEAD = WIDTH // HEADS
COMPUTE = jnp.bfloat16


def init_params(key):
    keys = jax.random.split(key, 2 + LAYERS)
    s = 1 / np.sqrt(WIDTH)
    layers = []
    for k in keys[2:]:
        k1, k2, k3, k4 = jax.random.split(k, 4)
        layers.append({"qkv": jax.random.normal(k1, (WIDTH, 3 * WIDTH)) * s,
                       "o": jax.random.normal(k2, (WIDTH, WIDTH)) * s,
                       "up": jax.random.normal(k3, (WIDTH, MLP)) * s,
                       "down": jax.random.normal(k4, (MLP, WIDTH)) / np.sqrt(MLP),
                       "n1": jnp.ones((WIDTH,)), "n2": jnp.ones((WIDTH,))})
    return {"embed": jax.random.normal(keys[0], (VOCAB, WIDTH)) * 0.02,
            "pos": jax.random.normal(keys[1], (MAXLEN, WIDTH)) * 0.02,
            "norm": jnp.ones((WIDTH,)), "layers": layers}


def cast_to_compute(params):
    return jax.tree.map(lambda p: p.astype(COMPUTE), params)


def rms(x, g):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt((xf * xf).mean(-1, keepdims=True) + 1e-6)).astype(COMPUTE) * g


def decode(params, cache, tokens, pos):
    """tokens: (batch,) int32 at position pos; cache: list of (k, v) of (batch, MAXLEN, heads, head)."""
    p = cast_to_compute(params)
    x = p["embed"][tokens] + p["pos"][pos]
    visible = (jnp.arange(MAXLEN) <= pos)[None, None, :]
    new_cache = []
    for lp, (kc, vc) in zip(p["layers"], cache):
        q, k, v = jnp.split(rms(x, lp["n1"]) @ lp["qkv"], 3, axis=-1)
        kc = jax.lax.dynamic_update_slice(kc, k.reshape(BATCH, 1, HEADS, HEAD), (0, pos, 0, 0))
        vc = jax.lax.dynamic_update_slice(vc, v.reshape(BATCH, 1, HEADS, HEAD), (0, pos, 0, 0))
        s = jnp.einsum("bhd,bthd->bht", q.reshape(BATCH, HEADS, HEAD), kc, preferred_element_type=jnp.float32)
        a = jax.nn.softmax(jnp.where(visible, s / np.sqrt(HEAD), -1e30), axis=-1).astype(COMPUTE)
        x = x + jnp.einsum("bht,bthd->bhd", a, vc).reshape(BATCH, WIDTH) @ lp["o"]
        x = x + jax.nn.gelu(rms(x, lp["n2"]) @ lp["up"]) @ lp["down"]
        new_cache.append((kc, vc))
    logits = jnp.dot(rms(x, p["norm"]), p["embed"].T, preferred_element_type=jnp.float32)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits, new_cache


decode_step = jax.jit(decode)
decode_donated = jax.jit(decode, donate_argnums=(1,))  # EDIT


def result(carry):
    _, _, tokens, logits, pos = carry
    return tokens, logits, pos


def build(variant):
    kp, kc, kt = jax.random.split(jax.random.key(2048), 3)
    params = init_params(kp)
    if variant == "fixed":  # EDIT
        params = jax.jit(cast_to_compute)(params)  # EDIT
    ck = jax.random.split(kc, 2 * LAYERS)
    valid = (jnp.arange(MAXLEN) < PROMPT)[None, :, None, None]
    cache = [tuple(jnp.where(valid, jax.random.normal(ck[2 * i + j], (BATCH, MAXLEN, HEADS, HEAD)), 0)
                   .astype(COMPUTE) for j in range(2)) for i in range(LAYERS)]
    tokens = jax.random.randint(kt, (BATCH,), 0, VOCAB, jnp.int32)
    fn = decode_donated if variant == "donate" else decode_step  # EDIT

    def step(carry):
        params, cache, tokens, _, pos = carry
        tokens, logits, cache = fn(params, cache, tokens, pos)
        return params, cache, tokens, logits, pos + 1

    return step, (params, cache, tokens, jnp.zeros((BATCH, VOCAB)), jnp.asarray(PROMPT, jnp.int32)), \
        {"units": BATCH, "unit": "tokens"}
