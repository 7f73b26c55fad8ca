"""Evaluation loss of a token classifier head over the real (non-padding) tokens of each batch, in raw JAX.

Each step draws a fresh batch of 64 sequences of up to 512 tokens (hidden states of width 1,024, bf16, random
lengths), keeps the hidden states of the real tokens, and computes the mean cross-entropy of a 8,192-way
classifier head against the tokens' labels. Variants:
  fixed   the padding excluded by a weight mask inside the jitted loss, shapes fixed
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "evaluation"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, D, CLASSES = size(64, 4), size(512, 16), size(1024, 32), size(8192, 64)


@jax.jit
def draw_batch(key):
    kh, kl, ky = jax.random.split(key, 3)
    hidden = jax.random.normal(kh, (BATCH, SEQ, D), jnp.bfloat16)
    lengths = jax.random.randint(kl, (BATCH,), SEQ // 8, SEQ + 1)
    labels = jax.random.randint(ky, (BATCH, SEQ), 0, CLASSES)
    mask = jnp.arange(SEQ)[None, :] < lengths[:, None]
    return hidden, labels, mask


@jax.jit
def token_loss(w, hidden, labels):
    logits = jnp.dot(hidden, w, preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


@jax.jit  # EDIT
def masked_token_loss(w, hidden, labels, mask):  # EDIT
    logits = jnp.dot(hidden, w, preferred_element_type=jnp.float32)  # EDIT
    logp = jax.nn.log_softmax(logits, axis=-1)  # EDIT
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]  # EDIT
    return jnp.sum(nll * mask) / jnp.sum(mask)  # EDIT


def build(variant):
    kw, kd = jax.random.split(jax.random.key(4))
    w = (jax.random.normal(kw, (D, CLASSES), jnp.float32) / jnp.sqrt(D)).astype(jnp.bfloat16)

    def step(carry):
        key, w, _ = carry
        key, sub = jax.random.split(key)
        hidden, labels, mask = draw_batch(sub)
        hidden, labels, mask = hidden.reshape(-1, D), labels.reshape(-1), mask.reshape(-1)
        if variant == "fixed":  # EDIT
            return key, w, masked_token_loss(w, hidden, labels, mask)  # EDIT
        return key, w, token_loss(w, hidden[mask], labels[mask])

    return step, (kd, w, jnp.zeros((), jnp.float32)), {"units": BATCH, "unit": "sequences"}
