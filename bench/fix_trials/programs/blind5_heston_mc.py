"""Monte Carlo pricing of a book of European calls under the Heston stochastic-volatility model, in JAX.

The risk library runs with 64-bit types enabled (jax_enable_x64, for its calendars and cash-flow arithmetic). Each
step simulates 262,144 fresh paths of the spot price and its variance over one year of 52 weekly steps (Euler with
full truncation, correlated normal shocks drawn in float32 from the step's key) and values 64 call strikes on the
final spots; the running estimate averages the steps' prices. It returns the step number and the running prices.
Variants:
  fixed      the paths simulated in float32
  f64mean    the paths simulated in float32, the payoff averages and the running prices kept in float64
  rbg        the shocks drawn with the rbg generator (a report's first change, timed as written: another stream)
  fixed_rbg  fixed and rbg together
"""
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _size import size  # noqa: E402

FRAMEWORK, PHASE = "jax", "simulation (finance, Monte Carlo pricing)"
VARIANTS = ["before", "fixed", "f64mean", "rbg", "fixed_rbg"]
RTOL = 2e-3
TRACE_STEPS = 1
PATHS, WEEKS, STRIKES = size(262144, 256), size(52, 20), 64
SPOT, RATE, KAPPA, THETA, XI, RHO, V0 = 100.0, 0.03, 1.5, 0.04, 0.5, -0.7, 0.04


def build(variant):
    dtype = jnp.float32 if variant in ("fixed", "f64mean", "fixed_rbg") else jnp.float64  # EDIT
    acc_dtype = jnp.float64 if variant == "f64mean" else dtype  # EDIT
    dt = 1.0 / WEEKS
    strikes = jnp.linspace(70.0, 130.0, STRIKES, dtype=dtype)
    base = jax.random.key(2024, impl="rbg" if variant.endswith("rbg") else None)  # EDIT

    @jax.jit
    def price(n, running):
        key = jax.random.fold_in(base, n)

        def week(state, i):
            log_s, v = state
            z = jax.random.normal(jax.random.fold_in(key, i), (2, PATHS), jnp.float32).astype(dtype)
            z_v = RHO * z[0] + float(np.sqrt(1 - RHO ** 2)) * z[1]
            vp = jnp.maximum(v, 0.0)
            log_s = log_s + (RATE - 0.5 * vp) * dt + jnp.sqrt(vp * dt) * z[0]
            v = v + KAPPA * (THETA - vp) * dt + XI * jnp.sqrt(vp * dt) * z_v
            return (log_s, v), None

        init = (jnp.full((PATHS,), np.log(SPOT), dtype), jnp.full((PATHS,), V0, dtype))
        (log_s, _), _ = jax.lax.scan(week, init, jnp.arange(WEEKS))
        payoff = jnp.maximum(jnp.exp(log_s)[:, None] - strikes[None, :], 0.0).astype(acc_dtype)
        prices = float(np.exp(-RATE)) * jnp.mean(payoff, axis=0)
        return n + 1, running + (prices - running) / (n + 1).astype(acc_dtype)

    return step_of(price), (jnp.zeros((), jnp.int32), jnp.zeros((STRIKES,), acc_dtype)), \
        {"units": PATHS * WEEKS, "unit": "path-weeks"}


def step_of(price):
    def step(carry):
        return price(*carry)
    return step
