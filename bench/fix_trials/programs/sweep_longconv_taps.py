"""A premise measured, not a trial: a depthwise causal convolution (8 sequences of 2,048 steps, 256 channels, one
filter per channel) against the same filter applied by real FFTs, at several filter lengths. Variants
conv_<taps> and fft_<taps> for taps in 16, 64, 256, 512; the step returns the filtered sequences' mean."""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "premise sweep (convolution against FFT by filter length)"
TAPS = (16, 64, 256, 512)
VARIANTS = [f"{how}_{k}" for k in TAPS for how in ("conv", "fft")]
BATCH, LENGTH, WIDTH = size(8, 2), size(2048, 64), size(256, 8)


def causal_filter(v, h, how):
    n, k = v.shape[-1], h.shape[-1]
    if how == "fft":
        m = 1 << (n + k - 1 - 1).bit_length()
        return jnp.fft.irfft(jnp.fft.rfft(v, n=m) * jnp.fft.rfft(h, n=m), n=m)[..., :n]
    return jax.lax.conv_general_dilated(v, h[:, None, ::-1], window_strides=(1,), padding=[(k - 1, 0)],
                                        dimension_numbers=("NCH", "OIH", "NCH"), feature_group_count=v.shape[1])


def build(variant):
    how, taps = variant.split("_")
    taps = min(int(taps), LENGTH)
    kv, kh = jax.random.split(jax.random.key(0))
    v = jax.random.normal(kv, (BATCH, WIDTH, LENGTH), jnp.float32)
    h = jax.random.normal(kh, (WIDTH, taps), jnp.float32) / taps
    fn = jax.jit(lambda v, h: causal_filter(v, h, how).mean(axis=-1))

    def step(carry):
        v, h, _ = carry
        return v, h, fn(v, h)

    return step, (v, h, jnp.zeros((BATCH, WIDTH))), {"units": BATCH * LENGTH, "unit": "steps"}
