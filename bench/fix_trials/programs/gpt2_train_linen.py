"""A GPT-2-style language model trained with Flax linen and optax (bf16 activations, f32 parameters).

As its user wrote it: causal self-attention by hand (einsum, mask, softmax, einsum), the way the classic
minGPT/nanoGPT ports do, over 2,048-token sequences. Variants are single edits a performance engineer would try:
  flash  the attention core replaced by JAX's Pallas TPU flash_attention(causal=True) (has a backward pass)
  dpa    the attention core replaced by jax.nn.dot_product_attention(is_causal=True) (XLA implementation)
"""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from _size import size

FRAMEWORK, PHASE = "flax.linen", "training"
VARIANTS = ["before", "flash", "dpa"]
VOCAB, D, HEADS, LAYERS = size(8192, 256), size(768, 64), size(12, 4), size(6, 2)
BATCH, SEQ = size(4, 2), size(2048, 128)


def attention_core(q, k, v, variant):  # q, k, v: [batch, heads, seq, head_dim]
    if variant == "flash":  # EDIT: the Pallas flash-attention kernel
        from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
        return flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(q.shape[-1]))
    if variant == "dpa":  # EDIT: jax.nn.dot_product_attention (takes [batch, seq, heads, head_dim])
        t = lambda x: x.transpose(0, 2, 1, 3)
        return t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True))
    # as written: the scores materialised
    att = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[2], k.shape[2]), bool))
    att = jnp.where(mask, att, jnp.finfo(att.dtype).min)
    att = jax.nn.softmax(att.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", att, v)


class CausalSelfAttention(nn.Module):
    variant: str

    @nn.compact
    def __call__(self, x):
        b, s, _ = x.shape
        qkv = nn.Dense(3 * D, dtype=jnp.bfloat16, name="c_attn")(x)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        heads = lambda t: t.reshape(b, s, HEADS, D // HEADS).transpose(0, 2, 1, 3)
        y = attention_core(heads(q), heads(k), heads(v), self.variant)
        y = y.transpose(0, 2, 1, 3).reshape(b, s, D)
        return nn.Dense(D, dtype=jnp.bfloat16, name="c_proj")(y)


class Block(nn.Module):
    variant: str

    @nn.compact
    def __call__(self, x):
        x = x + CausalSelfAttention(self.variant)(nn.LayerNorm(dtype=jnp.bfloat16)(x))
        h = nn.Dense(4 * D, dtype=jnp.bfloat16)(nn.LayerNorm(dtype=jnp.bfloat16)(x))
        return x + nn.Dense(D, dtype=jnp.bfloat16)(nn.gelu(h))


class GPT(nn.Module):
    variant: str

    @nn.compact
    def __call__(self, idx):
        wte = nn.Embed(VOCAB, D, dtype=jnp.bfloat16)
        x = wte(idx) + nn.Embed(SEQ, D, dtype=jnp.bfloat16)(jnp.arange(idx.shape[1]))
        for _ in range(LAYERS):
            x = Block(self.variant)(x)
        return wte.attend(nn.LayerNorm(dtype=jnp.bfloat16)(x)).astype(jnp.float32)


def build(variant):
    model = GPT(variant)
    key = jax.random.key(0)
    tokens = jax.random.randint(key, (BATCH, SEQ + 1), 0, VOCAB)
    params = model.init(key, tokens[:, :-1])
    tx = optax.adamw(3e-4)
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
        return train_step(params, opt_state, tokens)

    return step, (params, opt_state, jnp.zeros(())), {"units": BATCH * SEQ, "unit": "tokens"}
