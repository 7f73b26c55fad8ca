"""Latent diffusion denoiser training: a residual MLP predicts the noise added to autoencoder latents at a random
timestep (cosine schedule, epsilon objective), trained with Adam. The training loop guards against NaNs, since the
run diverged once at a high learning rate.

Variants:
  fixed: the step runs without the NaN guard.
  loss_guard: the loop checks the returned loss with jnp.isfinite on the host each step instead.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (diffusion, latent denoiser)"
VARIANTS = ["before", "fixed", "loss_guard"]
TRACE_STEPS = 2

BATCH = size(1024, 8)
LATENT = size(1024, 16)
WIDTH = size(1536, 32)
BLOCKS = size(6, 2)
TEMB = 128
LR = 2e-4


def init(key):
    ks = jax.random.split(key, 2 * BLOCKS + 2)
    p = {"inp": jax.random.normal(ks[0], (LATENT + TEMB, WIDTH)) / np.sqrt(LATENT + TEMB),
         "out": jax.random.normal(ks[1], (WIDTH, LATENT)) * 0.01, "blocks": []}
    for i in range(BLOCKS):
        p["blocks"].append({"w1": jax.random.normal(ks[2 + 2 * i], (WIDTH, WIDTH)) / np.sqrt(WIDTH),
                            "w2": jax.random.normal(ks[3 + 2 * i], (WIDTH, WIDTH)) * 0.1 / np.sqrt(WIDTH),
                            "g": jnp.ones(WIDTH)})
    return p


def time_embedding(t):
    freqs = jnp.exp(-np.log(1e4) * jnp.arange(TEMB // 2) / (TEMB // 2))
    a = t[:, None] * 1000 * freqs[None]
    return jnp.concatenate([jnp.sin(a), jnp.cos(a)], -1)


def denoise(p, z, t):
    h = jnp.concatenate([z, time_embedding(t)], -1) @ p["inp"]
    for b in p["blocks"]:
        n = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6) * b["g"]
        h = h + jax.nn.silu(n @ b["w1"]) @ b["w2"]
    return h @ p["out"]


def loss_fn(p, z0, key):
    kt, kn = jax.random.split(key)
    t = jax.random.uniform(kt, (BATCH,))
    alpha_bar = jnp.cos(0.5 * jnp.pi * t) ** 2
    eps = jax.random.normal(kn, z0.shape)
    zt = jnp.sqrt(alpha_bar)[:, None] * z0 + jnp.sqrt(1 - alpha_bar)[:, None] * eps
    return jnp.mean((denoise(p, zt, t) - eps) ** 2)


@jax.jit
def train_step(state, z0):
    p, m, v, t, key, _ = state
    key, sub = jax.random.split(key)
    loss, g = jax.value_and_grad(loss_fn)(p, z0, sub)
    t = t + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
    p = jax.tree.map(lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), p, m, v)
    return p, m, v, t, key, loss


def build(variant):
    p = init(jax.random.key(7))
    latents = jax.random.normal(jax.random.key(8), (4, BATCH, LATENT))
    zeros = jax.tree.map(jnp.zeros_like, p)
    state0 = (p, zeros, zeros, jnp.zeros(()), jax.random.key(9), jnp.zeros(()))
    calls = [0]

    def step(state):
        z0 = latents[calls[0] % 4]
        calls[0] += 1
        if variant == "before":  # EDIT
            with jax.debug_nans(True):  # EDIT
                return train_step(state, z0)  # EDIT
        state = train_step(state, z0)
        if variant == "loss_guard" and not jnp.isfinite(state[-1]):  # EDIT
            raise FloatingPointError("loss is not finite")  # EDIT
        return state

    return step, state0, {"units": BATCH, "unit": "latents"}


def result(state):
    return state[0]
