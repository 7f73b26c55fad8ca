"""Prompt prefill of a Keras 3 decoder-only language model (JAX backend, bfloat16), served with predict_on_batch.

As its user wrote it: a custom attention layer in keras.ops (matmul, a causal mask, softmax, matmul), as Keras
tutorials write one, over 4,096-token prompts; the model returns the next-token logits. Variants:
  dpa    the attention core replaced by keras.ops.dot_product_attention(q, k, v, is_causal=True)
         (on a TPU Keras runs it with the Splash flash-attention kernel when it can)
  flash  the same with flash_attention=True (Keras raises if the kernel cannot be used)
"""
import math

import keras
import numpy as np
from keras import ops

from _size import size

FRAMEWORK, PHASE = "keras3-jax", "inference prefill"
VARIANTS = ["before", "dpa", "flash"]
VOCAB, D, HEADS, LAYERS = size(16384, 512), size(1024, 64), size(16, 4), size(8, 2)
BATCH, SEQ = size(2, 1), size(4096, 128)


class CausalAttention(keras.layers.Layer):
    def __init__(self, variant, **kw):
        super().__init__(**kw)
        self.variant = variant
        self.qkv = keras.layers.Dense(3 * D, use_bias=False)
        self.out = keras.layers.Dense(D, use_bias=False)

    def call(self, x):
        b, s = ops.shape(x)[0], ops.shape(x)[1]
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        q, k, v = (ops.reshape(t, (b, s, HEADS, D // HEADS)) for t in (q, k, v))  # [b, s, h, d]
        if self.variant == "dpa":  # EDIT
            y = ops.dot_product_attention(q, k, v, is_causal=True)
        elif self.variant == "flash":  # EDIT
            y = ops.dot_product_attention(q, k, v, is_causal=True, flash_attention=True)
        else:  # as written
            q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # [b, h, s, d]
            scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / math.sqrt(D // HEADS)
            mask = ops.tril(ops.ones((s, s), dtype="bool"))
            scores = ops.where(mask, scores, -1e9)
            y = ops.transpose(ops.matmul(ops.softmax(scores, axis=-1), v), (0, 2, 1, 3))
        return self.out(ops.reshape(y, (b, s, D)))


def make_model(variant):
    tokens = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, D)(tokens)
    for _ in range(LAYERS):
        x = x + CausalAttention(variant)(keras.layers.LayerNormalization()(x))
        h = keras.layers.Dense(4 * D, activation="gelu")(keras.layers.LayerNormalization()(x))
        x = x + keras.layers.Dense(D)(h)
    last = keras.layers.LayerNormalization()(x[:, -1])
    return keras.Model(tokens, keras.layers.Dense(VOCAB)(last))


def build(variant):
    keras.config.set_dtype_policy("bfloat16")
    model = make_model(variant)
    prompts = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ)).astype("int32")

    def step(carry):
        return model.predict_on_batch(prompts)  # the next-token logits, on the host

    return step, None, {"units": BATCH * SEQ, "unit": "tokens"}
