"""Zero-shot scoring of a batch of prompts with a small decoder-only language model in raw JAX (bf16 weights).

Each prompt is right-padded to a fixed length; the step runs the model over the batch and returns, for every
prompt, the log-probabilities of the token that would follow its last real token (the caller then reads off the
scores of its label words). As its user wrote it: batch 32 prompts of up to 512 tokens, 2 layers, width 1,024,
16 heads of 64, vocabulary 32,768. Variants:
  fixed   the final hidden state of each prompt picked out before the output projection
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (batch scoring)"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, D, HEADS, LAYERS, VOCAB = size(32, 4), size(512, 16), size(1024, 64), size(16, 4), 2, size(32768, 256)
DH = D // HEADS


def rms_norm(x, g):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(jnp.bfloat16)


def block(x, p, mask):
    b, t, _ = x.shape
    h = rms_norm(x, p["ln1"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, HEADS, DH) for a in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(DH)
    s = jnp.where(mask, s, -1e9)
    a = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
    o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(b, t, D)
    x = x + o @ p["wo"]
    h = rms_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]


def build(variant):
    ks = iter(jax.random.split(jax.random.key(11), 6 * LAYERS + 4))

    def w(shape):
        return (jax.random.normal(next(ks), shape, jnp.float32) / jnp.sqrt(shape[0])).astype(jnp.bfloat16)

    params = {"embed": w((VOCAB, D)), "unembed": w((D, VOCAB)), "ln_f": jnp.ones((D,), jnp.float32),
              "layers": [{"ln1": jnp.ones((D,), jnp.float32), "ln2": jnp.ones((D,), jnp.float32),
                          "wqkv": w((D, 3 * D)), "wo": w((D, D)), "w1": w((D, 4 * D)), "w2": w((4 * D, D))}
                         for _ in range(LAYERS)]}
    tokens = jax.random.randint(next(ks), (BATCH, SEQ), 0, VOCAB)
    lengths = jax.random.randint(next(ks), (BATCH,), SEQ // 4, SEQ + 1)
    tokens = jnp.where(jnp.arange(SEQ)[None] < lengths[:, None], tokens, 0)

    @jax.jit
    def next_token_logprobs(params, tokens, lengths):
        x = params["embed"][tokens]
        causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))[None, None]
        for p in params["layers"]:
            x = block(x, p, causal)
        x = rms_norm(x, params["ln_f"])
        last = (lengths - 1)[:, None]
        if variant == "fixed":  # EDIT
            x = jnp.take_along_axis(x, last[:, :, None], axis=1)[:, 0]  # EDIT
            logits = jnp.dot(x, params["unembed"], preferred_element_type=jnp.float32)  # EDIT
            return jax.nn.log_softmax(logits, axis=-1)  # EDIT
        logits = jnp.dot(x, params["unembed"], preferred_element_type=jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(logp, last[:, :, None], axis=1)[:, 0]

    def step(carry):
        params, tokens, lengths, _ = carry
        return params, tokens, lengths, next_token_logprobs(params, tokens, lengths)

    return step, (params, tokens, lengths, jnp.zeros((BATCH, VOCAB), jnp.float32)), {"units": BATCH,
                                                                                    "unit": "prompts"}
