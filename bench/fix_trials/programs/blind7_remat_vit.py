"""Vision transformer trained from scratch on 64x64 satellite tiles (land-cover classes), bfloat16 activations.

Patches of 4x4 pixels are embedded, passed through pre-norm transformer blocks (each block wrapped in
jax.checkpoint, as in the team's large-model training recipe) and mean-pooled into a classifier. Adam is written
by hand; one jitted, donated step per batch.

Variants:
  fixed: the blocks are applied without jax.checkpoint.
  save_dots: the blocks keep jax.checkpoint with the policy jax.checkpoint_policies.dots_with_no_batch_dims_saveable.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training (vision, remote sensing)"
VARIANTS = ["before", "fixed", "save_dots"]
TRACE_STEPS = 2

BATCH = size(64, 2)
IMAGE = size(64, 16)
PATCH = 4
TOKENS = (IMAGE // PATCH) ** 2
DIM = size(512, 32)
HEADS = size(8, 2)
LAYERS = size(8, 2)
CLASSES = 10
LR, B1, B2 = 3e-4, 0.9, 0.999
DTYPE = size(jnp.bfloat16, jnp.float32)  # float32 on the CPU so variants compare exactly


def init_params(key):
    ks = iter(jax.random.split(key, 4 + 4 * LAYERS))
    nrm = lambda shape, fan: jax.random.normal(next(ks), shape, jnp.float32) / np.sqrt(fan)
    layers = [{"qkv": nrm((DIM, 3 * DIM), DIM), "o": nrm((DIM, DIM), DIM) * 0.5,
               "up": nrm((DIM, 4 * DIM), DIM), "down": nrm((4 * DIM, DIM), 4 * DIM) * 0.5,
               "g1": jnp.ones(DIM, jnp.float32), "g2": jnp.ones(DIM, jnp.float32)} for _ in range(LAYERS)]
    return {"patch": nrm((3 * PATCH * PATCH, DIM), 3 * PATCH * PATCH), "pos": nrm((TOKENS, DIM), 1.0) * 0.02,
            "head": nrm((DIM, CLASSES), DIM) * 0.1, "layers": layers}


def layer_norm(x, g):
    x32 = x.astype(jnp.float32)
    m = x32.mean(-1, keepdims=True)
    return ((x32 - m) * jax.lax.rsqrt(((x32 - m) ** 2).mean(-1, keepdims=True) + 1e-6) * g).astype(DTYPE)


def block(lp, h):
    b = h.shape[0]
    w = jax.tree.map(lambda a: a.astype(DTYPE), lp)
    q, k, v = jnp.split(layer_norm(h, w["g1"]) @ w["qkv"], 3, -1)
    q, k, v = (a.reshape(b, TOKENS, HEADS, DIM // HEADS) for a in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(DIM // HEADS)
    att = jax.nn.softmax(s, -1).astype(DTYPE)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, TOKENS, DIM) @ w["o"]
    return h + jax.nn.gelu(layer_norm(h, w["g2"]) @ w["up"]) @ w["down"]


def loss_fn(variant, p, images, labels):
    b = images.shape[0]
    patches = images.reshape(b, IMAGE // PATCH, PATCH, IMAGE // PATCH, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
    h = (patches.reshape(b, TOKENS, -1).astype(DTYPE) @ p["patch"].astype(DTYPE)) + p["pos"].astype(DTYPE)
    if variant == "before":  # EDIT
        run = jax.checkpoint(block)  # EDIT
    elif variant == "fixed":  # EDIT
        run = block  # EDIT
    else:  # EDIT
        run = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)  # EDIT
    for lp in p["layers"]:
        h = run(lp, h)
    logits = (h.astype(jnp.float32).mean(1)) @ p["head"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))


def build(variant):
    params = init_params(jax.random.key(0))
    ki, kl = jax.random.split(jax.random.key(1))
    images = jax.random.uniform(ki, (4, BATCH, IMAGE, IMAGE, 3), jnp.float32)
    labels = jax.random.randint(kl, (4, BATCH), 0, CLASSES)

    def train_step(carry):
        p, m, v, t, _ = carry
        loss, g = jax.value_and_grad(lambda q: loss_fn(variant, q, images[t % 4], labels[t % 4]))(p)
        t1 = (t + 1).astype(jnp.float32)
        m = jax.tree.map(lambda a, x: B1 * a + (1 - B1) * x, m, g)
        v = jax.tree.map(lambda a, x: B2 * a + (1 - B2) * x * x, v, g)
        p = jax.tree.map(lambda w, a, b: w - LR * (a / (1 - B1 ** t1)) / (jnp.sqrt(b / (1 - B2 ** t1)) + 1e-8), p, m, v)
        return p, m, v, t + 1, loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    carry0 = (params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.int32(0), jnp.float32(0.0))
    return jax.jit(train_step, donate_argnums=0), carry0, {"units": BATCH, "unit": "images"}
