"""A small token classifier trained in raw JAX whose embedding lookup is written as a one-hot product,
jax.nn.one_hot(ids, VOCAB) @ table, as code ported from a framework without a gather often does.

As its user wrote it: vocabulary 32,768, width 1,024, batch 16 x 512 tokens, two dense layers, plain SGD; the
table is trained, so the backward pass forms one_hot.T @ grad as a second dense product. Variants:
  fixed   the lookup as a gather, table[ids] (jnp.take); its gradient is a scatter-add of the token rows
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
VOCAB, WIDTH, BATCH, SEQ, CLASSES = size(32768, 512), size(1024, 64), size(16, 2), size(512, 16), 128


def embed(table, ids, variant):
    if variant == "fixed":  # EDIT
        return table[ids]
    return jax.nn.one_hot(ids, VOCAB) @ table  # as written


def build(variant):
    k = jax.random.split(jax.random.key(1), 6)
    params = {"table": jax.random.normal(k[0], (VOCAB, WIDTH), jnp.float32) * 0.02,
              "w1": jax.random.normal(k[1], (WIDTH, 4 * WIDTH), jnp.float32) / jnp.sqrt(WIDTH),
              "w2": jax.random.normal(k[2], (4 * WIDTH, WIDTH), jnp.float32) / jnp.sqrt(4 * WIDTH),
              "head": jax.random.normal(k[3], (WIDTH, CLASSES), jnp.float32) / jnp.sqrt(WIDTH)}
    ids = jax.random.randint(k[4], (BATCH, SEQ), 0, VOCAB)
    labels = jax.random.randint(k[5], (BATCH,), 0, CLASSES)

    def loss_fn(params):
        h = embed(params["table"], ids, variant)
        h = h + jax.nn.gelu(h @ params["w1"]) @ params["w2"]
        logits = h.mean(axis=1) @ params["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    @jax.jit
    def train_step(params):
        loss, g = jax.value_and_grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss

    def step(carry):
        return train_step(carry[0])

    return step, (params, jnp.zeros(())), {"units": BATCH * SEQ, "unit": "tokens"}
