"""Training the input projection of a recurrent network in raw JAX whose frozen recurrent weight carries a low-rank
adapter (LoRA), rolled over the sequence with jax.lax.scan and a jax.checkpoint-ed cell (to keep activation memory
flat).

The cell merges the adapter into the recurrent weight, W + scale * (A @ B), so the merged matrix is rebuilt on every
time step although none of W, A, B changes along the scan. In the backward pass the rematerialised cell rebuilds it
on every step again, behind the optimization barrier jax.checkpoint puts on the cell's inputs, which XLA's
loop-invariant code motion does not look through.

As its user wrote it: batch 32, width 2,048, rank 64, 256 time steps, float32, one SGD step per call. Variants:
  fixed   the adapter merged once before the scan; the cell closes over the merged matrix
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (recurrent, scan with jax.checkpoint)"
VARIANTS = ["before", "fixed"]
BATCH, WIDTH, RANK, STEPS = size(32, 4), size(2048, 256), size(64, 8), size(256, 8)
SCALE, LR = 0.5, 1e-3


def build(variant):
    ks = jax.random.split(jax.random.key(7), 6)

    def w(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])

    frozen = {"w": w(ks[0], (WIDTH, WIDTH)), "a": w(ks[1], (WIDTH, RANK)), "b": w(ks[2], (RANK, WIDTH))}
    u = w(ks[3], (WIDTH, WIDTH))
    xs = jax.random.normal(ks[4], (STEPS, BATCH, WIDTH), jnp.float32)
    targets = jax.random.normal(ks[5], (BATCH, WIDTH), jnp.float32)

    def loss(u, frozen, xs, targets):
        inputs = jnp.einsum("tbd,de->tbe", xs, u)
        if variant == "fixed":  # EDIT
            merged = frozen["w"] + SCALE * (frozen["a"] @ frozen["b"])  # EDIT

        @jax.checkpoint
        def cell(h, x):
            if variant == "fixed":  # EDIT
                rec = merged  # EDIT
            else:
                rec = frozen["w"] + SCALE * (frozen["a"] @ frozen["b"])  # as written: merged every step
            return jnp.tanh(x + h @ rec), None

        h, _ = jax.lax.scan(cell, jnp.zeros((BATCH, WIDTH), jnp.float32), inputs)
        return jnp.mean((h - targets) ** 2)

    @jax.jit
    def train_step(u, frozen, xs, targets):
        value, grad = jax.value_and_grad(loss)(u, frozen, xs, targets)
        return u - LR * grad, value

    def step(carry):
        return train_step(carry[0], frozen, xs, targets)

    return step, (u, jnp.float32(0)), {"units": BATCH * STEPS, "unit": "token steps"}
