"""Cross-sectional mean-reversion signal for an equity universe: each asset's daily log return is z-scored against
its trailing 64-day window (rolling mean and standard deviation), the negated z-score is the position, and the
next-day PnL per asset is accumulated. Runs as one jitted research function over the whole history.

Variants:
  fixed: the rolling window sums come from differences of cumulative sums.
  reduce_window: the rolling window sums come from jax.lax.reduce_window.
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (finance, rolling-window signal)"
VARIANTS = ["before", "fixed", "reduce_window"]
TRACE_STEPS = 3
RTOL = 2e-3

ASSETS = size(1024, 16)
DAYS = size(2520, 96)
WINDOW = size(64, 8)


def rolling_moments(r):
    """Mean and standard deviation of each trailing WINDOW-day window of r (assets, days): (assets, days-WINDOW+1)."""
    n = r.shape[1] - WINDOW + 1
    idx = jnp.arange(n)[:, None] + jnp.arange(WINDOW)[None, :]  # EDIT
    win = r[:, idx]  # EDIT
    return win.mean(-1), win.std(-1)  # EDIT


def rolling_moments_cumsum(r):  # EDIT
    n = r.shape[1] - WINDOW + 1  # EDIT
    c1 = jnp.pad(jnp.cumsum(r, axis=1), ((0, 0), (1, 0)))  # EDIT
    c2 = jnp.pad(jnp.cumsum(r * r, axis=1), ((0, 0), (1, 0)))  # EDIT
    mean = (c1[:, WINDOW:WINDOW + n] - c1[:, :n]) / WINDOW  # EDIT
    var = (c2[:, WINDOW:WINDOW + n] - c2[:, :n]) / WINDOW - mean ** 2  # EDIT
    return mean, jnp.sqrt(jnp.maximum(var, 0.0))  # EDIT


def rolling_moments_reduce_window(r):  # EDIT
    def wsum(a):  # EDIT
        return jax.lax.reduce_window(a, 0.0, jax.lax.add, (1, WINDOW), (1, 1), "VALID")  # EDIT
    mean = wsum(r) / WINDOW  # EDIT
    return mean, jnp.sqrt(jnp.maximum(wsum(r * r) / WINDOW - mean ** 2, 0.0))  # EDIT


def build(variant):
    moments = {"before": rolling_moments, "fixed": rolling_moments_cumsum,  # EDIT
               "reduce_window": rolling_moments_reduce_window}[variant]  # EDIT
    kv, kr = jax.random.split(jax.random.key(8))
    vol = 0.01 + 0.02 * jax.random.uniform(kv, (ASSETS, 1))
    returns = vol * jax.random.normal(kr, (ASSETS, DAYS))

    @jax.jit
    def step(carry):
        r, pnl = carry
        mean, sd = moments(r)
        z = (r[:, WINDOW - 1:] - mean) / (sd + 1e-8)
        position = -jnp.clip(z, -3.0, 3.0)
        pnl = pnl + jnp.sum(position[:, :-1] * r[:, WINDOW:], axis=1)
        # next research pass: the same universe one day later (the oldest day rolls off)
        return jnp.roll(r, -1, axis=1), pnl

    return step, (returns, jnp.zeros((ASSETS,))), {"units": ASSETS * DAYS, "unit": "asset-days"}


def result(carry):
    return carry[1]
