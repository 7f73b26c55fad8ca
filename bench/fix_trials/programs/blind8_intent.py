"""Intent classifier training for a voice assistant: utterances (token ids of varying length) are padded into a
fixed (BATCH, MAX_LEN) batch, embedded, passed through a two-layer token-wise feed-forward block, mean-pooled over
the real tokens and classified; plain SGD with momentum.

Variants:
  fixed: the padded batch and its lengths are assembled in NumPy and transferred in one device_put.
  pad_stack: each utterance is padded with jnp.pad and the batch built with jnp.stack.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (language: intent classification)"
VARIANTS = ["before", "fixed", "pad_stack"]
TRACE_STEPS = 1

BATCH = size(256, 8)
MAX_LEN = size(128, 16)
VOCAB = size(32000, 100)
D = size(512, 16)
HID = size(2048, 32)
CLASSES = size(128, 5)
POOL = 4 * BATCH        # utterances cycled through
LR = 0.05


def init(key):
    k = jax.random.split(key, 4)
    return {"emb": jax.random.normal(k[0], (VOCAB, D)) * 0.02,
            "w1": jax.random.normal(k[1], (D, HID)) / np.sqrt(D), "b1": jnp.zeros(HID),
            "w2": jax.random.normal(k[2], (HID, D)) / np.sqrt(HID), "b2": jnp.zeros(D),
            "wo": jax.random.normal(k[3], (D, CLASSES)) / np.sqrt(D)}


def loss_fn(p, tokens, lengths, labels):
    mask = (jnp.arange(MAX_LEN)[None, :] < lengths[:, None]).astype(jnp.float32)
    h = p["emb"][tokens]
    h = h + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    pooled = (h * mask[..., None]).sum(1) / lengths[:, None]
    logp = jax.nn.log_softmax(pooled @ p["wo"])
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], 1))


@jax.jit
def train_step(p, mom, tokens, lengths, labels):
    g = jax.grad(loss_fn)(p, tokens, lengths, labels)
    mom = jax.tree.map(lambda m, g: 0.9 * m + g, mom, g)
    return jax.tree.map(lambda p, m: p - LR * m, p, mom), mom


def pack(utts, variant):
    lengths = np.array([len(u) for u in utts], np.float32)
    if variant == "before":  # EDIT
        tokens = jnp.zeros((BATCH, MAX_LEN), jnp.int32)  # EDIT
        for i, u in enumerate(utts):  # EDIT
            tokens = tokens.at[i, :len(u)].set(jnp.asarray(u))  # EDIT
        return tokens, jnp.asarray(lengths)  # EDIT
    if variant == "pad_stack":  # EDIT
        tokens = jnp.stack([jnp.pad(jnp.asarray(u), (0, MAX_LEN - len(u))) for u in utts])  # EDIT
        return tokens, jnp.asarray(lengths)  # EDIT
    tokens = np.zeros((BATCH, MAX_LEN), np.int32)  # EDIT
    for i, u in enumerate(utts):  # EDIT
        tokens[i, :len(u)] = u  # EDIT
    return jax.device_put((tokens, lengths))  # EDIT


def build(variant):
    rng = np.random.default_rng(0)
    lens = rng.integers(MAX_LEN // 4, MAX_LEN + 1, POOL)
    utts = [rng.integers(1, VOCAB, n).astype(np.int32) for n in lens]
    labels = rng.integers(0, CLASSES, POOL).astype(np.int32)
    params = init(jax.random.key(1))
    mom = jax.tree.map(jnp.zeros_like, params)
    calls = [0]

    def step(carry):
        p, m = carry
        start = (calls[0] % (POOL // BATCH)) * BATCH
        calls[0] += 1
        tokens, lengths = pack(utts[start:start + BATCH], variant)
        return train_step(p, m, tokens, lengths, labels[start:start + BATCH])

    return step, (params, mom), {"units": BATCH, "unit": "utterances"}
