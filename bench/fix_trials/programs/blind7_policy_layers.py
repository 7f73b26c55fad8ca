"""Deep residual MLP controller for a fleet of simulated planar arms, with a jitted dynamics model.

Each step is one control tick: the policy maps every arm's observation to a torque, and the dynamics advance the
arms. The policy is built from small layer helpers (layer norm, dense + GELU, dense + residual), each decorated
with jax.jit, applied block by block.

Variants:
  fixed: the whole policy forward is one jitted function scanning over the stacked block parameters.
  jit_unrolled: the whole policy forward is one jitted function with the Python loop over blocks inside it.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (robotics control)"
VARIANTS = ["before", "fixed", "jit_unrolled"]
TRACE_STEPS = 2

ARMS = size(128, 8)
JOINTS = 7
OBS = 2 * JOINTS + 3
WIDTH = size(256, 32)
BLOCKS = size(48, 3)
DT = 0.01


@jax.jit
def norm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)


@jax.jit
def dense_gelu(w, b, x):
    return jax.nn.gelu(x @ w + b)


@jax.jit
def dense_residual(w, b, x, res):
    return res + x @ w + b


def block(p, h):
    return dense_residual(p["w2"], p["b2"], dense_gelu(p["w1"], p["b1"], norm(h)), h)


def policy_loop(params, obs):
    h = obs @ params["inp"]
    for p in params["blocks"]:
        h = block(p, h)
    return jnp.tanh(norm(h) @ params["out"])


@jax.jit  # EDIT
def policy_scan(params, obs):  # EDIT
    h = obs @ params["inp"]  # EDIT

    def body(h, p):  # EDIT
        return block(p, h), None  # EDIT

    h, _ = jax.lax.scan(body, h, params["stacked"])  # EDIT
    return jnp.tanh(norm(h) @ params["out"])  # EDIT


@jax.jit
def dynamics(state, target, torque):
    q, dq = state
    ddq = 4.0 * torque - 0.5 * dq - 2.0 * jnp.sin(q)
    dq = dq + DT * ddq
    q = q + DT * dq
    tip = jnp.stack([jnp.cos(q).sum(-1), jnp.sin(q).sum(-1)], -1) / JOINTS
    obs = jnp.concatenate([q, dq, tip - target, jnp.zeros((q.shape[0], 1))], -1)
    return (q, dq), obs


def build(variant):
    ks = iter(jax.random.split(jax.random.key(0), 4 + 4 * BLOCKS))
    nrm = lambda shape, fan: jax.random.normal(next(ks), shape, jnp.float32) / np.sqrt(fan)
    blocks = [{"w1": nrm((WIDTH, 2 * WIDTH), WIDTH), "b1": jnp.zeros(2 * WIDTH),
               "w2": nrm((2 * WIDTH, WIDTH), 2 * WIDTH) * 0.2, "b2": jnp.zeros(WIDTH)} for _ in range(BLOCKS)]
    params = {"inp": nrm((OBS, WIDTH), OBS), "out": nrm((WIDTH, JOINTS), WIDTH) * 0.1}
    if variant == "fixed":  # EDIT
        params["stacked"] = jax.tree.map(lambda *a: jnp.stack(a), *blocks)  # EDIT
        policy = lambda obs: policy_scan(params, obs)  # EDIT
    elif variant == "jit_unrolled":  # EDIT
        params["blocks"] = blocks  # EDIT
        policy = lambda obs, f=jax.jit(policy_loop): f(params, obs)  # EDIT
    else:  # EDIT
        params["blocks"] = blocks  # EDIT
        policy = lambda obs: policy_loop(params, obs)  # EDIT

    kq, kt = jax.random.split(jax.random.key(1))
    q0 = jax.random.uniform(kq, (ARMS, JOINTS), jnp.float32, -1.0, 1.0)
    target = jax.random.uniform(kt, (ARMS, 2), jnp.float32, -0.5, 0.5)
    state0, obs0 = dynamics((q0, jnp.zeros_like(q0)), target, jnp.zeros_like(q0))

    def step(carry):
        state, obs = carry
        torque = policy(obs)
        return dynamics(state, target, torque)

    return step, (state0, obs0), {"units": ARMS, "unit": "arm control ticks"}
