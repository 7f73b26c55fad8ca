"""A two-layer character-level LSTM language model trained with Flax linen (nn.RNN over nn.OptimizedLSTMCell) and
optax, logging the loss every step.

As its user wrote it: batch 32, 256 characters per sequence, hidden 512; the loop appends float(loss) to a list on
every step (the host waits for each step's result before it dispatches the next). Variants:
  nosync         the per-step float(loss) removed (losses kept on the device, read after the loop)
  unroll8        nn.RNN(cell, unroll=8)
  nosync_unroll8 both
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from _size import size

FRAMEWORK, PHASE = "flax.linen", "training"
VARIANTS = ["before", "nosync", "unroll8", "nosync_unroll8"]
TRACE_STEPS = 3
VOCAB, HIDDEN, BATCH, SEQ = 128, size(512, 32), size(32, 4), size(256, 16)


class CharLSTM(nn.Module):
    unroll: int = 1

    @nn.compact
    def __call__(self, idx):
        x = nn.Embed(VOCAB, HIDDEN)(idx)
        for _ in range(2):
            x = nn.RNN(nn.OptimizedLSTMCell(HIDDEN), unroll=self.unroll)(x)
        return nn.Dense(VOCAB)(x)


def build(variant):
    model = CharLSTM(unroll=8 if "unroll8" in variant else 1)  # EDIT (unroll8 variants)
    key = jax.random.key(4)
    data = jax.random.randint(key, (BATCH, SEQ + 1), 0, VOCAB)
    params = model.init(key, data[:, :-1])
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    history = []

    def step(carry):
        params, opt_state = carry
        params, opt_state, loss = train_step(params, opt_state, data)
        if "nosync" in variant:  # EDIT: keep the loss on the device
            history.append(loss)
        else:  # as written
            history.append(float(loss))
        return params, opt_state

    return step, (params, opt_state), {"units": BATCH * SEQ, "unit": "characters"}
