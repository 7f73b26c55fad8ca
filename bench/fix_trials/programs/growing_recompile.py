"""Greedy autoregressive decoding with a small decoder-only transformer in raw JAX, written as "run the model on
the whole sequence so far and take the last position": the jitted step's token array grows by one each call, so
every call traces and compiles again.

As its user wrote it: 2 layers, width 512, 8 heads, vocabulary 8,192, bfloat16, 16 sequences, a 64-token prompt,
no KV cache. One step is one new token for each sequence. Variants:
  fixed   tokens kept in a fixed (16, 256) buffer with a position index (jax.lax.dynamic_update_slice); the
          model runs on the whole buffer under the causal mask and reads position pos-1: one compile
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (autoregressive decode)"
TRACE_STEPS = 2  # every step compiles: a short trace keeps the capture small
VARIANTS = ["before", "fixed"]
LAYERS, WIDTH, HEADS, VOCAB = 2, size(512, 32), size(8, 2), size(8192, 64)
BATCH, PROMPT, MAX_LEN = size(16, 2), size(64, 8), size(256, 64)


def init(key):
    k = jax.random.split(key, 4 * LAYERS + 3)
    n = lambda kk, shape: (jax.random.normal(kk, shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)
    layers = [{"qkv": n(k[4 * i], (WIDTH, 3 * WIDTH)), "o": n(k[4 * i + 1], (WIDTH, WIDTH)),
               "up": n(k[4 * i + 2], (WIDTH, 4 * WIDTH)), "down": n(k[4 * i + 3], (4 * WIDTH, WIDTH))}
              for i in range(LAYERS)]
    return {"embed": n(k[-3], (VOCAB, WIDTH)) * 16, "pos": n(k[-2], (MAX_LEN, WIDTH)) * 16,
            "unembed": n(k[-1], (WIDTH, VOCAB)), "layers": layers}


def forward(params, tokens):
    b, t = tokens.shape
    h = params["embed"][tokens] + params["pos"][:t]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for p in params["layers"]:
        x = h / (jnp.sqrt(jnp.mean(jnp.square(h.astype(jnp.float32)), -1, keepdims=True)) + 1e-6).astype(h.dtype)
        q, k, v = jnp.split((x @ p["qkv"]).reshape(b, t, 3 * HEADS, -1), 3, axis=2)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1])
        a = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1).astype(h.dtype)
        h = h + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, WIDTH) @ p["o"]
        h = h + jax.nn.gelu(h @ p["up"]) @ p["down"]
    return h @ params["unembed"]


def result(carry):
    """The tokens so far, from either variant's carry (a growing array, or a buffer and its position)."""
    return carry[0][:, :carry[1]] if isinstance(carry, tuple) else carry


def build(variant):
    params = init(jax.random.key(7))
    prompt = jax.random.randint(jax.random.key(8), (BATCH, PROMPT), 0, VOCAB)

    @jax.jit
    def next_token(params, tokens):  # as written: called on the whole, growing sequence
        return jnp.argmax(forward(params, tokens)[:, -1], axis=-1)

    @jax.jit
    def next_token_at(params, buf, pos):  # EDIT: a fixed buffer, one compile
        logits = forward(params, buf)
        tok = jnp.argmax(jax.lax.dynamic_index_in_dim(logits, pos - 1, axis=1, keepdims=False), axis=-1)
        return jax.lax.dynamic_update_slice(buf, tok[:, None].astype(buf.dtype), (0, pos))

    def step(carry):
        if variant == "fixed":  # EDIT
            buf, pos = carry  # pos: a Python int the loop keeps, so reading it costs no sync
            if pos >= MAX_LEN:  # the buffer is full: start the next batch of requests from the prompt
                buf, pos = carry0
            return next_token_at(params, buf, pos), pos + 1
        tokens = carry
        if tokens.shape[1] >= MAX_LEN:
            tokens = prompt
        tok = next_token(params, tokens)
        return jnp.concatenate([tokens, tok[:, None].astype(tokens.dtype)], axis=1)

    carry0 = (jnp.zeros((BATCH, MAX_LEN), prompt.dtype).at[:, :PROMPT].set(prompt), PROMPT)
    return step, carry0 if variant == "fixed" else prompt, {"units": BATCH, "unit": "tokens"}
