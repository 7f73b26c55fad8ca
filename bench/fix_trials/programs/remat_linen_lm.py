"""A decoder-only language model trained with Flax linen and optax, every block wrapped in nn.remat (the default
in the codebase it was copied from, to fit larger models); here the model is small and the chip has memory to spare.

As its user wrote it: 12 blocks of width 1,024 (16 heads, MLP 4,096), sequences of 512, batch 16, bf16 compute,
attention by jax.nn.dot_product_attention. Variants:
  noremat     nn.remat removed (the block used as it is)
  dots        nn.remat(Block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  noremat_flash  nn.remat removed and the attention computed by the Pallas TPU flash_attention kernel (its default
              128 blocks, head_dim 64): the second program on which that kernel's gain at head_dim 64 is measured
"""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from _size import size

FRAMEWORK, PHASE = "flax.linen", "training"
VARIANTS = ["before", "noremat", "dots", "noremat_flash"]
VOCAB, D, HEADS, LAYERS, BATCH, SEQ = size(16384, 256), size(1024, 64), size(16, 4), size(12, 2), size(16, 2), size(512, 64)


class Block(nn.Module):
    flash: bool = False

    @nn.compact
    def __call__(self, x):
        b, s, _ = x.shape
        h = nn.RMSNorm(dtype=jnp.bfloat16)(x)
        q, k, v = jnp.split(nn.Dense(3 * D, use_bias=False, dtype=jnp.bfloat16)(h), 3, axis=-1)
        q, k, v = (t.reshape(b, s, HEADS, D // HEADS) for t in (q, k, v))
        if self.flash:  # EDIT: the Pallas flash-attention kernel, [batch, heads, seq, head_dim]
            from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
            q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
            a = flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(D // HEADS))
            a = a.transpose(0, 2, 1, 3).reshape(b, s, D)
        else:
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, D)
        x = x + nn.Dense(D, use_bias=False, dtype=jnp.bfloat16)(a)
        h = nn.RMSNorm(dtype=jnp.bfloat16)(x)
        h = nn.Dense(4 * D, use_bias=False, dtype=jnp.bfloat16)(h)
        return x + nn.Dense(D, use_bias=False, dtype=jnp.bfloat16)(nn.gelu(h))


class LM(nn.Module):
    variant: str

    @nn.compact
    def __call__(self, idx):
        if self.variant == "noremat":  # EDIT: remat removed
            block = Block
        elif self.variant == "noremat_flash":  # EDIT: remat removed, flash attention
            block = lambda: Block(flash=True)  # noqa: E731
        elif self.variant == "dots":  # EDIT: a saving policy
            block = nn.remat(Block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        else:  # as written
            block = nn.remat(Block)
        x = nn.Embed(VOCAB, D, dtype=jnp.bfloat16)(idx)
        for _ in range(LAYERS):
            x = block()(x)
        return nn.Dense(VOCAB, dtype=jnp.bfloat16)(nn.RMSNorm(dtype=jnp.bfloat16)(x)).astype(jnp.float32)


def build(variant):
    model = LM(variant)
    key = jax.random.key(5)
    data = jax.random.randint(key, (BATCH, SEQ + 1), 0, VOCAB)
    params = model.init(key, data[:, :-1])
    tx = optax.adamw(1e-4)
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = model.apply(p, batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step(carry):
        params, opt_state, _ = carry
        return train_step(params, opt_state, data)

    return step, (params, opt_state, jnp.zeros(())), {"units": BATCH * SEQ, "unit": "tokens"}
