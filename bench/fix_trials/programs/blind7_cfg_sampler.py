"""Class-conditional latent diffusion sampler: a small transformer denoiser run by a DDIM sampler.

Each step draws a batch of latents (patch tokens) from noise with SAMPLE_STEPS deterministic DDIM updates inside
one jitted function. The sampler supports classifier-free guidance (GUIDANCE_SCALE).

Variants:
  fixed: the denoiser is evaluated on the conditional batch only when the guidance scale is 1.0.
  split_calls: the conditional and unconditional denoiser passes are two separate calls instead of one doubled batch.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (diffusion, image generation)"
VARIANTS = ["before", "fixed", "split_calls"]
TRACE_STEPS = 2

BATCH = size(16, 2)
TOKENS = size(256, 16)
DIM = size(512, 32)
HEADS = size(8, 2)
LAYERS = size(6, 2)
LATENT = size(16, 4)
CLASSES = 1000
SAMPLE_STEPS = size(10, 3)
GUIDANCE_SCALE = 1.0


def init_params(key):
    ks = iter(jax.random.split(key, 8 + 6 * LAYERS))
    nrm = lambda shape, fan: jax.random.normal(next(ks), shape, jnp.float32) / np.sqrt(fan)
    layers = []
    for _ in range(LAYERS):
        layers.append({"qkv": nrm((DIM, 3 * DIM), DIM), "o": nrm((DIM, DIM), DIM),
                       "up": nrm((DIM, 4 * DIM), DIM), "down": nrm((4 * DIM, DIM), 4 * DIM),
                       "mod": nrm((DIM, 2 * DIM), DIM) * 0.1})
    return {"inp": nrm((LATENT, DIM), LATENT), "pos": nrm((TOKENS, DIM), 1.0) * 0.02,
            "cls": nrm((CLASSES + 1, DIM), 1.0) * 0.02, "t": nrm((64, DIM), 64),
            "out": nrm((DIM, LATENT), DIM) * 0.1, "layers": layers}


def layer_norm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-6)


def timestep_embedding(t):
    freqs = jnp.exp(-np.log(1000.0) * jnp.arange(32) / 32)
    ang = t[:, None] * freqs[None]
    return jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], -1)


def denoiser(p, x, t, labels):
    """Predicted noise for latents x (B, T, LATENT) at times t (B,), classes labels (B,) (CLASSES = unconditional)."""
    cond = p["cls"][labels] + timestep_embedding(t) @ p["t"]
    h = x @ p["inp"] + p["pos"][None]
    b = x.shape[0]
    for lp in p["layers"]:
        scale, shift = jnp.split(jax.nn.silu(cond) @ lp["mod"], 2, -1)
        y = layer_norm(h) * (1 + scale[:, None]) + shift[:, None]
        q, k, v = jnp.split(y @ lp["qkv"], 3, -1)
        q, k, v = (a.reshape(b, TOKENS, HEADS, DIM // HEADS) for a in (q, k, v))
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(DIM // HEADS), -1)
        h = h + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, TOKENS, DIM) @ lp["o"]
        h = h + jax.nn.gelu(layer_norm(h) @ lp["up"]) @ lp["down"]
    return layer_norm(h) @ p["out"]


def guided_eps(variant, p, x, t, labels):
    null = jnp.full_like(labels, CLASSES)
    if variant == "before":  # EDIT
        eps = denoiser(p, jnp.concatenate([x, x]), jnp.concatenate([t, t]), jnp.concatenate([labels, null]))  # EDIT
        eps_c, eps_u = jnp.split(eps, 2)  # EDIT
        return eps_u + GUIDANCE_SCALE * (eps_c - eps_u)  # EDIT
    if variant == "fixed":  # EDIT
        if GUIDANCE_SCALE == 1.0:  # EDIT
            return denoiser(p, x, t, labels)  # EDIT
        eps_c, eps_u = denoiser(p, x, t, labels), denoiser(p, x, t, null)  # EDIT
        return eps_u + GUIDANCE_SCALE * (eps_c - eps_u)  # EDIT
    eps_c, eps_u = denoiser(p, x, t, labels), denoiser(p, x, t, null)  # EDIT
    return eps_u + GUIDANCE_SCALE * (eps_c - eps_u)  # EDIT


def build(variant):
    params = init_params(jax.random.key(0))
    ts = np.linspace(999, 0, SAMPLE_STEPS + 1).astype(np.float32)
    alpha_bar = lambda t: jnp.cos((t / 1000.0 + 0.008) / 1.008 * np.pi / 2) ** 2

    @jax.jit
    def sample(params, key):
        key, kx, kl = jax.random.split(key, 3)
        x = jax.random.normal(kx, (BATCH, TOKENS, LATENT), jnp.float32)
        labels = jax.random.randint(kl, (BATCH,), 0, CLASSES)

        def ddim(i, x):
            t, t_next = jnp.asarray(ts)[i], jnp.asarray(ts)[i + 1]
            a, a_next = alpha_bar(t), alpha_bar(t_next)
            eps = guided_eps(variant, params, x, jnp.full((BATCH,), t), labels)
            x0 = (x - jnp.sqrt(1 - a) * eps) / jnp.sqrt(a)
            return jnp.sqrt(a_next) * x0 + jnp.sqrt(1 - a_next) * eps

        return key, jax.lax.fori_loop(0, SAMPLE_STEPS, ddim, x)

    def step(carry):
        return sample(params, carry[0])

    carry0 = (jax.random.key(1), jnp.zeros((BATCH, TOKENS, LATENT), jnp.float32))
    return step, carry0, {"units": BATCH, "unit": "images sampled"}


def result(carry):
    return carry[1]
