"""An MLP trained in float32 with its matmuls at the highest precision."""
import jax
import jax.numpy as jnp

BATCH, WIDTH, LAYERS = 256, 512, 2
HIGHEST = jax.lax.Precision.HIGHEST


def _loss(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(jnp.dot(h, w, precision=HIGHEST))
    return jnp.mean(h * h)


@jax.jit
def train_step(ws, x):
    grads = jax.grad(_loss)(ws, x)
    return [w - 1e-3 * g for w, g in zip(ws, grads)]


def setup():
    keys = jax.random.split(jax.random.key(0), LAYERS + 1)
    ws = [jax.random.normal(k, (WIDTH, WIDTH), jnp.float32) / jnp.sqrt(WIDTH) for k in keys[:LAYERS]]
    return ws, jax.random.normal(keys[-1], (BATCH, WIDTH), jnp.float32)


def step(state, i):
    ws, x = state
    return train_step(ws, x), x


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
