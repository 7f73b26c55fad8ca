"""A small Vision Transformer trained with Flax NNX and optax in float32, as a research codebase ported from
PyTorch sets it up: full-precision matmuls for the whole program (jax.config 'jax_default_matmul_precision' =
'highest', to match the PyTorch numbers) and nnx.remat on every encoder block.

Written after the lever catalogue froze (i61cat a75606d), before any report of it was read. As its user wrote it:
64x64 images in 8x8 patches (64 tokens), width 512, 8 heads, 8 blocks, batch 256. Variants:
  default    the precision setting removed (the TPU's default bf16 passes)
  noremat    nnx.remat removed
  default_noremat  both
"""
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from _size import size

FRAMEWORK, PHASE = "flax.nnx", "training"
VARIANTS = ["before", "default", "noremat", "default_noremat"]
IMG, PATCH, WIDTH, HEADS, BLOCKS, BATCH, CLASSES = size(64, 16), 8, size(512, 32), size(8, 2), size(8, 2), size(256, 4), 100


class Block(nnx.Module):
    def __init__(self, rngs):
        self.norm1 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class ViT(nnx.Module):
    def __init__(self, remat, rngs):
        self.embed = nnx.Linear(PATCH * PATCH * 3, WIDTH, rngs=rngs)
        self.pos = nnx.Param(jnp.zeros((1, (IMG // PATCH) ** 2, WIDTH)))
        self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])
        self.head = nnx.Linear(WIDTH, CLASSES, rngs=rngs)
        self.remat = remat

    def __call__(self, images):
        b = images.shape[0]
        p = images.reshape(b, IMG // PATCH, PATCH, IMG // PATCH, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
        x = self.embed(p.reshape(b, -1, PATCH * PATCH * 3)) + self.pos
        for block in self.blocks:
            x = nnx.remat(lambda blk, h: blk(h))(block, x) if self.remat else block(x)  # EDIT (noremat variants)
        return self.head(x.mean(axis=1))


def build(variant):
    # as written: jax.config.update("jax_default_matmul_precision", "highest")
    jax.config.update("jax_default_matmul_precision", None if "default" in variant else "highest")  # EDIT
    model = ViT(remat="noremat" not in variant, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    key = jax.random.key(8)
    images = jax.random.normal(key, (BATCH, IMG, IMG, 3), jnp.float32)
    labels = jax.random.randint(key, (BATCH,), 0, CLASSES)

    @nnx.jit
    def train_step(model, optimizer, images, labels):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(images), labels).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def step(carry):
        return train_step(model, optimizer, images, labels)

    return step, None, {"units": BATCH, "unit": "images"}
