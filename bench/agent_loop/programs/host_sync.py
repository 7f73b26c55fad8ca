"""Training with gradient clipping done in numpy and per-micro-step logging and weight monitoring."""
import jax
import jax.numpy as jnp
import numpy as np

MICRO_STEPS = 4
CALLBACK_ELEMENTS = 1 << 19  # gradient elements the clipping threshold is computed from
BATCH, WIDTH = 64, 768


def _host_clip_scale(grad: np.ndarray) -> np.ndarray:
    """numpy gradient clipping with an adaptive threshold."""
    g = np.asarray(grad, dtype=np.float64)
    norm = float(np.sqrt(np.sum(g * g)))
    p99 = float(np.percentile(np.abs(g), 99.0))
    threshold = 10.0 * p99 * np.sqrt(g.size)
    return np.asarray(min(1.0, threshold / (norm + 1e-12)), dtype=np.float32)


def _loss(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - x) ** 2)


@jax.jit
def update(params, x):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    scale = jax.pure_callback(
        _host_clip_scale,
        jax.ShapeDtypeStruct((), jnp.float32),
        grads["w1"].reshape(-1)[:CALLBACK_ELEMENTS],
    )
    params = jax.tree.map(lambda p, g: p - 0.01 * scale * g, params, grads)
    grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    return params, loss, grad_norm


def setup():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (WIDTH, WIDTH)) / np.sqrt(WIDTH),
        "w2": jax.random.normal(k2, (WIDTH, WIDTH)) / np.sqrt(WIDTH),
    }
    xs = list(jax.random.normal(k3, (MICRO_STEPS, BATCH, WIDTH)))
    return params, xs, []


def step(state, i):
    params, xs, log = state
    for k in range(MICRO_STEPS):
        params, loss, grad_norm = update(params, xs[k])
        log.append(float(loss))  # logging
        log.append(float(jax.device_get(grad_norm)))
        w1_host = np.asarray(params["w1"])  # monitoring: the weights' largest magnitude
        log.append(float(np.abs(w1_host).max()))
    del log[:-100]
    return params, xs, log


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
