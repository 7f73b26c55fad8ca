"""Greedy text generation with a small decoder-only transformer: a batch of prompts is extended token by token
with the most likely next token, all on the device inside one jitted call.

Variants:
  fixed: keys and values are kept in a per-layer cache; the prompt is run once, then one position per new token.
  cache_stream: keys and values are kept in a per-layer cache, filled one position at a time from the first prompt
    token on.
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (language, greedy decoding)"
VARIANTS = ["before", "fixed", "cache_stream"]
TRACE_STEPS = 2

VOCAB = size(8192, 64)
D = size(512, 32)
HEADS = size(8, 2)
LAYERS = size(4, 2)
BATCH = size(8, 2)
PROMPT = size(128, 6)
NEW = size(128, 6)
T = PROMPT + NEW
HD = D // HEADS


def init_params():
    keys = jax.random.split(jax.random.key(1), 2 + 4 * LAYERS)
    s = D ** -0.5
    p = {"embed": jax.random.normal(keys[0], (VOCAB, D)) * 0.5,
         "pos": jax.random.normal(keys[1], (T, D)) * 0.1, "layers": []}
    for i in range(LAYERS):
        k = keys[2 + 4 * i: 6 + 4 * i]
        p["layers"].append({
            "qkv": jax.random.normal(k[0], (D, 3 * D)) * s, "out": jax.random.normal(k[1], (D, D)) * s,
            "up": jax.random.normal(k[2], (D, 4 * D)) * s, "down": jax.random.normal(k[3], (4 * D, D)) * (s / 2),
            "ln1": jnp.ones((D,)), "ln2": jnp.ones((D,))})
    p["ln_f"] = jnp.ones((D,))
    return p


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def empty_cache():
    return [(jnp.zeros((BATCH, T, HEADS, HD)), jnp.zeros((BATCH, T, HEADS, HD))) for _ in range(LAYERS)]


def forward(params, tokens, start, cache):
    """Hidden states of `tokens` (B, S) placed at positions start..start+S-1; keys/values go into `cache`
    (B, T, H, HD per layer) and each position attends to the cached positions up to itself."""
    s = tokens.shape[1]
    pos = start + jnp.arange(s)
    x = params["embed"][tokens] + jax.lax.dynamic_slice_in_dim(params["pos"], start, s)
    mask = jnp.arange(T)[None, :] <= pos[:, None]                       # (S, T)
    new_cache = []
    for layer, (ck, cv) in zip(params["layers"], cache):
        h = rms_norm(x, layer["ln1"])
        q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
        q, k, v = (a.reshape(a.shape[0], s, HEADS, HD) for a in (q, k, v))
        ck = jax.lax.dynamic_update_slice_in_dim(ck, k, start, axis=1)
        cv = jax.lax.dynamic_update_slice_in_dim(cv, v, start, axis=1)
        att = jnp.einsum("bshd,bthd->bhst", q, ck) / HD ** 0.5
        att = jax.nn.softmax(jnp.where(mask, att, -1e30), axis=-1)
        o = jnp.einsum("bhst,bthd->bshd", att, cv).reshape(x.shape)
        x = x + o @ layer["out"]
        x = x + jax.nn.gelu(rms_norm(x, layer["ln2"]) @ layer["up"]) @ layer["down"]
        new_cache.append((ck, cv))
    return rms_norm(x, params["ln_f"]), new_cache


def next_token(params, h):
    return jnp.argmax(h @ params["embed"].T, axis=-1).astype(jnp.int32)


def generate_recompute(params, prompt):  # EDIT
    buf = jnp.zeros((BATCH, T), jnp.int32).at[:, :PROMPT].set(prompt)  # EDIT

    def body(t, buf):  # EDIT
        h, _ = forward(params, buf, 0, empty_cache())  # EDIT
        return buf.at[:, t].set(next_token(params, h[:, t - 1]))  # EDIT
    return jax.lax.fori_loop(PROMPT, T, body, buf)  # EDIT


def generate_cached(params, prompt):  # EDIT
    buf = jnp.zeros((BATCH, T), jnp.int32).at[:, :PROMPT].set(prompt)  # EDIT
    h, cache = forward(params, prompt, 0, empty_cache())  # EDIT
    buf = buf.at[:, PROMPT].set(next_token(params, h[:, -1]))  # EDIT

    def body(t, state):  # EDIT
        buf, cache = state  # EDIT
        h, cache = forward(params, jax.lax.dynamic_slice_in_dim(buf, t - 1, 1, axis=1), t - 1, cache)  # EDIT
        return buf.at[:, t].set(next_token(params, h[:, 0])), cache  # EDIT
    return jax.lax.fori_loop(PROMPT + 1, T, body, (buf, cache))[0]  # EDIT


def generate_streamed(params, prompt):  # EDIT
    buf = jnp.zeros((BATCH, T), jnp.int32).at[:, :PROMPT].set(prompt)  # EDIT

    def body(t, state):  # EDIT
        buf, cache = state  # EDIT
        h, cache = forward(params, jax.lax.dynamic_slice_in_dim(buf, t - 1, 1, axis=1), t - 1, cache)  # EDIT
        tok = jnp.where(t < PROMPT, buf[:, t], next_token(params, h[:, 0]))  # EDIT
        return buf.at[:, t].set(tok), cache  # EDIT
    return jax.lax.fori_loop(1, T, body, (buf, empty_cache()))[0]  # EDIT


def build(variant):
    params = init_params()
    prompt = jax.random.randint(jax.random.key(2), (BATCH, PROMPT), 0, VOCAB)
    generate = {"before": generate_recompute, "fixed": generate_cached,  # EDIT
                "cache_stream": generate_streamed}[variant]  # EDIT

    @jax.jit
    def step(carry):
        params, prompt, _ = carry
        out = generate(params, prompt)
        # the next batch of prompts: the tail of this batch's text
        return params, out[:, T - PROMPT:], out

    return step, (params, prompt, jnp.zeros((BATCH, T), jnp.int32)), {"units": BATCH * NEW,
                                                                        "unit": "tokens generated"}


def result(carry):
    return carry[2]
