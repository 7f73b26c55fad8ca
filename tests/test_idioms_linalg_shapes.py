"""JAX's linear algebra where the matrices' shapes or the loop around it decide the change, on programs captured
here on the CPU: a decomposition over a stack of tiny matrices, whose closed form is the change
(xdiag.idioms.op_identity: tiny_matrix_decomposition), not another factorisation (linear_algebra); and a solve in a
loop that rebuilds its matrix every trip, where no factorisation can be hoisted (linear_algebra's Cholesky change)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS
from xdiag.profile.locate import locate_session

from tests.idiom_capture import capture_programs
from tests.test_idioms_ops import line_of, matches

PROGRAMS = {
    # name -> (body that defines run(), the idioms it holds)
    "stacked_2x2_inverse": ("""
        a, b, c = (jax.random.uniform(jax.random.key(n), (16384,)) + 2.0 * (n != 1) for n in range(3))
        @jax.jit
        def conic(a, b, c):
            cov = jnp.stack([jnp.stack([a, b], -1), jnp.stack([b, c], -1)], -2)
            inv = jnp.linalg.inv(cov)
            return jnp.sum(inv[:, 0, 0] + inv[:, 0, 1] + inv[:, 1, 1])
        run = lambda: conic(a, b, c)
    """, {"tiny_matrix_decomposition"}),
    "closed_form_2x2_inverse": ("""
        a, b, c = (jax.random.uniform(jax.random.key(n), (16384,)) + 2.0 * (n != 1) for n in range(3))
        @jax.jit
        def conic(a, b, c):
            det = a * c - b * b
            return jnp.sum(c / det - b / det + a / det)
        run = lambda: conic(a, b, c)
    """, set()),
    "stacked_large_inverse": ("""
        m = jax.random.normal(jax.random.key(0), (8, 256, 256)) + 16.0 * jnp.eye(256)
        @jax.jit
        def apply(m):
            return jnp.sum(jnp.linalg.inv(m) @ jnp.ones((256, 1)))
        run = lambda: apply(m)
    """, {"linear_algebra"}),
}
LOOP = """
    a0 = jax.random.normal(jax.random.key(0), (256, 256))
    a0 = a0 @ a0.T / 256 + jnp.eye(256)
    b = jnp.ones((256, 8))
    @jax.jit
    def advance(x, t):
        def one(i, state):
            x, t = state
            a = {matrix}
            return jnp.linalg.solve(a, x), t + 1.0
        return jax.lax.fori_loop(0, 4, one, (x, t))
    run = lambda: advance(b, jnp.float32(0.0))
"""
SOLVES = {"rebuilt_each_trip": LOOP.format(matrix="a0 + t * jnp.eye(256)"), "same_each_trip": LOOP.format(matrix="a0")}
OURS = ("tiny_matrix_decomposition", "linear_algebra")


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    return capture_programs({**{name: body for name, (body, _) in PROGRAMS.items()}, **SOLVES},
                            tmp_path_factory.mktemp("linalg"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_holds_where_the_program_has_it_and_only_there(name, captured):
    found = {key for key in OURS if matches(captured[name], key)}
    assert found == PROGRAMS[name][1], found


def test_a_stack_of_2x2_inverses_names_its_count_order_and_closed_form(captured):
    (match,) = matches(captured["stacked_2x2_inverse"], "tiny_matrix_decomposition")
    assert match.facts["matrices"] == 16384 and match.params["order"] == 2 and match.stake_percent > 20
    assert "16,384 2×2 matrices" in match.what
    assert match.line.endswith(line_of(captured["stacked_2x2_inverse"], "stacked_2x2_inverse", "jnp.linalg.inv"))
    change = IDIOMS["tiny_matrix_decomposition"].change_text(match)
    assert "instead of jnp.linalg.inv" in change and "[[d, -b], [-c, a]] / (a * d - b * c)" in change


def test_the_report_leads_with_the_closed_form(captured, tmp_path):
    findings = analyze_session(locate_session(captured["stacked_2x2_inverse"]), tmp_path / "r").diagnosis.findings
    assert findings[0].key == "tiny_matrix_decomposition", [(f.key, f.fix[:100]) for f in findings]
    assert findings[0].fix.startswith("First, write the 2×2 inverse") and "Expected:" in findings[0].fix


def test_a_matrix_rebuilt_from_the_loops_state_is_solved_by_cholesky_not_factored_once(captured):
    (match,) = matches(captured["rebuilt_each_trip"], "linear_algebra")
    assert match.facts["rebuilt_each_trip"] and "rebuilds the matrix from its state every trip" in match.what
    change = IDIOMS["linear_algebra"].change_text(match)
    assert change.startswith("solve by Cholesky at ") and 'assume_a="pos"' in change and "symmetric positive" in change
    assert match.line.endswith(line_of(captured["rebuilt_each_trip"], "rebuilt_each_trip", "jnp.linalg.solve"))
    (same,) = matches(captured["same_each_trip"], "linear_algebra")  # its factorisation is one to keep
    assert not same.facts["rebuilt_each_trip"]
    assert IDIOMS["linear_algebra"].change_text(same).startswith("factor the matrix once")
