"""Few-shot evaluation of a prototypical network, in raw JAX (float32).

Each step scores one 128-way 64-shot episode: the MLP encoder (512 -> 1024 -> 1024 -> 256) embeds the 8,192 support
examples, each class's prototype is the mean embedding of its support examples, and the 4,096 query examples are
classified by negative squared distance to the prototypes. The step returns the query log-probabilities and the
episode's accuracy. Variants:
  fixed   the prototypes taken as one segment sum of the support embeddings by label, inside a jitted function
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (few-shot evaluation)"
VARIANTS = ["before", "fixed"]
WAYS, SHOTS, QUERIES = size(128, 4), size(64, 3), size(32, 2)
DIN, HID, EMB = size(512, 16), size(1024, 32), size(256, 8)


def init_encoder(key):
    dims = [DIN, HID, HID, EMB]
    keys = jax.random.split(key, len(dims) - 1)
    return [{"w": jax.random.normal(k, (a, b), jnp.float32) / jnp.sqrt(a), "b": jnp.zeros((b,), jnp.float32)}
            for k, a, b in zip(keys, dims[:-1], dims[1:])]


@jax.jit
def encode(params, x):
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return x


@jax.jit
def classify(params, protos, qx, qy):
    q = encode(params, qx)
    d2 = jnp.sum(q * q, -1, keepdims=True) - 2 * q @ protos.T + jnp.sum(protos * protos, -1)
    logp = jax.nn.log_softmax(-d2, axis=-1)
    return logp, jnp.mean(jnp.argmax(logp, -1) == qy)


@jax.jit  # EDIT
def class_means(emb, labels):  # EDIT
    sums = jax.ops.segment_sum(emb, labels, num_segments=WAYS)  # EDIT
    return sums / jnp.bincount(labels, length=WAYS)[:, None]  # EDIT


def build(variant):
    kp, ks, kq, kc, kperm = jax.random.split(jax.random.key(11), 5)
    params = init_encoder(kp)
    centers = jax.random.normal(kc, (WAYS, DIN), jnp.float32)
    sy = jax.random.permutation(kperm, jnp.repeat(jnp.arange(WAYS), SHOTS))
    qy = jnp.repeat(jnp.arange(WAYS), QUERIES)
    sx = centers[sy] + 2.5 * jax.random.normal(ks, (WAYS * SHOTS, DIN), jnp.float32)
    qx = centers[qy] + 2.5 * jax.random.normal(kq, (WAYS * QUERIES, DIN), jnp.float32)

    def step(carry):
        params, sx, sy, qx, qy, _ = carry
        s_emb = encode(params, sx)
        if variant == "fixed":  # EDIT
            protos = class_means(s_emb, sy)  # EDIT
        else:
            protos = jnp.stack([s_emb[sy == c].mean(axis=0) for c in range(WAYS)])
        logp, acc = classify(params, protos, qx, qy)
        return params, sx, sy, qx, qy, (logp, acc)

    init = (jnp.zeros((WAYS * QUERIES, WAYS), jnp.float32), jnp.zeros(()))
    return step, (params, sx, sy, qx, qy, init), {"units": 1, "unit": "episodes"}
