"""Greedy next-token choice in raw JAX written as the argmax of the probabilities: jnp.argmax(jax.nn.softmax(logits))
computes the exponentials, their sum and the division over the whole vocabulary for an index the logits already
give (softmax is increasing).

As its user wrote it: 512 sequences, hidden width 1,024, a vocabulary of 65,536 in float32, the output projection
and the pick jitted together, the chosen tokens fed back as the next step's input. Variants:
  fixed   jnp.argmax(logits, axis=-1)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference serving (greedy decoding)"
VARIANTS = ["before", "fixed"]
BATCH, WIDTH, VOCAB = size(512, 8), size(1024, 32), size(65536, 8192)


def build(variant):
    k = jax.random.split(jax.random.key(4), 2)
    embed = jax.random.normal(k[0], (VOCAB, WIDTH), jnp.float32) / 32
    head = jax.random.normal(k[1], (WIDTH, VOCAB), jnp.float32) / 32

    @jax.jit
    def pick(tokens, embed, head):
        logits = jnp.tanh(embed[tokens]) @ head
        if variant == "fixed":  # EDIT
            return jnp.argmax(logits, axis=-1)  # EDIT
        probs = jax.nn.softmax(logits, axis=-1)
        return jnp.argmax(probs, axis=-1)  # as written: the argmax of the probabilities

    def step(tokens):
        return pick(tokens, embed, head)

    return step, jnp.arange(BATCH, dtype=jnp.int32), {"units": BATCH, "unit": "tokens"}
