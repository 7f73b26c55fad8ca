"""Two idioms of work the result does not need, on JAX programs captured here on the CPU: a full decomposition read
for one extreme value (xdiag.idioms.op_identity: decomposition_for_one_value), and attention scores computed whole
under a positional mask that keeps a narrow band (xdiag.idioms.work_not_needed: masked_band_of_scores)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS
from xdiag.profile.locate import locate_session

from tests.idiom_capture import capture_programs
from tests.test_idioms_ops import line_of, matches

ATTENTION = """
    q, k, v = (jax.random.normal(jax.random.key(n), (1, 1024, 2, 64), jnp.bfloat16) for n in range(3))
    @jax.jit
    def attend(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / 8.0
        i = jnp.arange(1024)
        mask = {mask}
        s = jnp.where(mask[None, None], s, -1e9)
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)
    run = lambda: attend(q, k, v)
"""
PROGRAMS = {
    # name -> (body that defines run(), the idiom it holds or None)
    "spectral_norm": ("""
        w = jax.random.normal(jax.random.key(0), (8, 192, 192))
        @jax.jit
        def normalise(w):
            return w / jnp.linalg.norm(w, 2, axis=(-2, -1))[:, None, None]
        run = lambda: normalise(w)
    """, "decomposition_for_one_value"),
    "top_eigenvalue": ("""
        a = jax.random.normal(jax.random.key(0), (4, 64, 64))
        a = a @ jnp.swapaxes(a, -1, -2)
        @jax.jit
        def top(a):
            return jnp.linalg.eigvalsh(a)[:, -1]
        run = lambda: top(a)
    """, "decomposition_for_one_value"),
    "nuclear_norm": ("""
        w = jax.random.normal(jax.random.key(0), (8, 192, 192))
        @jax.jit
        def nuclear(w):
            return jnp.linalg.norm(w, "nuc", axis=(-2, -1))
        run = lambda: nuclear(w)
    """, None),
    "power_iteration": ("""
        w = jax.random.normal(jax.random.key(0), (8, 192, 192))
        def top(w):
            v = jnp.ones((192,)) / jnp.sqrt(192.0)
            v = jax.lax.fori_loop(0, 40, lambda _, v: (u := w.T @ (w @ v)) / jnp.linalg.norm(u), v)
            return jnp.linalg.norm(w @ v)
        normalise = jax.jit(lambda w: w / jax.vmap(top)(w)[:, None, None])
        run = lambda: normalise(w)
    """, None),
    "window_attention": (ATTENTION.format(mask="(i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 64)"),
                         "masked_band_of_scores"),
    "causal_attention": (ATTENTION.format(mask="i[:, None] >= i[None, :]"), None),
}
OURS = ("decomposition_for_one_value", "masked_band_of_scores")


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("band"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_holds_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {key for key in OURS if matches(captured[name], key)}
    assert found == ({expected} if expected else set()), found


def test_a_spectral_norm_names_the_svd_the_largest_value_and_power_iteration(captured):
    (match,) = matches(captured["spectral_norm"], "decomposition_for_one_value")
    assert match.params["routine"] == "svd" and match.facts["reads"] == ["largest"] and match.stake_percent > 50
    assert match.line.endswith(line_of(captured["spectral_norm"], "spectral_norm", "jnp.linalg.norm(w, 2")), match.line
    change = IDIOMS["decomposition_for_one_value"].change_text(match)
    assert change.startswith("find the largest singular value at ") and "jax.lax.fori_loop(0, 40" in change
    (eigen,) = matches(captured["top_eigenvalue"], "decomposition_for_one_value")
    assert eigen.params["routine"] == "eigh" and eigen.facts["reads"] == ["extreme"]


def test_a_band_mask_counts_what_it_keeps_and_blocks_by_its_width(captured):
    (match,) = matches(captured["window_attention"], "masked_band_of_scores")
    kept = (64 * 1024 - 64 * 63 / 2) / 1024 ** 2
    assert match.facts["kept_fraction"] == pytest.approx(kept, abs=2e-3) and match.facts["band_keys"] == 64
    assert match.needed_percent == pytest.approx(match.stake_percent * kept, rel=0.05)
    assert match.params["window"] == 64 and match.params["blocked_percent"] == 12.5
    # XLA:CPU records no stack for the fused score matmul: the mask's line names it (a TPU's names the einsum's)
    assert match.line.endswith(line_of(captured["window_attention"], "window_attention", "jnp.where(mask")), match.line
    change = IDIOMS["masked_band_of_scores"].change_text(match)
    assert change.startswith("compute the scores at ") and "q.reshape(b, t // 64, 64, h, d)" in change


@pytest.mark.parametrize("name, lead, text", [
    ("spectral_norm", "First, find the largest singular value at ", "jnp.linalg.norm(w, 2"),
    ("window_attention", "First, compute the scores at ", "jnp.where(mask")])
def test_the_report_leads_with_the_change_at_the_users_line(name, lead, text, captured, tmp_path):
    findings = analyze_session(locate_session(captured[name]), tmp_path / name).diagnosis.findings
    top = findings[0]
    assert top.key == PROGRAMS[name][1], [(f.key, f.fix[:100]) for f in findings]
    assert top.fix.startswith(lead) and "Expected:" in top.fix, top.fix
    assert line_of(captured[name], name, text) in top.fix, top.fix
