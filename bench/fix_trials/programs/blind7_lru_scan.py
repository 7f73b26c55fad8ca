"""Gated linear recurrent language model (byte level), trained with Adam on long sequences.

Each layer projects the input to a per-channel decay gate and an input, runs the diagonal linear recurrence
h_t = a_t * h_{t-1} + b_t over the sequence, and projects back with a residual. Next-byte cross-entropy; Adam is
written by hand; one jitted, donated step per batch.

Variants:
  fixed: the recurrence is evaluated with jax.lax.associative_scan over the sequence axis.
  scan_unroll: the recurrence keeps jax.lax.scan, unrolled 16 time steps per loop trip.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (language, linear recurrent model)"
VARIANTS = ["before", "fixed", "scan_unroll"]
TRACE_STEPS = 1

BATCH = size(8, 2)
SEQ = size(4096, 32)
DIM = size(128, 16)
LAYERS = size(2, 2)
VOCAB = 256
LR, B1, B2 = 1e-3, 0.9, 0.98


def recurrence(variant, a, b):
    """h_t = a_t * h_{t-1} + b_t with h_{-1} = 0; a, b: (B, T, D)."""
    if variant == "fixed":  # EDIT
        def combine(x, y):  # EDIT
            return y[0] * x[0], y[0] * x[1] + y[1]  # EDIT

        return jax.lax.associative_scan(combine, (a, b), axis=1)[1]  # EDIT

    def body(h, ab):
        h = ab[0] * h + ab[1]
        return h, h

    unroll = 16 if variant == "scan_unroll" else 1  # EDIT
    _, hs = jax.lax.scan(body, jnp.zeros_like(b[:, 0]), (a.swapaxes(0, 1), b.swapaxes(0, 1)), unroll=unroll)
    return hs.swapaxes(0, 1)


def init_params(key):
    ks = iter(jax.random.split(key, 2 + 3 * LAYERS))
    nrm = lambda shape, fan: jax.random.normal(next(ks), shape, jnp.float32) / np.sqrt(fan)
    layers = [{"gate": nrm((DIM, DIM), DIM), "gate_b": jnp.full((DIM,), 2.0, jnp.float32), "inp": nrm((DIM, DIM), DIM),
               "out": nrm((DIM, DIM), DIM) * 0.5} for _ in range(LAYERS)]
    return {"emb": nrm((VOCAB, DIM), 1.0), "head": nrm((DIM, VOCAB), DIM), "layers": layers}


def forward(variant, p, tokens):
    h = p["emb"][tokens]
    for lp in p["layers"]:
        m = h - h.mean(-1, keepdims=True)
        x = m * jax.lax.rsqrt((m * m).mean(-1, keepdims=True) + 1e-5)
        a = jax.nn.sigmoid(x @ lp["gate"] + lp["gate_b"])
        b = (1 - a) * (x @ lp["inp"])
        h = h + jax.nn.gelu(recurrence(variant, a, b)) @ lp["out"]
    return h @ p["head"]


def build(variant):
    params = init_params(jax.random.key(0))
    # Synthetic byte stream with local structure (a noisy repeating text), cycled on the device.
    rng = np.random.default_rng(0)
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 40, np.uint8)
    starts = rng.integers(0, len(text) - 64, (4, BATCH, SEQ // 64 + 2))
    data = np.stack([np.concatenate([text[s:s + 64] for s in row])[:SEQ + 1] for row in starts.reshape(-1, starts.shape[-1])])
    data = jnp.asarray(data.reshape(4, BATCH, SEQ + 1), jnp.int32)

    def loss_fn(p, batch):
        logits = forward(variant, p, batch[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, batch[:, 1:, None], -1))

    def train_step(carry):
        p, m, v, t, _ = carry
        loss, g = jax.value_and_grad(loss_fn)(p, data[t % 4])
        t1 = (t + 1).astype(jnp.float32)
        m = jax.tree.map(lambda a, x: B1 * a + (1 - B1) * x, m, g)
        v = jax.tree.map(lambda a, x: B2 * a + (1 - B2) * x * x, v, g)
        p = jax.tree.map(lambda w, a, b: w - LR * (a / (1 - B1 ** t1)) / (jnp.sqrt(b / (1 - B2 ** t1)) + 1e-8), p, m, v)
        return p, m, v, t + 1, loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    carry0 = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.int32(0), jnp.float32(0.0))
    return jax.jit(train_step, donate_argnums=0), carry0, {"units": BATCH * SEQ, "unit": "tokens"}
