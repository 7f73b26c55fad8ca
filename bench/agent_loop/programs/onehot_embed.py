"""A small token classifier whose embedding lookup is a one-hot product, as code ported from a framework without a
gather often writes it."""
import jax
import jax.numpy as jnp

VOCAB, WIDTH, BATCH, SEQ, CLASSES = 16384, 128, 4, 256, 128


def embed(table, ids):
    return jax.nn.one_hot(ids, VOCAB) @ table


def _loss(params, ids, labels):
    h = embed(params["table"], ids)
    h = h + jax.nn.gelu(h @ params["w1"]) @ params["w2"]
    logits = h.mean(axis=1) @ params["head"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


@jax.jit
def train_step(params, ids, labels):
    loss, g = jax.value_and_grad(_loss)(params, ids, labels)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss


def setup():
    k = jax.random.split(jax.random.key(1), 6)
    params = {"table": jax.random.normal(k[0], (VOCAB, WIDTH), jnp.float32) * 0.02,
              "w1": jax.random.normal(k[1], (WIDTH, 4 * WIDTH), jnp.float32) / jnp.sqrt(WIDTH),
              "w2": jax.random.normal(k[2], (4 * WIDTH, WIDTH), jnp.float32) / jnp.sqrt(4 * WIDTH),
              "head": jax.random.normal(k[3], (WIDTH, CLASSES), jnp.float32) / jnp.sqrt(WIDTH)}
    ids = jax.random.randint(k[4], (BATCH, SEQ), 0, VOCAB)
    labels = jax.random.randint(k[5], (BATCH,), 0, CLASSES)
    return params, ids, labels, jnp.zeros(())


def step(state, i):
    params, ids, labels, _ = state
    params, loss = train_step(params, ids, labels)
    return params, ids, labels, loss


if __name__ == "__main__":  # python PROGRAM.py OUT_DIR: 2 warm-up steps, then 10 profiled steps into OUT_DIR
    import sys

    state = setup()
    for k in range(2):
        state = step(state, k)
    jax.block_until_ready(state)
    jax.profiler.start_trace(sys.argv[1])
    for k in range(10):
        with jax.profiler.StepTraceAnnotation("train", step_num=k):
            state = step(state, k)
            jax.block_until_ready(state)
    jax.profiler.stop_trace()
