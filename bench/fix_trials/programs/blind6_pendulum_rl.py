"""Policy evaluation for a swing-up controller: a batch of pendulums is simulated for one episode under a
deterministic MLP policy and the episode returns are collected.

Variants:
  fixed: the pendulum dynamics are written in jax.numpy and the whole episode runs in one jitted lax.scan.
  jit_per_step: the pendulum dynamics are written in jax.numpy; each time step (policy and dynamics) is one jitted
    call from the Python loop.
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (robotics control, policy rollout)"
VARIANTS = ["before", "fixed", "jit_per_step"]
TRACE_STEPS = 1
RTOL = 2e-3

ENVS = size(1024, 16)
HORIZON = size(200, 8)
HIDDEN = size(256, 16)
G, M, L, DT, MAX_SPEED, MAX_TORQUE = 10.0, 1.0, 1.0, 0.05, 8.0, 2.0


def init_policy():
    ks = jax.random.split(jax.random.key(5), 3)
    dims = [3, HIDDEN, HIDDEN, 1]
    return [(jax.random.normal(k, (a, b)) * a ** -0.5, jnp.zeros((b,))) for k, a, b in zip(ks, dims[:-1], dims[1:])]


@jax.jit
def policy(params, obs):
    x = obs
    for w, b in params[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = params[-1]
    return MAX_TORQUE * jnp.tanh(x @ w + b)[:, 0]


def angle_normalize(x, xp):
    return ((x + xp.pi) % (2 * xp.pi)) - xp.pi


def env_step(th, thdot, u, xp):  # EDIT
    """One pendulum step for xp = numpy or jax.numpy: new state and reward."""  # EDIT
    reward = -(angle_normalize(th, xp) ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2)  # EDIT
    thdot = xp.clip(thdot + (3 * G / (2 * L) * xp.sin(th) + 3.0 / (M * L ** 2) * u) * DT,  # EDIT
                    -MAX_SPEED, MAX_SPEED).astype(xp.float32)  # EDIT
    th = (th + thdot * DT).astype(xp.float32)  # EDIT
    return th, thdot, reward.astype(xp.float32)  # EDIT


def observe(th, thdot, xp):
    return xp.stack([xp.cos(th), xp.sin(th), thdot], axis=1).astype(xp.float32)


def initial_state():
    rng = np.random.default_rng(0)
    return (rng.uniform(-np.pi, np.pi, ENVS).astype(np.float32), rng.uniform(-1, 1, ENVS).astype(np.float32))


def rollout_numpy(params, th, thdot):  # EDIT
    ret = np.zeros(ENVS, np.float32)  # EDIT
    for _ in range(HORIZON):  # EDIT
        u = np.asarray(policy(params, observe(th, thdot, np)))  # EDIT
        th, thdot, r = env_step(th, thdot, u, np)  # EDIT
        ret += r  # EDIT
    return ret  # EDIT


@jax.jit  # EDIT
def rollout_scan(params, th, thdot):  # EDIT
    def body(state, _):  # EDIT
        th, thdot = state  # EDIT
        th, thdot, r = env_step(th, thdot, policy(params, observe(th, thdot, jnp)), jnp)  # EDIT
        return (th, thdot), r  # EDIT
    return jax.lax.scan(body, (th, thdot), None, length=HORIZON)[1].sum(0)  # EDIT


@jax.jit  # EDIT
def one_step(params, th, thdot, ret):  # EDIT
    th, thdot, r = env_step(th, thdot, policy(params, observe(th, thdot, jnp)), jnp)  # EDIT
    return th, thdot, ret + r  # EDIT


def rollout_jit_per_step(params, th, thdot):  # EDIT
    ret = jnp.zeros(ENVS, jnp.float32)  # EDIT
    for _ in range(HORIZON):  # EDIT
        th, thdot, ret = one_step(params, th, thdot, ret)  # EDIT
    return ret  # EDIT


def build(variant):
    params = init_policy()
    th0, thdot0 = initial_state()
    rollout = {"before": rollout_numpy, "fixed": rollout_scan, "jit_per_step": rollout_jit_per_step}[variant]  # EDIT

    def step(carry):
        params, _ = carry
        return params, rollout(params, th0, thdot0)

    return step, (params, np.zeros(ENVS, np.float32)), {"units": ENVS * HORIZON, "unit": "env steps"}


def result(carry):
    return carry[1]
