"""A sequence model whose causal running mean over time is a product with a lower-triangular matrix of ones."""
import jax
import jax.numpy as jnp

BATCH, SEQ, WIDTH = 4, 1024, 128


def running_sum(h):
    return jnp.tril(jnp.ones((SEQ, SEQ))) @ h


def setup():
    k = jax.random.split(jax.random.key(2), 4)
    params = {"w_in": jax.random.normal(k[0], (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH),
              "w_out": jax.random.normal(k[1], (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH)}
    x = jax.random.normal(k[2], (BATCH, SEQ, WIDTH), jnp.float32)
    y = jax.random.normal(k[3], (BATCH, SEQ, WIDTH), jnp.float32)
    return params, x, y, jnp.zeros(())


def _loss(params, x, y):
    counts = jnp.arange(1, SEQ + 1, dtype=jnp.float32)[:, None]
    h = jnp.tanh(x @ params["w_in"])
    mean_so_far = running_sum(h) / counts
    return jnp.mean((mean_so_far @ params["w_out"] - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss


def step(state, i):
    params, x, y, _ = state
    params, loss = train_step(params, x, y)
    return params, x, y, loss


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
