"""Quality filtering of a tokenized pretraining corpus shard on the accelerator, in raw JAX.

Each step takes one block of 2,048 documents of 2,048 token ids (vocabulary 50,304) and a blocklist of 8,192 token
ids (boilerplate, markup and script fragments the curation team flags). It computes each document's fraction of
blocklisted tokens, keeps the documents under the threshold, and counts the kept documents' clean tokens (the
training-token budget of the block). The step returns the fractions, the keep flags and the token count. Variants:
  fixed          membership read from a vocabulary-sized lookup table built from the blocklist
  binary_search  jnp.isin(..., method="binary_search"): the blocklist sorted, each token searched in it
  sort           jnp.isin(..., method="sort"): tokens and blocklist sorted together
  table_i32      the lookup table as int32 (a 4-byte gather instead of a 1-byte one)
  onehot_mxu     the table as 393 rows of 128: each token's row picked by a one-hot matmul, its lane by a compare
"""
import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "data processing (corpus filtering)"
VARIANTS = ["before", "fixed", "binary_search", "sort", "table_i32", "onehot_mxu"]
DOCS, SEQ, VOCAB, BLOCKED = size(2048, 8), size(2048, 64), 50304, size(8192, 4096)
THRESHOLD = 0.163


def build(variant):
    kt, kb = jax.random.split(jax.random.key(7))
    tokens = jax.random.randint(kt, (DOCS, SEQ), 0, VOCAB, jnp.int32)
    blocklist = jax.random.choice(kb, VOCAB, (BLOCKED,), replace=False).astype(jnp.int32)

    @jax.jit
    def filter_block(tokens, blocklist):
        if variant == "fixed":  # EDIT
            flagged = jnp.zeros((VOCAB,), bool).at[blocklist].set(True)[tokens]  # EDIT
        elif variant in ("binary_search", "sort"):  # EDIT
            flagged = jnp.isin(tokens, blocklist, method=variant)  # EDIT
        elif variant == "table_i32":  # EDIT
            flagged = jnp.zeros((VOCAB,), jnp.int32).at[blocklist].set(1)[tokens] > 0  # EDIT
        elif variant == "onehot_mxu":  # EDIT
            rows = -(-VOCAB // 128)  # EDIT
            table = jnp.zeros((rows * 128,), jnp.bfloat16).at[blocklist].set(1).reshape(rows, 128)  # EDIT
            picked = jax.nn.one_hot(tokens // 128, rows, dtype=jnp.bfloat16) @ table  # EDIT
            flagged = jnp.sum(jnp.where(tokens[..., None] % 128 == jnp.arange(128), picked, 0), -1) > 0  # EDIT
        else:
            flagged = jnp.isin(tokens, blocklist)
        frac = jnp.mean(flagged, axis=-1)
        keep = frac < THRESHOLD
        clean_tokens = jnp.sum(keep[:, None] & ~flagged)
        return frac, keep, clean_tokens

    def step(carry):
        tokens, blocklist, _ = carry
        return tokens, blocklist, filter_block(tokens, blocklist)

    init = (jnp.zeros((DOCS,), jnp.float32), jnp.zeros((DOCS,), bool), jnp.zeros((), jnp.int32))
    return step, (tokens, blocklist, init), {"units": DOCS * SEQ, "unit": "tokens"}
