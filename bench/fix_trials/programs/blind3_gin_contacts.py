"""Graph isomorphism network (GIN) scoring of protein contact graphs, in raw JAX (float32).

Each step scores a batch of 16 protein-complex-like chains of 4,096 residues: the contact graph links residues
closer than 6 length units (a dense 0/1 adjacency per chain, built from the coordinates when the batch is loaded),
node features are 128 wide, and 6 GIN layers compute h <- MLP((1 + eps) h + A h) with sum aggregation over contacts;
a sum readout and a linear layer give 2 class logits per chain. The step returns the logits. Variants:
  fixed   the 0/1 adjacency stored as bfloat16 (exact for 0/1) instead of float32
  int8    the adjacency stored as int8, converted to float32 by jnp's promotion inside the jitted gin (a quarter of
          the bytes where XLA fuses the convert into the matmul's read)
  fixed_params_bf16  fixed, and the parameters cast to bfloat16 once (the change the fixed capture's report led with)
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "inference (graph neural network)"
VARIANTS = ["before", "fixed", "int8", "fixed_params_bf16"]
GRAPHS, NODES, FEAT, LAYERS = size(16, 2), size(4096, 32), size(128, 16), size(6, 2)
CUTOFF = 6.0
RTOL = 5e-2  # fixed_params_bf16 rounds the parameters to bfloat16 (the CPU's float32 matmuls keep what a TPU rounds)


def init_params(key):
    keys = jax.random.split(key, 2 * LAYERS + 1)
    layers = [{"w1": jax.random.normal(keys[2 * i], (FEAT, FEAT), jnp.float32) / jnp.sqrt(FEAT),
               "w2": jax.random.normal(keys[2 * i + 1], (FEAT, FEAT), jnp.float32) / jnp.sqrt(FEAT),
               "b1": jnp.zeros((FEAT,), jnp.float32), "b2": jnp.zeros((FEAT,), jnp.float32),
               "eps": jnp.float32(0.1)} for i in range(LAYERS)]
    out = jax.random.normal(keys[-1], (FEAT, 2), jnp.float32) / jnp.sqrt(FEAT)
    return {"layers": layers, "out": out}


@jax.jit
def load_batch(key):
    kc, kf = jax.random.split(key)
    coords = jnp.cumsum(jax.random.normal(kc, (GRAPHS, NODES, 3), jnp.float32) * 2.2, axis=1)
    d2 = jnp.sum((coords[:, :, None, :] - coords[:, None, :, :]) ** 2, axis=-1)
    contact = (d2 < CUTOFF ** 2) & ~jnp.eye(NODES, dtype=bool)
    feats = jax.random.normal(kf, (GRAPHS, NODES, FEAT), jnp.float32)
    return contact, feats


@jax.jit
def gin(params, adj, h):
    for layer in params["layers"]:
        agg = (1.0 + layer["eps"]) * h + adj @ h
        h = jax.nn.relu(agg @ layer["w1"] + layer["b1"]) @ layer["w2"] + layer["b2"]
        h = h / jnp.sqrt(1.0 + jnp.mean(h * h, axis=-1, keepdims=True))
    return jnp.sum(h, axis=1) @ params["out"]


def build(variant):
    kp, kb = jax.random.split(jax.random.key(8))
    params = init_params(kp)
    contact, feats = load_batch(kb)
    if variant in ("fixed", "fixed_params_bf16"):  # EDIT
        adj = contact.astype(jnp.bfloat16)  # EDIT
    elif variant == "int8":  # EDIT
        adj = contact.astype(jnp.int8)  # EDIT
    else:
        adj = contact.astype(jnp.float32)
    del contact
    if variant == "fixed_params_bf16":  # EDIT
        params = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)  # EDIT

    def step(carry):
        params, feats, _ = carry
        return params, feats, gin(params, adj, feats)

    return step, (params, feats, jnp.zeros((GRAPHS, 2), jnp.float32)), {"units": GRAPHS, "unit": "graphs"}
