"""A premise measured, not a trial: the power spectrum of real frames by jnp.fft.rfft, by jnp.fft.fft (all bins,
the non-negative kept), and by two float32 matmuls at precision HIGHEST with cosine and sine tables, at several
transform lengths; 40,960 frames (40 MB of samples) at each length. Variants <how>_<points> for how in rfft, fft,
dft and points in 256, 1024, 2048, 4096; the step returns the spectrum's mean per bin."""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "premise sweep (FFT against DFT matmuls by length)"
POINTS = (256, 1024, 2048, 4096)
VARIANTS = [f"{how}_{n}" for n in POINTS for how in ("rfft", "fft", "dft")]
SAMPLES = size(40960 * 1024, 4 * 4096)


def build(variant):
    how, points = variant.split("_")
    points = int(points)
    bins = points // 2 + 1
    frames = jax.random.normal(jax.random.key(0), (SAMPLES // points, points), jnp.float32)
    k = np.arange(points)[:, None] * np.arange(bins)[None, :] % points
    cos, sin = (jnp.asarray(np.cos(2 * np.pi * k / points), jnp.float32),
                jnp.asarray(-np.sin(2 * np.pi * k / points), jnp.float32))
    hi = jax.lax.Precision.HIGHEST

    def power(x, cos, sin):
        if how == "rfft":
            spec = jnp.fft.rfft(x, axis=-1)
        elif how == "fft":
            spec = jnp.fft.fft(x, axis=-1)[..., :bins]
        else:
            return (jnp.matmul(x, cos, precision=hi) ** 2 + jnp.matmul(x, sin, precision=hi) ** 2).mean(axis=0)
        return (jnp.abs(spec) ** 2).mean(axis=0)

    fn = jax.jit(power)

    def step(carry):
        x, c, s, _ = carry
        return x, c, s, fn(x, c, s)

    return step, (frames, cos, sin, jnp.zeros((bins,))), {"units": SAMPLES // points, "unit": "frames"}
