"""An exponential moving average of a sensor stream computed in raw JAX with jax.lax.scan, one trip per time step:
the smoothed state of 16 channels, h = a * h + (1 - a) * x, over 65,536 steps. Each trip does 16 multiply-adds,
so the loop's time is its trips' fixed cost (the loop's condition and counter, a launch per op), not their work.

As its user wrote it: 65,536 time steps of 16 channels, float32, the smoothed stream and its last state returned.
Variants:
  fixed        jax.lax.scan(..., unroll=128), as the report named it: 128 steps per trip, 512 trips
  associative  the linear recurrence as jax.lax.associative_scan over the (decay, input) pairs: log2(n) passes
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (signal smoothing)"
VARIANTS = ["before", "fixed", "associative"]
RTOL = 1e-5
STEPS, CHANNELS = size(65536, 4096), 16
ALPHA = 0.95


def build(variant):
    xs = jax.random.normal(jax.random.key(5), (STEPS, CHANNELS), jnp.float32)

    def trip(h, x):
        h = ALPHA * h + (1.0 - ALPHA) * x
        return h, h

    @jax.jit
    def smooth(h0, xs):
        if variant == "fixed":  # EDIT
            return jax.lax.scan(trip, h0, xs, unroll=128)  # EDIT
        if variant == "associative":  # EDIT
            # h_t = a_t * h_(t-1) + b_t composes as (a, b) pairs; h0 folded into the first step's b  # EDIT
            b = ((1.0 - ALPHA) * xs).at[0].add(ALPHA * h0)  # EDIT
            _, hs = jax.lax.associative_scan(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]),  # EDIT
                                             (jnp.full_like(xs, ALPHA), b))  # EDIT
            return hs[-1], hs  # EDIT
        return jax.lax.scan(trip, h0, xs)  # as written: one time step per trip

    def step(carry):
        h, _ = smooth(carry[0], xs)
        return h, carry[1] + 1

    return step, (jnp.zeros((CHANNELS,), jnp.float32), jnp.int32(0)), {"units": STEPS, "unit": "time steps"}
