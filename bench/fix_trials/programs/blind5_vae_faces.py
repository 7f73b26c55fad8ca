"""Training a convolutional variational autoencoder on 64x64 face crops (CelebA-style), in raw JAX (float32).

The encoder has four stages of two 3x3 convolutions (the second of stride 2; 32, 64, 128, 256 channels, SiLU) and two
dense heads for the posterior mean and log-variance of a 128-dimensional latent; the decoder maps a latent sample
back through four nearest-neighbour upsamplings and 3x3 convolutions (128, 64, 32, 16 channels) to the image. The
loss is the per-image squared reconstruction error plus a beta-weighted KL term, written as the two terms the paper
defines. Each step takes one batch of 128 images, draws the reparameterisation noise from the step number, and
applies one Adam update. It returns the parameters, the Adam moments, the step number and the loss. Variants:
  fixed    the loss computes the posterior once and hands it to both terms
  donate   the train step donates its parameter and moment buffers to the update
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (generative, VAE)"
VARIANTS = ["before", "fixed", "donate"]
BATCH, HW, LATENT = size(128, 4), size(64, 16), size(128, 8)
ENC, DEC = (32, 64, 128, 256), (128, 64, 32, 16)
BETA, LR = 0.5, 2e-4


def conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def init_params(key):
    keys = iter(jax.random.split(key, 32))
    p, cin = {}, 3
    for i, c in enumerate(ENC):
        p[f"enc{i}a"] = jax.random.normal(next(keys), (3, 3, cin, c)) / np.sqrt(9 * cin)
        p[f"enc{i}b"] = jax.random.normal(next(keys), (3, 3, c, c)) / np.sqrt(9 * c)
        cin = c
    flat = (HW // 16) ** 2 * cin
    p["mu_w"] = jax.random.normal(next(keys), (flat, LATENT)) / np.sqrt(flat)
    p["lv_w"] = jax.random.normal(next(keys), (flat, LATENT)) * 0.1 / np.sqrt(flat)
    p["mu_b"], p["lv_b"] = jnp.zeros((LATENT,)), jnp.zeros((LATENT,))
    p["dec_in"] = jax.random.normal(next(keys), (LATENT, (HW // 16) ** 2 * ENC[-1])) / np.sqrt(LATENT)
    cin = ENC[-1]
    for i, c in enumerate(DEC):
        p[f"dec{i}"] = jax.random.normal(next(keys), (3, 3, cin, c)) / np.sqrt(9 * cin)
        cin = c
    p["out"] = jax.random.normal(next(keys), (3, 3, cin, 3)) / np.sqrt(9 * cin)
    return p


def encode(p, x):
    h = x
    for i in range(len(ENC)):
        h = jax.nn.silu(conv(h, p[f"enc{i}a"]))
        h = jax.nn.silu(conv(h, p[f"enc{i}b"], 2))
    h = h.reshape(h.shape[0], -1)
    return h @ p["mu_w"] + p["mu_b"], h @ p["lv_w"] + p["lv_b"]


def decode(p, z):
    s = HW // 16
    h = (z @ p["dec_in"]).reshape(z.shape[0], s, s, ENC[-1])
    for i in range(len(DEC)):
        h = jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)
        h = jax.nn.silu(conv(h, p[f"dec{i}"]))
    return jax.nn.sigmoid(conv(h, p["out"]))


def reconstruction_term(p, x, eps):
    mu, logvar = encode(p, x)
    z = mu + jnp.exp(0.5 * logvar) * eps
    return jnp.mean(jnp.sum((decode(p, z) - x) ** 2, axis=(1, 2, 3)))


def kl_term(p, x):
    mu, logvar = encode(p, x)
    return jnp.mean(-0.5 * jnp.sum(1 + logvar - mu ** 2 - jnp.exp(logvar), axis=-1))


def loss_before(p, x, eps):
    return reconstruction_term(p, x, eps) + BETA * kl_term(p, x)


def loss_fixed(p, x, eps):  # EDIT
    mu, logvar = encode(p, x)  # EDIT
    z = mu + jnp.exp(0.5 * logvar) * eps  # EDIT
    recon = jnp.mean(jnp.sum((decode(p, z) - x) ** 2, axis=(1, 2, 3)))  # EDIT
    kl = jnp.mean(-0.5 * jnp.sum(1 + logvar - mu ** 2 - jnp.exp(logvar), axis=-1))  # EDIT
    return recon + BETA * kl  # EDIT


def make_train_step(loss_fn, donate):
    def train_step(params, m, v, t, x):
        eps = jax.random.normal(jax.random.fold_in(jax.random.key(7), t), (x.shape[0], LATENT))
        loss, grads = jax.value_and_grad(loss_fn)(params, x, eps)
        t = t + 1
        m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
        v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
        bc1, bc2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        params = jax.tree.map(lambda w, a, b: w - LR * (a / bc1) / (jnp.sqrt(b / bc2) + 1e-8), params, m, v)
        return params, m, v, t, loss
    return jax.jit(train_step, donate_argnums=(0, 1, 2) if donate else ())  # EDIT


def build(variant):
    kp, kx = jax.random.split(jax.random.key(5))
    params = init_params(kp)
    zeros = jax.tree.map(jnp.zeros_like, params)
    images = jax.random.uniform(kx, (BATCH, HW, HW, 3), jnp.float32)
    loss_fn = loss_fixed if variant == "fixed" else loss_before  # EDIT
    train_step = make_train_step(loss_fn, donate=variant == "donate")  # EDIT

    def step(carry):
        params, m, v, t, _ = carry
        return train_step(params, m, v, t, images)

    return step, (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32), jnp.zeros(())), \
        {"units": BATCH, "unit": "images"}
