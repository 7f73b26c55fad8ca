"""Speech recognition serving: a CTC acoustic model transcribes a batch of utterances, in raw JAX (float32).

The acoustic model takes 80-bin log-mel frames, subsamples them 4x in time with two strided 1-D convolutions
(1,024 channels), runs twelve residual feed-forward blocks of 1,024 (LayerNorm, 4,096-wide GELU) and a 32-symbol
character head (symbol 0 is the CTC blank). Each step transcribes one request batch of 2 utterances of 640 frames
with greedy CTC decoding (best symbol per output frame, repeats merged, blanks dropped) and hands the character ids
to the response writer; the server keeps running totals of the characters emitted and a checksum of the
transcripts. It returns those totals. Variants:
  fixed      the best-path symbols brought to the host as one array before the collapse loop
  devmask    the collapse decided on the device (a keep mask jitted with the model) and applied to the host copy
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference serving (speech recognition)"
VARIANTS = ["before", "fixed", "devmask"]
TRACE_STEPS = 1
BATCH, FRAMES, MELS, WIDTH, BLOCKS, VOCAB = size(2, 2), size(640, 48), 80, size(1024, 32), size(12, 2), 32
BLANK = 0


def init_params(key):
    keys = iter(jax.random.split(key, 4 + 2 * BLOCKS))
    p = {"sub1": jax.random.normal(next(keys), (3, MELS, WIDTH)) / np.sqrt(3 * MELS),
         "sub2": jax.random.normal(next(keys), (3, WIDTH, WIDTH)) / np.sqrt(3 * WIDTH), "blocks": []}
    for _ in range(BLOCKS):
        p["blocks"].append({"w1": jax.random.normal(next(keys), (WIDTH, 4 * WIDTH)) / np.sqrt(WIDTH),
                            "w2": jax.random.normal(next(keys), (4 * WIDTH, WIDTH)) / np.sqrt(4 * WIDTH),
                            "g": jnp.ones((WIDTH,)), "b": jnp.zeros((WIDTH,))})
    p["head"] = jax.random.normal(next(keys), (WIDTH, VOCAB)) * 3.0 / np.sqrt(WIDTH)
    return p


def log_probs(p, feats):
    dn = ("NWC", "WIO", "NWC")
    h = jax.nn.gelu(jax.lax.conv_general_dilated(feats, p["sub1"], (2,), "SAME", dimension_numbers=dn))
    h = jax.nn.gelu(jax.lax.conv_general_dilated(h, p["sub2"], (2,), "SAME", dimension_numbers=dn))
    for blk in p["blocks"]:
        mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        x = (h - mu) * jax.lax.rsqrt(var + 1e-5) * blk["g"] + blk["b"]
        h = h + jax.nn.gelu(x @ blk["w1"]) @ blk["w2"]
    return jax.nn.log_softmax(h @ p["head"], axis=-1)


@jax.jit
def best_path(p, feats):
    return jnp.argmax(log_probs(p, feats), axis=-1)


@jax.jit  # EDIT
def best_path_keep(p, feats):  # EDIT
    best = jnp.argmax(log_probs(p, feats), axis=-1)  # EDIT
    prev = jnp.concatenate([jnp.full_like(best[:, :1], BLANK), best[:, :-1]], axis=1)  # EDIT
    return best, (best != prev) & (best != BLANK)  # EDIT


def build(variant):
    kp, kx = jax.random.split(jax.random.key(16))
    params = init_params(kp)
    feats = jax.random.normal(kx, (BATCH, FRAMES, MELS), jnp.float32)

    def step(carry):
        chars, checksum = carry
        if variant == "devmask":  # EDIT
            best, keep = map(np.asarray, best_path_keep(params, feats))  # EDIT
            transcripts = [best[b][keep[b]].tolist() for b in range(best.shape[0])]  # EDIT
        else:
            best = best_path(params, feats)
            if variant == "fixed":  # EDIT
                best = np.asarray(best)  # EDIT
            transcripts = []
            for b in range(best.shape[0]):
                out, prev = [], BLANK
                for t in range(best.shape[1]):
                    k = int(best[b, t])
                    if k != prev and k != BLANK:
                        out.append(k)
                    prev = k
                transcripts.append(out)
        for text in transcripts:
            chars += len(text)
            checksum = (checksum * 31 + sum((i + 1) * k for i, k in enumerate(text))) % 1000003
        return chars, checksum

    return step, (0, 0), {"units": BATCH, "unit": "utterances"}
