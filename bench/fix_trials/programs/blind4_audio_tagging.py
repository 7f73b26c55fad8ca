"""Audio tagging inference (AudioSet-style, 527 labels) on 10-second clips at 16 kHz, in raw JAX (float32).

Each step takes a batch of 64 raw waveforms, computes 64-band log-mel spectrograms (Hann window of 1,024 samples,
hop of 256), and scores them with a small tagger: two dense GELU layers of 1,024 over each frame, mean and max pooling
over time, and a 527-way sigmoid head. The step returns the clip-level tag probabilities. Variants:
  fixed   the spectrum taken with a real-input FFT
  dft     the spectrum taken as two matrix products with cosine and sine tables
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (audio tagging)"
VARIANTS = ["before", "fixed", "dft"]
BATCH, SECONDS, SR = size(64, 2), size(10, 1), 16000
NFFT, HOP, MELS, HIDDEN, TAGS = size(1024, 256), size(256, 64), 64, size(1024, 64), size(527, 20)
NBINS = NFFT // 2 + 1


def mel_filterbank(sr, nfft, mels, fmin=50.0, fmax=8000.0):
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), mels + 2))
    freqs = np.linspace(0, sr / 2, nfft // 2 + 1)
    fb = np.zeros((nfft // 2 + 1, mels), np.float32)
    for m in range(mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        up = (freqs - lo) / (mid - lo)
        down = (hi - freqs) / (hi - mid)
        fb[:, m] = np.maximum(0.0, np.minimum(up, down))
    return fb


MEL_FB = mel_filterbank(SR, NFFT, MELS)
WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(NFFT) / NFFT)).astype(np.float32)
_n = np.arange(NFFT)[:, None] * np.arange(NBINS)[None, :] % NFFT  # EDIT
COS = np.cos(2 * np.pi * _n / NFFT).astype(np.float32)  # EDIT
SIN = -np.sin(2 * np.pi * _n / NFFT).astype(np.float32)  # EDIT


def frames_of(wave):
    """Overlapping frames of NFFT samples every HOP samples (NFFT is 4 hops)."""
    b = wave.shape[0]
    chunks = wave.reshape(b, -1, HOP)
    per = NFFT // HOP
    n = chunks.shape[1] - per + 1
    return jnp.concatenate([chunks[:, i:i + n] for i in range(per)], axis=-1)


def power_spectrum(frames, variant):
    if variant == "fixed":  # EDIT
        spec = jnp.fft.rfft(frames, axis=-1)  # EDIT
    elif variant == "dft":  # EDIT
        hi = jax.lax.Precision.HIGHEST  # EDIT
        re, im = jnp.matmul(frames, COS, precision=hi), jnp.matmul(frames, SIN, precision=hi)  # EDIT
        return re * re + im * im  # EDIT
    else:
        spec = jnp.fft.fft(frames, axis=-1)[..., :NBINS]
    return spec.real ** 2 + spec.imag ** 2


def log_mel(wave, variant):
    frames = frames_of(wave) * WINDOW
    power = power_spectrum(frames, variant)
    mel = jnp.matmul(power, MEL_FB, precision=jax.lax.Precision.HIGHEST)
    return jnp.log(mel + 1e-6)


def init_params(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k1, (MELS, HIDDEN), jnp.float32) / np.sqrt(MELS),
            "b1": jnp.zeros((HIDDEN,), jnp.float32),
            "w2": jax.random.normal(k2, (HIDDEN, HIDDEN), jnp.float32) / np.sqrt(HIDDEN),
            "b2": jnp.zeros((HIDDEN,), jnp.float32),
            "head": jax.random.normal(k3, (2 * HIDDEN, TAGS), jnp.float32) / np.sqrt(2 * HIDDEN),
            "bias": jnp.full((TAGS,), -2.0, jnp.float32)}


def tag(params, wave, variant):
    feats = log_mel(wave, variant)
    feats = (feats - feats.mean(axis=(1, 2), keepdims=True)) / (feats.std(axis=(1, 2), keepdims=True) + 1e-5)
    h = jax.nn.gelu(feats @ params["w1"] + params["b1"])
    h = jax.nn.gelu(h @ params["w2"] + params["b2"])
    pooled = jnp.concatenate([h.mean(axis=1), h.max(axis=1)], axis=-1)
    return jax.nn.sigmoid(pooled @ params["head"] + params["bias"])


def build(variant):
    kp, kw = jax.random.split(jax.random.key(4))
    params = init_params(kp)
    t = jnp.arange(SECONDS * SR, dtype=jnp.float32) / SR
    tones = jnp.sin(2 * np.pi * jnp.array([220.0, 440.0, 1250.0, 3100.0])[:, None] * t)
    mix = jax.random.uniform(kw, (BATCH, 4))
    wave = mix @ tones + 0.05 * jax.random.normal(jax.random.fold_in(kw, 1), (BATCH, SECONDS * SR))
    fn = jax.jit(lambda p, w: tag(p, w, variant))

    def step(carry):
        params, wave, _ = carry
        return params, wave, fn(params, wave)

    return step, (params, wave, jnp.zeros((BATCH, TAGS), jnp.float32)), {"units": BATCH, "unit": "clips"}
