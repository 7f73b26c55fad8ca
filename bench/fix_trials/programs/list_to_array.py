"""A text classifier trained in raw JAX whose data loader yields each batch as a Python list of examples (a dict
per example: its token ids as a NumPy array, its label as an int), and whose training loop makes the batch with
jnp.stack([jnp.asarray(ex["tokens"]) for ex in batch]): one host-to-device copy and one eager op per example.

As its user wrote it: batch 512 of 256 tokens, vocabulary 32,768, an embedding of width 256 mean-pooled into a
two-layer MLP, SGD. Each step makes 512 transfers of 1 KiB and 512 one-op programs before the jitted step runs.
Variants:
  fixed   the examples stacked on the host (np.stack) and the batch passed to the jitted step: one transfer
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "fixed"]
BATCH, SEQ, VOCAB, WIDTH, CLASSES = size(512, 16), size(256, 16), size(32768, 256), size(256, 32), 16


def build(variant):
    rng = np.random.default_rng(3)
    examples = [{"tokens": rng.integers(0, VOCAB, (SEQ,), dtype=np.int32), "label": int(rng.integers(CLASSES))}
                for _ in range(4 * BATCH)]
    loader = [examples[i * BATCH:(i + 1) * BATCH] for i in range(4)]  # each batch a list of examples
    k = jax.random.split(jax.random.key(4), 3)
    params = {"embed": jax.random.normal(k[0], (VOCAB, WIDTH), jnp.float32) * 0.02,
              "hidden": jax.random.normal(k[1], (WIDTH, 4 * WIDTH), jnp.float32) / np.sqrt(WIDTH),
              "head": jax.random.normal(k[2], (4 * WIDTH, CLASSES), jnp.float32) / np.sqrt(4 * WIDTH)}

    def loss_fn(params, tokens, labels):
        h = params["embed"][tokens].mean(axis=1)
        logits = jax.nn.gelu(h @ params["hidden"]) @ params["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    @jax.jit
    def train_step(params, tokens, labels):
        loss, g = jax.value_and_grad(loss_fn)(params, tokens, labels)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss

    def step(carry):
        params, _, i = carry
        batch = loader[i % len(loader)]
        if variant == "fixed":  # EDIT
            tokens = np.stack([ex["tokens"] for ex in batch])
            labels = np.array([ex["label"] for ex in batch], np.int32)
        else:  # as written
            tokens = jnp.stack([jnp.asarray(ex["tokens"]) for ex in batch])
            labels = jnp.array([ex["label"] for ex in batch], jnp.int32)
        params, loss = train_step(params, tokens, labels)
        return params, loss, i + 1

    return step, (params, jnp.zeros(()), 0), {"units": BATCH, "unit": "sequences"}
