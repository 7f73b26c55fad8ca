"""Sentence-embedding serving with a 4-layer transformer encoder over packed sequences, in raw JAX (float32).

Requests of varying length are packed into rows of 1,024 tokens (the serving batcher packs 32 rows per batch); a
row holds several sentences, each with its own segment id, and attention stays inside a segment. The batcher gives
the token ids, the segment ids and the attention mask it built for the packed rows (an additive float32 bias of 0 or
-1e9 per query and key, as the encoder's forward expects). The encoder (width 512, 8 heads, MLP 2,048, learned
positions) runs, and each step returns the mean-pooled embedding of every segment slot. Variants:
  fixed    the batcher passes only token and segment ids; the mask is built inside the jitted encoder
  boolmask the batcher passes the mask as a boolean array, turned into the additive bias inside the jitted encoder
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "serving (sentence embeddings)"
VARIANTS = ["before", "fixed", "boolmask"]
ROWS, SEQ, WIDTH, HEADS, MLP, LAYERS = size(32, 2), size(1024, 64), size(512, 32), size(8, 2), size(2048, 64), 4
VOCAB, SLOTS = size(30522, 100), size(16, 4)


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
                       "g1": jnp.ones((WIDTH,)), "g2": jnp.ones((WIDTH,))})
    return {"tok": jax.random.normal(keys[0], (VOCAB, WIDTH)) * 0.02,
            "pos": jax.random.normal(keys[1], (SEQ, WIDTH)) * 0.02, "layers": layers}


def norm(x, g):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * g


def encode(params, tokens, segments, bias):
    r, t = tokens.shape
    x = params["tok"][tokens] + params["pos"][None]
    bias = bias[:, None]
    for lp in params["layers"]:
        q, k, v = jnp.split(norm(x, lp["g1"]) @ lp["qkv"], 3, axis=-1)
        q, k, v = (a.reshape(r, t, HEADS, -1).transpose(0, 2, 1, 3) for a in (q, k, v))
        att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(WIDTH // HEADS) + bias, axis=-1)
        x = x + (att @ v).transpose(0, 2, 1, 3).reshape(r, t, WIDTH) @ lp["o"]
        x = x + jax.nn.gelu(norm(x, lp["g2"]) @ lp["up"]) @ lp["down"]
    slot = jax.nn.one_hot(segments, SLOTS + 1, dtype=x.dtype)[..., 1:]  # segment 0 is padding
    pooled = jnp.einsum("rts,rtd->rsd", slot, x)
    return pooled / jnp.maximum(slot.sum(1), 1.0)[..., None]


encode_biased = jax.jit(encode)


@jax.jit  # EDIT
def encode_segments(params, tokens, segments):  # EDIT
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)  # EDIT
    return encode(params, tokens, segments, jnp.where(same, 0.0, -1e9).astype(jnp.float32))  # EDIT


@jax.jit  # EDIT
def encode_boolmask(params, tokens, segments, mask):  # EDIT
    return encode(params, tokens, segments, jnp.where(mask, 0.0, -1e9).astype(jnp.float32))  # EDIT


def pack(rng):
    """Greedy packing of sentences of 16..256 tokens into rows; segment ids 1..SLOTS, 0 for padding."""
    tokens = np.zeros((ROWS, SEQ), np.int32)
    segments = np.zeros((ROWS, SEQ), np.int32)
    for r in range(ROWS):
        pos, seg = 0, 1
        while seg <= SLOTS:
            n = int(rng.integers(16, max(17, SEQ // 4)))
            if pos + n > SEQ:
                break
            tokens[r, pos:pos + n] = rng.integers(1, VOCAB, n)
            segments[r, pos:pos + n] = seg
            pos, seg = pos + n, seg + 1
    return tokens, segments


def build(variant):
    params = init_params(jax.random.key(12))
    tokens, segments = pack(np.random.default_rng(12))
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)
    bias = np.where(same, 0.0, -1e9).astype(np.float32)

    def step(carry):
        params, _ = carry
        if variant == "fixed":  # EDIT
            out = encode_segments(params, tokens, segments)  # EDIT
        elif variant == "boolmask":  # EDIT
            out = encode_boolmask(params, tokens, segments, same)  # EDIT
        else:
            out = encode_biased(params, tokens, segments, bias)
        return params, out

    return step, (params, jnp.zeros((ROWS, SLOTS, WIDTH))), {"units": ROWS * SEQ, "unit": "tokens"}
