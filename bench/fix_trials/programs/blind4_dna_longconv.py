"""Embedding DNA sequences with a long-convolution model (HyenaDNA-style), inference in raw JAX (float32).

Tokens (A, C, G, T, N) are embedded to 256 channels; each of 2 blocks projects the sequence to a value and a gate,
filters every channel of the value with its own causal filter as long as the sequence (2,048 taps, an exponentially
decaying learned filter), multiplies by the gate, projects back and adds the residual. The step embeds one batch of
8 sequences of 2,048 bases and returns their mean-pooled embeddings. Variants:
  fixed        the causal filter applied as a product of real FFTs of length 4,096
  fftconvolve  the causal filter applied with jax.scipy.signal.fftconvolve (full mode, cut to the sequence)
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.signal import fftconvolve

from _size import size

FRAMEWORK, PHASE = "jax", "inference (sequence embedding)"
VARIANTS = ["before", "fixed", "fftconvolve"]
BATCH, LENGTH, WIDTH, BLOCKS, VOCAB = size(8, 2), size(2048, 64), size(256, 16), 2, 5


def init_params(key):
    keys = jax.random.split(key, 1 + 3 * BLOCKS)
    params = {"embed": jax.random.normal(keys[0], (VOCAB, WIDTH), jnp.float32), "blocks": []}
    t = jnp.arange(LENGTH, dtype=jnp.float32)
    for b in range(BLOCKS):
        k_in, k_out, k_h = keys[1 + 3 * b:4 + 3 * b]
        decay = jnp.exp(-t[None, :] * jnp.linspace(0.3, 0.001, WIDTH)[:, None])
        params["blocks"].append({
            "w_in": jax.random.normal(k_in, (WIDTH, 2 * WIDTH), jnp.float32) / np.sqrt(WIDTH),
            "w_out": jax.random.normal(k_out, (WIDTH, WIDTH), jnp.float32) / np.sqrt(WIDTH),
            "filter": jax.random.normal(k_h, (WIDTH, LENGTH), jnp.float32) * decay / np.sqrt(LENGTH) * 8})
    return params


def causal_filter(v, h, variant):
    """v: (batch, channels, length), h: (channels, length); y[t] = sum_{s <= t} h[t - s] v[s] per channel."""
    n = v.shape[-1]
    if variant == "fixed":  # EDIT
        spec = jnp.fft.rfft(v, n=2 * n) * jnp.fft.rfft(h, n=2 * n)  # EDIT
        return jnp.fft.irfft(spec, n=2 * n)[..., :n]  # EDIT
    if variant == "fftconvolve":  # EDIT
        return jax.vmap(lambda vb: fftconvolve(vb, h, mode="full", axes=(-1,)))(v)[..., :n]  # EDIT
    kernel = h[:, None, ::-1]
    return jax.lax.conv_general_dilated(v, kernel, window_strides=(1,), padding=[(n - 1, 0)],
                                        dimension_numbers=("NCH", "OIH", "NCH"), feature_group_count=v.shape[1])


def layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def embed(params, tokens, variant):
    x = params["embed"][tokens]
    for blk in params["blocks"]:
        value, gate = jnp.split(layer_norm(x) @ blk["w_in"], 2, axis=-1)
        y = causal_filter(value.transpose(0, 2, 1), blk["filter"], variant).transpose(0, 2, 1)
        x = x + (y * jax.nn.sigmoid(gate)) @ blk["w_out"]
    return layer_norm(x).mean(axis=1)


def build(variant):
    kp, kt = jax.random.split(jax.random.key(1953))
    params = init_params(kp)
    tokens = jax.random.randint(kt, (BATCH, LENGTH), 0, VOCAB)
    fn = jax.jit(lambda p, t: embed(p, t, variant))

    def step(carry):
        params, tokens, _ = carry
        return params, tokens, fn(params, tokens)

    return step, (params, tokens, jnp.zeros((BATCH, WIDTH))), {"units": BATCH * LENGTH, "unit": "bases"}
