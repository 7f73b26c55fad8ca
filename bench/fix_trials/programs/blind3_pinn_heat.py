"""Physics-informed neural network for the 1-D heat equation u_t = a u_xx on [0,1] x [0,1], in raw JAX (float32).

The network u(x, t) is an MLP 2 -> 128 -> 128 -> 1 (tanh). The loss is the mean squared PDE residual at 4,096
collocation points (u_t and u_xx by automatic differentiation, per point) plus the initial condition u(x, 0) =
sin(pi x) and zero boundary values at 1,024 points each. The training helper takes the diffusivity and learning rate
as keyword settings, bound with functools.partial. Each step is one SGD update; it returns the parameters and the
loss. Variants:
  fixed   the jitted update built once, when the trainer is set up
"""
import functools

import jax
import jax.numpy as jnp

from _size import size

FRAMEWORK, PHASE = "jax", "training (PINN)"
VARIANTS = ["before", "fixed"]
TRACE_STEPS = 1  # every step retraces and compiles: the Python tracer records all of it
WIDTH, N_COLLOC, N_EDGE = size(128, 16), size(4096, 64), size(1024, 16)


def init_params(key):
    dims = [2, WIDTH, WIDTH, 1]
    keys = jax.random.split(key, len(dims) - 1)
    return [{"w": jax.random.normal(k, (a, b), jnp.float32) * jnp.sqrt(1.0 / a), "b": jnp.zeros((b,), jnp.float32)}
            for k, a, b in zip(keys, dims[:-1], dims[1:])]


def u_fn(params, x, t):
    h = jnp.stack([x, t])
    for i, layer in enumerate(params):
        h = h @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            h = jnp.tanh(h)
    return h[0]


def loss_fn(params, pts, init_x, edge_t, *, alpha):
    u_t = jax.grad(u_fn, argnums=2)
    u_xx = jax.grad(jax.grad(u_fn, argnums=1), argnums=1)
    res = jax.vmap(lambda x, t: u_t(params, x, t) - alpha * u_xx(params, x, t))(pts[:, 0], pts[:, 1])
    u0 = jax.vmap(lambda x: u_fn(params, x, 0.0))(init_x)
    ub = jax.vmap(lambda t: jnp.stack([u_fn(params, 0.0, t), u_fn(params, 1.0, t)]))(edge_t)
    return jnp.mean(res ** 2) + jnp.mean((u0 - jnp.sin(jnp.pi * init_x)) ** 2) + jnp.mean(ub ** 2)


def sgd_step(params, pts, init_x, edge_t, *, alpha, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, pts, init_x, edge_t, alpha=alpha)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def build(variant):
    kp, kc, ki, ke = jax.random.split(jax.random.key(2), 4)
    params = init_params(kp)
    pts = jax.random.uniform(kc, (N_COLLOC, 2), jnp.float32)
    init_x = jax.random.uniform(ki, (N_EDGE,), jnp.float32)
    edge_t = jax.random.uniform(ke, (N_EDGE,), jnp.float32)
    settings = {"alpha": 0.1, "lr": 1e-3}
    built_once = jax.jit(functools.partial(sgd_step, **settings))  # EDIT

    def step(carry):
        params, pts, init_x, edge_t, _ = carry
        if variant == "fixed":  # EDIT
            update = built_once  # EDIT
        else:
            update = jax.jit(functools.partial(sgd_step, **settings))
        params, loss = update(params, pts, init_x, edge_t)
        return params, pts, init_x, edge_t, loss

    return step, (params, pts, init_x, edge_t, jnp.zeros(())), {"units": N_COLLOC, "unit": "collocation points"}
