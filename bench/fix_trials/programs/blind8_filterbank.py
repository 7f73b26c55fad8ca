"""Audio front end for a sound-event detector: a bank of learned FIR band-pass filters (short, windowed-sinc
initialised) is applied to each mono clip, followed by rectification, log compression and average pooling into
frames; the step returns the pooled band energies for a batch of clips.

Variants:
  fixed: the filter bank is applied with lax.conv_general_dilated (one input channel, one output channel per filter).
  fft_blocks: the FFT filtering is done per block of 4096 samples with overlap-add.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (audio: sound-event front end)"
VARIANTS = ["before", "fixed", "fft_blocks"]
TRACE_STEPS = 3

CLIPS = size(32, 2)
SAMPLES = size(65536, 1024)
BANDS = size(64, 4)
TAPS = size(128, 16)
HOP = size(256, 32)
BLOCK = size(4096, 256)


def filters():
    n = np.arange(TAPS) - (TAPS - 1) / 2
    lo = np.geomspace(0.005, 0.4, BANDS + 1)
    h = [(2 * lo[i + 1] * np.sinc(2 * lo[i + 1] * n) - 2 * lo[i] * np.sinc(2 * lo[i] * n)) * np.hanning(TAPS)
         for i in range(BANDS)]
    return jnp.asarray(np.stack(h), jnp.float32)                    # (BANDS, TAPS)


def apply_bank(x, h, variant):
    """Causal FIR filtering, output length SAMPLES: y[c, b, n] = sum_k h[b, k] x[c, n - k]."""
    if variant == "before":  # EDIT
        nfft = SAMPLES + TAPS  # EDIT
        X = jnp.fft.rfft(x, nfft)[:, None, :]  # EDIT
        Hf = jnp.fft.rfft(h, nfft)[None, :, :]  # EDIT
        return jnp.fft.irfft(X * Hf, nfft)[..., :SAMPLES]  # EDIT
    if variant == "fft_blocks":  # EDIT
        nb, nfft = SAMPLES // BLOCK, BLOCK + TAPS  # EDIT
        X = jnp.fft.rfft(x.reshape(CLIPS, nb, BLOCK), nfft)[:, None]  # EDIT
        Y = jnp.fft.irfft(X * jnp.fft.rfft(h, nfft)[None, :, None], nfft)  # EDIT (C, B, nb, nfft)
        head = Y[..., :BLOCK].reshape(CLIPS, BANDS, SAMPLES)  # EDIT
        tail = jnp.pad(Y[..., BLOCK:BLOCK + TAPS - 1], ((0, 0), (0, 0), (1, 0), (0, BLOCK - TAPS + 1)))  # EDIT
        return head + tail[:, :, :nb].reshape(CLIPS, BANDS, SAMPLES)  # EDIT
    y = jax.lax.conv_general_dilated(x[:, None, :], h[:, None, ::-1], (1,), [(TAPS - 1, 0)])  # EDIT
    return y  # EDIT


def build(variant):
    h = filters()
    audio = jax.random.normal(jax.random.key(4), (CLIPS, SAMPLES)) * 0.1

    @jax.jit
    def step(carry):
        x, _ = carry
        y = apply_bank(x, h, variant)
        e = jnp.log1p(100 * jnp.abs(y)).reshape(CLIPS, BANDS, SAMPLES // HOP, HOP).mean(-1)
        return jnp.roll(x, HOP, axis=1), e

    return step, (audio, jnp.zeros((CLIPS, BANDS, SAMPLES // HOP))), {"units": CLIPS, "unit": "clips"}


def result(carry):
    return carry[1]
