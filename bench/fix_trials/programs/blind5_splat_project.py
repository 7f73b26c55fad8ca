"""3D Gaussian-splatting renderer, projection stage, for an orbiting camera, in raw JAX (float32).

The scene is 262,144 anisotropic 3D Gaussians (centre, per-axis log-scale, rotation quaternion, opacity). For each
frame the camera moves along an orbit; the projection stage rotates every Gaussian into camera space, builds its 3D
covariance from scale and rotation, projects it through the pinhole Jacobian to a 2D screen covariance (with the
usual 0.3-pixel dilation), takes the conic (inverse 2D covariance) the rasteriser evaluates, and the screen radius
from the larger eigenvalue. Each step projects one batch of 8 consecutive frames of the render queue and adds, over
the Gaussians in front of the camera and on screen, their screen footprint area and an opacity-weighted sum of the
conics (what the tile binner and rasteriser consume). It returns the frame number and the running sums. Variants:
  fixed      the conic written out from the 2x2 covariance's entries and determinant
  cholesky   the conic from a batched Cholesky factorisation of the 2x2 covariances
  solve      the inverse by jnp.linalg.solve against the identity (a report's first change, timed as written)
"""
import jax
import jax.numpy as jnp
import numpy as np

from _size import size

FRAMEWORK, PHASE = "jax", "inference (3D reconstruction rendering, Gaussian splatting)"
VARIANTS = ["before", "fixed", "cholesky", "solve"]
GAUSSIANS, VIEWS = size(262144, 64), size(8, 2)
WIDTH, HEIGHT, FOCAL = 1280, 720, 900.0


def quat_to_rot(q):
    w, x, y, z = (q / jnp.linalg.norm(q, axis=-1, keepdims=True)).T
    return [[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]]


def camera(frame):
    angle = 0.02 * frame
    c, s = jnp.cos(angle), jnp.sin(angle)
    view = jnp.array([[c, 0.0, -s], [0.0, 1.0, 0.0], [s, 0.0, c]])  # world -> camera rotation
    return view, jnp.array([0.0, 0.0, 4.0])


def conic_of(a, b, c, variant):
    """The inverse of each 2x2 covariance [[a, b], [b, c]], as its three distinct entries."""
    if variant == "fixed":  # EDIT
        det = a * c - b * b  # EDIT
        return c / det, -b / det, a / det  # EDIT
    cov = jnp.stack([jnp.stack([a, b], -1), jnp.stack([b, c], -1)], -2)
    if variant == "cholesky":  # EDIT
        eye = jnp.broadcast_to(jnp.eye(2), cov.shape)  # EDIT
        inv = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(cov), True), eye)  # EDIT
    elif variant == "solve":  # EDIT
        inv = jnp.linalg.solve(cov, jnp.broadcast_to(jnp.eye(2), cov.shape))  # EDIT
    else:
        inv = jnp.linalg.inv(cov)
    return inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]


def build(variant):
    km, ks, kq, ko = jax.random.split(jax.random.key(42), 4)
    means = jax.random.normal(km, (GAUSSIANS, 3), jnp.float32) * jnp.array([1.5, 0.8, 1.5])
    log_scales = jax.random.normal(ks, (GAUSSIANS, 3), jnp.float32) * 0.5 - 4.0
    quats = jax.random.normal(kq, (GAUSSIANS, 4), jnp.float32)
    opacity = jax.nn.sigmoid(jax.random.normal(ko, (GAUSSIANS,), jnp.float32))

    def project(frame, area_sum, conic_sum):
        view, trans = camera(frame.astype(jnp.float32))
        p = means @ view.T + trans
        x, y, z = p[:, 0], p[:, 1], p[:, 2]
        rot = quat_to_rot(quats)
        s = jnp.exp(log_scales).T
        m = [[rot[i][j] * s[j] for j in range(3)] for i in range(3)]
        sigma = [[sum(m[i][k] * m[j][k] for k in range(3)) for j in range(3)] for i in range(3)]
        w = [[view[i, j] for j in range(3)] for i in range(3)]
        ws = [[sum(w[i][k] * sigma[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
        cam = [[sum(ws[i][k] * w[j][k] for k in range(3)) for j in range(3)] for i in range(3)]
        zc = jnp.maximum(z, 0.2)
        j0 = [FOCAL / zc, 0.0, -FOCAL * x / zc ** 2]
        j1 = [0.0, FOCAL / zc, -FOCAL * y / zc ** 2]
        jc0 = [sum(j0[k] * cam[k][n] for k in range(3)) for n in range(3)]
        jc1 = [sum(j1[k] * cam[k][n] for k in range(3)) for n in range(3)]
        a = sum(jc0[n] * j0[n] for n in range(3)) + 0.3
        b = sum(jc0[n] * j1[n] for n in range(3))
        c = sum(jc1[n] * j1[n] for n in range(3)) + 0.3
        ia, ib, ic = conic_of(a, b, c, variant)
        mid = 0.5 * (a + c)
        radius = 3.0 * jnp.sqrt(mid + jnp.sqrt(jnp.maximum(0.1, mid * mid - (a * c - b * b))))
        u, v = FOCAL * x / zc + WIDTH / 2, FOCAL * y / zc + HEIGHT / 2
        visible = (z > 0.2) & (u + radius > 0) & (u - radius < WIDTH) & (v + radius > 0) & (v - radius < HEIGHT)
        area_sum = area_sum + jnp.sum(jnp.where(visible, (2 * radius) ** 2, 0.0))
        conic_sum = conic_sum + jnp.sum(jnp.where(visible, opacity, 0.0)[:, None] * jnp.stack([ia, ib, ic], -1), 0)
        return frame + 1, area_sum, conic_sum

    @jax.jit
    def render_batch(frame, area_sum, conic_sum):
        return jax.lax.fori_loop(0, VIEWS, lambda i, c: project(*c), (frame, area_sum, conic_sum))

    def step(carry):
        return render_batch(*carry)

    return step, (jnp.zeros((), jnp.int32), jnp.zeros(()), jnp.zeros((3,))), {"units": VIEWS, "unit": "frames"}
