"""Click-through-rate model for ad ranking: 26 categorical fields look up rows of one shared hashed embedding
table, the concatenated embeddings go through an MLP, and the model is trained with logistic loss and plain SGD.

Variants:
  fixed: the loss is differentiated with respect to the looked-up rows; the table is updated with a scatter-add of
    those row gradients into the donated table.
  rows_no_donate: the loss is differentiated with respect to the looked-up rows; the table is updated with a
    scatter-add of those row gradients, the table not donated.
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (recommendation, CTR)"
VARIANTS = ["before", "fixed", "rows_no_donate"]
TRACE_STEPS = 3

ROWS = size(1_000_000, 997)
DIM = size(128, 16)
FIELDS = 26
BATCH = size(8192, 32)
HIDDEN = size(512, 32)
LR = 0.05


def init_params():
    ks = jax.random.split(jax.random.key(9), 4)
    dims = [FIELDS * DIM, HIDDEN, HIDDEN // 2, 1]
    mlp = [(jax.random.normal(k, (a, b)) * (2.0 / a) ** 0.5, jnp.zeros((b,))) for k, a, b in zip(ks[1:], dims[:-1], dims[1:])]
    return {"table": jax.random.normal(ks[0], (ROWS, DIM)) * 0.01, "mlp": mlp}


def mlp_loss(mlp, emb, labels):
    x = emb.reshape(emb.shape[0], -1)
    for w, b in mlp[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = mlp[-1]
    logit = (x @ w + b)[:, 0]
    return jnp.mean(jnp.logaddexp(0.0, logit) - labels * logit)


def loss_full(params, ids, labels):  # EDIT
    return mlp_loss(params["mlp"], params["table"][ids], labels)  # EDIT


def make_batch(i):
    """Synthetic click logs: skewed (Zipf-like) ids per field, labels from a hidden rule."""
    k = jax.random.fold_in(jax.random.key(10), i)
    ku, kl = jax.random.split(k)
    u = jax.random.uniform(ku, (BATCH, FIELDS))
    ids = (jnp.floor(ROWS * u ** 3).astype(jnp.int32) + 7919 * jnp.arange(FIELDS)) % ROWS
    labels = (jax.random.uniform(kl, (BATCH,)) < 0.2 + 0.5 * (ids[:, 0] % 3 == 0)).astype(jnp.float32)
    return ids, labels


def build(variant):
    def train_step(carry):
        params, i, _ = carry
        ids, labels = make_batch(i)
        if variant == "before":
            loss, g = jax.value_and_grad(loss_full)(params, ids, labels)  # EDIT
            params = jax.tree.map(lambda p, gi: p - LR * gi, params, g)  # EDIT
        else:
            emb = params["table"][ids]  # EDIT
            loss, (g_mlp, g_emb) = jax.value_and_grad(mlp_loss, argnums=(0, 1))(params["mlp"], emb, labels)  # EDIT
            mlp = jax.tree.map(lambda p, gi: p - LR * gi, params["mlp"], g_mlp)  # EDIT
            params = {"table": params["table"].at[ids].add(-LR * g_emb), "mlp": mlp}  # EDIT
        return params, i + 1, loss

    step = jax.jit(train_step, donate_argnums=0 if variant == "fixed" else ())  # EDIT
    return step, (init_params(), jnp.int32(0), jnp.zeros(())), {"units": BATCH, "unit": "examples"}


def result(carry):
    return carry[0]
