"""A Keras 3 (JAX backend) sentiment classifier: embedding, two stacked GRUs, a dense head, trained one batch at a
time with model.train_on_batch (which returns the loss as a Python float: the host waits for every step).

Written after the lever catalogue froze (i61cat a75606d), before any report of it was read. As its user wrote it:
batch 16, 200 tokens, GRU width 256. Variants (the changes a performance engineer would try):
  unroll        keras.layers.GRU(..., unroll=True)
  batch128      batch 128 (per-sample time compared)
  fit_spe       model.fit over 8 batches at once with steps_per_execution=8 (one host round trip per 8 steps)
  unroll_batch128  both
"""
import keras
import numpy as np

from _size import size

FRAMEWORK, PHASE = "keras3-jax", "training"
VARIANTS = ["before", "unroll", "batch128", "fit_spe", "unroll_batch128"]
TRACE_STEPS = 3
VOCAB, SEQ, WIDTH = 20000, size(200, 16), size(256, 16)


def build(variant):
    batch = 128 if "batch128" in variant else 16  # EDIT (batch128 variants)
    unroll = "unroll" in variant  # EDIT (unroll variants)
    model = keras.Sequential([
        keras.Input((SEQ,), dtype="int32"),
        keras.layers.Embedding(VOCAB, 128),
        keras.layers.GRU(WIDTH, return_sequences=True, unroll=unroll),
        keras.layers.GRU(WIDTH, unroll=unroll),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(optimizer="adam", loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    if variant == "fit_spe":  # EDIT: compile 8 steps into one call
        model.compile(optimizer="adam", loss="binary_crossentropy", steps_per_execution=8)
        x = rng.integers(0, VOCAB, (8 * batch, SEQ)).astype("int32")
        y = rng.integers(0, 2, (8 * batch, 1)).astype("float32")

        def step(carry):
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
            return None

        return step, None, {"units": 8 * batch, "unit": "samples"}
    x = rng.integers(0, VOCAB, (batch, SEQ)).astype("int32")
    y = rng.integers(0, 2, (batch, 1)).astype("float32")

    def step(carry):
        return model.train_on_batch(x, y)  # as written: a float per step

    return step, None, {"units": batch, "unit": "samples"}
