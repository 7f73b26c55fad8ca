"""Greedy generation in raw JAX with a key/value cache carried through jax.lax.scan, each step attending to the
cache as it was before the step (the past tokens) and to its own key separately, then writing its key and value
into the cache: cache_k.at[t].set(k) after reading cache_k. The trip reads the old cache and writes the new one,
so XLA copies both caches whole on every trip to keep the old values readable while it updates in place.

As its user wrote it: one attention block of width 1,024, a batch of 32 sequences, 256 generated tokens, caches of
256 x 32 x 1,024 float32 (32 MiB each). Variants:
  fixed   write first, then attend over the updated cache (positions up to and including t): the update is the
          old cache's last use, so XLA writes the slot in place
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (decode)"
VARIANTS = ["before", "fixed"]
RTOL = 1e-4
STEPS, BATCH, WIDTH = size(256, 16), size(32, 2), size(1024, 64)


def build(variant):
    k = jax.random.split(jax.random.key(7), 5)
    params = {n: jax.random.normal(kk, (WIDTH, WIDTH), jnp.float32) / WIDTH ** 0.5
              for n, kk in zip(("wq", "wk", "wv", "wo"), k[:4])}
    start = jax.random.normal(k[4], (BATCH, WIDTH), jnp.float32)
    positions = jnp.arange(STEPS)

    def decode_step(params, carry, t):
        cache_k, cache_v, x = carry
        q, key, value = x @ params["wq"], x @ params["wk"], x @ params["wv"]
        if variant == "fixed":  # EDIT
            cache_k, cache_v = cache_k.at[t].set(key), cache_v.at[t].set(value)
            scores = jnp.einsum("bd,sbd->bs", q, cache_k) / WIDTH ** 0.5
            weights = jax.nn.softmax(jnp.where(positions[None, :] <= t, scores, -jnp.inf), axis=-1)
            context = jnp.einsum("bs,sbd->bd", weights, cache_v)
        else:  # as written: attend to the past, then to itself, then store this step's key and value
            past = jnp.einsum("bd,sbd->bs", q, cache_k) / WIDTH ** 0.5
            past = jnp.where(positions[None, :] < t, past, -jnp.inf)
            own = jnp.sum(q * key, axis=-1, keepdims=True) / WIDTH ** 0.5
            weights = jax.nn.softmax(jnp.concatenate([past, own], axis=-1), axis=-1)
            context = jnp.einsum("bs,sbd->bd", weights[:, :STEPS], cache_v) + weights[:, STEPS:] * value
            cache_k, cache_v = cache_k.at[t].set(key), cache_v.at[t].set(value)
        x = x + jnp.tanh(context @ params["wo"])
        return (cache_k, cache_v, x), x[:, 0]

    @jax.jit
    def generate(params, x):
        cache = jnp.zeros((STEPS, BATCH, WIDTH), jnp.float32)
        (_, _, x), trace = jax.lax.scan(lambda c, t: decode_step(params, c, t), (cache, cache, x), positions)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True), trace

    def step(carry):
        return generate(params, carry[0])

    return step, (start, jnp.zeros((STEPS, BATCH))), {"units": BATCH * STEPS, "unit": "tokens"}
