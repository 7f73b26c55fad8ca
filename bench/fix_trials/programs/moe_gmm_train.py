"""Training step of a two-layer mixture-of-experts feed-forward stack on JAX's Pallas grouped matmul (megablox gmm),
raw JAX with a hand-written SGD update.

As its user wrote it: 8,192 tokens of width 2,048, 8 experts of hidden width 4,096, top-2 routing (tokens sorted by
expert, group sizes from a bincount); gmm called with its default tiling (128, 128, 128). Variants:
  tile512          tiling=(512, 512, 512)
  tile512_1024     tiling=(512, 1024, 1024)
  tile256          tiling=(256, 256, 256)
"""
import jax
import jax.numpy as jnp

from _size import ON_CPU, size

FRAMEWORK, PHASE = "jax", "training"
VARIANTS = ["before", "tile256", "tile512", "tile512_1024"]
TOKENS, D, FFN, EXPERTS, TOPK, LAYERS = size(8192, 128), size(2048, 128), size(4096, 128), 8, 2, 2
CPU = {"interpret": True} if ON_CPU else {}  # CPU tests only


def build(variant):
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    tiling = {"tile256": (256, 256, 256), "tile512": (512, 512, 512),
              "tile512_1024": (512, 1024, 1024)}.get(variant, (128, 128, 128))  # EDIT (variants)
    if ON_CPU:
        tiling = (128, 128, 128)
    ks = jax.random.split(jax.random.key(3), 4)
    params = {
        "router": [jax.random.normal(k, (D, EXPERTS), jnp.float32) * 0.02 for k in jax.random.split(ks[0], LAYERS)],
        "w_in": [jax.random.normal(k, (EXPERTS, D, FFN), jnp.bfloat16) * 0.02 for k in jax.random.split(ks[1], LAYERS)],
        "w_out": [jax.random.normal(k, (EXPERTS, FFN, D), jnp.bfloat16) * 0.02 for k in jax.random.split(ks[2], LAYERS)],
    }
    x = jax.random.normal(ks[3], (TOKENS, D), jnp.bfloat16)

    def moe(x, router, w_in, w_out):
        probs = jax.nn.softmax(x.astype(jnp.float32) @ router, axis=-1)
        weights, experts = jax.lax.top_k(probs, TOPK)  # [tokens, k]
        flat = experts.reshape(-1)
        order = jnp.argsort(flat)
        rows = x[order // TOPK]  # tokens sorted by expert
        group_sizes = jnp.bincount(flat, length=EXPERTS).astype(jnp.int32)
        h = jax.nn.gelu(gmm(rows, w_in, group_sizes, preferred_element_type=jnp.bfloat16, tiling=tiling, **CPU))
        y = gmm(h, w_out, group_sizes, preferred_element_type=jnp.bfloat16, tiling=tiling, **CPU)
        y = jnp.zeros_like(y).at[order].set(y).reshape(TOKENS, TOPK, D)
        return x + (y * weights[..., None].astype(y.dtype)).sum(1)

    def loss_fn(params, x):
        for i in range(LAYERS):
            x = moe(x, params["router"][i], params["w_in"][i], params["w_out"][i])
        return jnp.mean(jnp.square(x.astype(jnp.float32)))

    @jax.jit
    def train_step(params, x):
        loss, grads = jax.value_and_grad(loss_fn)(params, x)
        return jax.tree.map(lambda p, g: p - (1e-3 * g).astype(p.dtype), params, grads), loss

    def step(carry):
        params, _ = carry
        return train_step(params, x)

    return step, (params, jnp.zeros(())), {"units": TOKENS, "unit": "tokens"}
