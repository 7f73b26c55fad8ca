"""Rollout collection for PPO on 2,048 vectorized CartPole environments written in JAX (gymnax-style), float32.

The policy is an actor-critic MLP (4 -> 64 -> 64, a 2-way action head and a value head). Each step collects one
rollout of 64 environment steps: the policy samples an action per environment, the environments advance (resetting
the ones whose pole fell or left the track), and the loop counts finished episodes for the training log. The
rollout's advantages are then computed with GAE (gamma 0.99, lambda 0.95) and their mean and standard deviation
kept, as the update normalises with them. Variants:
  fixed      the 64 environment steps run as one lax.scan inside a single jitted rollout function
  nosync     the Python loop kept, with the finished-episode count accumulated on the device
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "RL rollout collection"
VARIANTS = ["before", "fixed", "nosync"]
ENVS, HORIZON, HIDDEN = size(2048, 16), size(64, 8), 64
TRACE_STEPS = 1
GAMMA, LAMBDA = 0.99, 0.95

GRAVITY, CART_M, POLE_M, POLE_L, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


def env_reset(key, n):
    return jax.random.uniform(key, (n, 4), jnp.float32, -0.05, 0.05)


def env_step(state, action, key):
    x, x_dot, theta, theta_dot = state[:, 0], state[:, 1], state[:, 2], state[:, 3]
    force = jnp.where(action == 1, FORCE, -FORCE)
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    total = CART_M + POLE_M
    temp = (force + POLE_M * POLE_L * theta_dot ** 2 * sin) / total
    theta_acc = (GRAVITY * sin - cos * temp) / (POLE_L * (4.0 / 3.0 - POLE_M * cos ** 2 / total))
    x_acc = temp - POLE_M * POLE_L * theta_acc * cos / total
    new = jnp.stack([x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc], 1)
    done = (jnp.abs(new[:, 0]) > 2.4) | (jnp.abs(new[:, 2]) > 0.2095)
    new = jnp.where(done[:, None], env_reset(key, state.shape[0]), new)
    return new, jnp.ones_like(x), done


def init_params(key):
    k = jax.random.split(key, 4)
    def lin(kk, a, b, scale=1.0):
        return {"w": jax.random.normal(kk, (a, b), jnp.float32) * scale / np.sqrt(a), "b": jnp.zeros((b,))}
    return {"l1": lin(k[0], 4, HIDDEN), "l2": lin(k[1], HIDDEN, HIDDEN), "pi": lin(k[2], HIDDEN, 2, 0.01),
            "v": lin(k[3], HIDDEN, 1)}


def policy(params, obs):
    h = jnp.tanh(obs @ params["l1"]["w"] + params["l1"]["b"])
    h = jnp.tanh(h @ params["l2"]["w"] + params["l2"]["b"])
    return h @ params["pi"]["w"] + params["pi"]["b"], (h @ params["v"]["w"] + params["v"]["b"])[:, 0]


def transition(params, state, key):
    key, k_act, k_env = jax.random.split(key, 3)
    logits, value = policy(params, state)
    action = jax.random.categorical(k_act, logits)
    logp = jax.nn.log_softmax(logits)[jnp.arange(state.shape[0]), action]
    new_state, reward, done = env_step(state, action, k_env)
    return new_state, key, (state, action, logp, value, reward, done)


act_and_step = jax.jit(transition)


@jax.jit
def advantages(params, last_state, values, rewards, dones):
    _, last_value = policy(params, last_state)

    def back(carry, xs):
        gae, next_value = carry
        value, reward, done = xs
        nonterm = 1.0 - done.astype(jnp.float32)
        delta = reward + GAMMA * next_value * nonterm - value
        gae = delta + GAMMA * LAMBDA * nonterm * gae
        return (gae, value), gae

    _, adv = jax.lax.scan(back, (jnp.zeros_like(last_value), last_value), (values, rewards, dones), reverse=True)
    return jnp.stack([adv.mean(), adv.std()])


@jax.jit  # EDIT
def rollout(params, state, key):  # EDIT
    def body(c, _):  # EDIT
        s, k = c  # EDIT
        s, k, tr = transition(params, s, k)  # EDIT
        return (s, k), tr  # EDIT
    (state, key), traj = jax.lax.scan(body, (state, key), None, length=HORIZON)  # EDIT
    return state, key, traj  # EDIT


def result(carry):
    _, state, _, episodes, stats = carry
    return state, episodes, stats


def build(variant):
    kp, ke, key = jax.random.split(jax.random.key(7), 3)
    params = init_params(kp)
    state = env_reset(ke, ENVS)

    def step(carry):
        params, state, key, episodes, _ = carry
        if variant == "fixed":  # EDIT
            state, key, traj = rollout(params, state, key)  # EDIT
            episodes = episodes + traj[5].sum()  # EDIT
            _, _, _, values, rewards, dones = traj  # EDIT
        else:
            values, rewards, dones = [], [], []
            for _ in range(HORIZON):
                state, key, (_, _, _, value, reward, done) = act_and_step(params, state, key)
                if variant == "nosync":  # EDIT
                    episodes = episodes + done.sum()  # EDIT
                else:
                    episodes += int(done.sum())
                values.append(value)
                rewards.append(reward)
                dones.append(done)
            values, rewards, dones = jnp.stack(values), jnp.stack(rewards), jnp.stack(dones)
        stats = advantages(params, state, values, rewards, dones)
        return params, state, key, episodes, stats

    return step, (params, state, key, 0, jnp.zeros(2)), {"units": ENVS * HORIZON, "unit": "env steps"}
