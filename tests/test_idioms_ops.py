"""Idioms of what an op really is and of numerics (xdiag.idioms.op_identity, memory_numerics) on JAX programs captured
here on the CPU, each with the idiom and with the change made. Where the idiom costs only on an accelerator the
catalogue offers it there only, and its recogniser is read directly on the CPU capture."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, recognise
from xdiag.idioms.memory_numerics import LANES
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.conftest import SHARED_PROFILES, TESTS
from tests.idiom_capture import capture_programs

PROGRAMS = {
    # name -> (body that defines run(), the idiom it holds or None)
    "highest": ("""
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST))
        run = lambda: layer(x, w)
    """, "precision_highest_matmul"),
    "highest_by_default": ("""
        jax.config.update("jax_default_matmul_precision", "highest")
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(x @ w)
        run = lambda: layer(x, w)
    """, "precision_highest_matmul"),
    "default_precision": ("""
        x = jax.random.normal(jax.random.key(0), (512, 512))
        w = jax.random.normal(jax.random.key(1), (512, 512)) / 23
        @jax.jit
        def layer(x, w):
            return jnp.tanh(jnp.dot(x, w))
        run = lambda: layer(x, w)
    """, None),
    "dropout": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 1024))
        key = jax.random.key(1)
        @jax.jit
        def dropout(x, key):
            keep = jax.random.bernoulli(key, 0.9, x.shape)
            return jnp.where(keep, x / 0.9, 0.0)
        run = lambda: dropout(x, key)
    """, "threefry_random_bits"),
    "dropout_rbg": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 1024))
        key = jax.random.key(1, impl="rbg")
        @jax.jit
        def dropout(x, key):
            keep = jax.random.bernoulli(key, 0.9, x.shape)
            return jnp.where(keep, x / 0.9, 0.0)
        run = lambda: dropout(x, key)
    """, None),
    "unaligned": ("""
        x = jax.random.normal(jax.random.key(0), (4096, 130))
        w = jax.random.normal(jax.random.key(1), (130, 130)) / 12
        @jax.jit
        def features(x, w):
            return jnp.tanh(x @ w) * 2 + x
        run = lambda: features(x, w)
    """, "unaligned_minor_dims"),
    "aligned": ("""
        x = jax.random.normal(jax.random.key(0), (4096, 128))
        w = jax.random.normal(jax.random.key(1), (128, 128)) / 12
        @jax.jit
        def features(x, w):
            return jnp.tanh(x @ w) * 2 + x
        run = lambda: features(x, w)
    """, None),
    "scan_tiny": ("""
        xs = jax.random.normal(jax.random.key(0), (4096, 8))
        @jax.jit
        def smooth(xs):
            def trip(c, x):
                c = jnp.tanh(0.9 * c + x)
                return c, c
            return jax.lax.scan(trip, jnp.zeros(8), xs)
        run = lambda: smooth(xs)
    """, "scan_tiny_body"),
    "scan_unrolled": ("""
        xs = jax.random.normal(jax.random.key(0), (4096, 8))
        @jax.jit
        def smooth(xs):
            def trip(c, x):
                c = jnp.tanh(0.9 * c + x)
                return c, c
            return jax.lax.scan(trip, jnp.zeros(8), xs, unroll=16)
        run = lambda: smooth(xs)
    """, None),
    "segment_sum": ("""
        rows = jax.random.normal(jax.random.key(0), (262144, 64))
        ids = jax.random.randint(jax.random.key(1), (262144,), 0, 1024)
        @jax.jit
        def pool(rows, ids):
            return jax.ops.segment_sum(rows, ids, num_segments=1024)
        run = lambda: pool(rows, ids)
    """, "scatter_unsorted_indices"),
    "segment_sum_sorted": ("""
        rows = jax.random.normal(jax.random.key(0), (262144, 64))
        ids = jax.random.randint(jax.random.key(1), (262144,), 0, 1024)
        order = jnp.argsort(ids)
        rows, ids = rows[order], ids[order]
        @jax.jit
        def pool(rows, ids):
            return jax.ops.segment_sum(rows, ids, num_segments=1024, indices_are_sorted=True)
        run = lambda: pool(rows, ids)
    """, None),
    "pinv": ("""
        a = jax.random.normal(jax.random.key(0), (16, 96, 48))
        b = jax.random.normal(jax.random.key(1), (16, 96))
        @jax.jit
        def fit(a, b):
            return jnp.einsum("bij,bj->bi", jnp.linalg.pinv(a), b)
        run = lambda: fit(a, b)
    """, "svd_for_least_squares"),
    "qr": ("""
        a = jax.random.normal(jax.random.key(0), (16, 96, 48))
        b = jax.random.normal(jax.random.key(1), (16, 96))
        @jax.jit
        def fit(a, b):
            q, r = jnp.linalg.qr(a)
            return jax.scipy.linalg.solve_triangular(r, jnp.einsum("bji,bj->bi", q, b)[..., None])[..., 0]
        run = lambda: fit(a, b)
    """, None),
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("ops"))


def matches(path: Path, idiom: str):
    """The idiom's matches in the capture, from its recogniser (whatever the platforms the catalogue offers it on)."""
    return IDIOMS[idiom].recognise(Program(read_session_in_process([path])))


def line_of(path: Path, name: str, text: str) -> str:
    script = (path.parents[4] / f"{name}.py").read_text().splitlines()
    return f"{name}.py:{next(n for n, line in enumerate(script, 1) if text in line)}"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_holds_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {key for key in OURS if matches(captured[name], key)}
    assert found == ({expected} if expected else set()), found


OURS = ("precision_highest_matmul", "threefry_random_bits", "unaligned_minor_dims", "scan_tiny_body",
        "scatter_unsorted_indices", "svd_for_least_squares")


@pytest.mark.parametrize("name", ["highest", "highest_by_default"])
def test_a_float32_matmul_at_highest_precision_names_its_line_and_passes(name, captured):
    (match,) = matches(captured[name], "precision_highest_matmul")
    text = "jnp.dot(x, w, precision=" if name == "highest" else "jnp.tanh(x @ w)"
    assert match.line.endswith(line_of(captured[name], name, text)), match.line
    assert match.facts["example"] == "dot f32[512,512] × f32[512,512]" and match.work_ratio == 6
    assert match.needed_percent == pytest.approx(match.stake_percent / 6) and match.stake_percent > 20
    assert IDIOMS["precision_highest_matmul"].platforms == ("TPU", "GPU")
    assert "precision_highest_matmul" not in {m.idiom for m in recognise(read_session_in_process([captured[name]]))}


def test_threefry_bits_for_a_dropout_mask_name_the_call_and_its_line(captured):
    """A CPU runs JAX's rbg generator no faster than threefry (its RngBitGenerator is expanded into integer ops
    there too): the catalogue offers the change on a TPU or GPU only, and the recogniser is read here directly."""
    (match,) = matches(captured["dropout"], "threefry_random_bits")
    assert match.line.endswith(line_of(captured["dropout"], "dropout", "jax.random.bernoulli(key")), match.line
    assert match.facts["words_per_op"] == 1024 * 1024 and match.facts["random_calls"] == ["bernoulli", "uniform"]
    assert match.stake_percent > 20 and match.params["calls"] == "jax.random.bernoulli, jax.random.uniform"
    change = IDIOMS["threefry_random_bits"].change_text(match)
    assert change.startswith('make the random bits with the rbg generator: jax.config.update("jax_default_prng_impl"')
    assert IDIOMS["threefry_random_bits"].platforms == ("TPU", "GPU")


def test_an_unaligned_minor_dimension_names_the_dimension_and_the_multiple(captured):
    (match,) = matches(captured["unaligned"], "unaligned_minor_dims")
    assert match.facts["minor_dim"] == 130 and match.facts["padded_to"] == 256
    assert match.work_ratio == pytest.approx(256 / 130, abs=0.01) and "f32[4096,130]" in match.what
    change = IDIOMS["unaligned_minor_dims"].change_text(match)
    assert change.startswith("make the dimension of 130 a multiple of 128 at ") and "to 128 or 256" in change
    assert match.line.endswith(line_of(captured["unaligned"], "unaligned", "jnp.tanh(x @ w)")), match.line
    assert IDIOMS["unaligned_minor_dims"].platforms == ("TPU",)


TPU_PROFILES = sorted((TESTS / "profiles" / "tpu_v5e").glob("*.xplane.pb")) + sorted(
    (SHARED_PROFILES / "tpu").glob("*.xplane.pb"))


@pytest.mark.parametrize("path", TPU_PROFILES, ids=lambda p: p.name)
def test_no_committed_tpu_profile_is_read_as_unaligned_where_its_arrays_are_aligned(path):
    """Over the TPU captures: every match names a minor dimension that is no multiple of the 128 lanes, and the ops
    it stakes hold arrays laid out with that dimension minor (a multiple of 128 or a power of two under it is never
    named: XLA folds those into full tiles)."""
    for match in matches(path, "unaligned_minor_dims"):
        minor = match.facts["minor_dim"]
        assert minor % LANES and not (minor < LANES and minor & (minor - 1) == 0), match.what
        assert match.facts["padded_to"] == -(-minor // LANES) * LANES


def test_a_tiny_scan_names_its_trips_and_its_line(captured):
    """XLA:CPU compiles so small a loop into one kernel (a trip costs nanoseconds there): the catalogue offers the
    change on a TPU or GPU only, where each trip pays its condition and a launch per op."""
    (match,) = matches(captured["scan_tiny"], "scan_tiny_body")
    assert match.facts["trips"] == 4096 and match.facts["largest_bytes"] == 32
    assert not match.facts["independent_trips"] and match.stake_percent > 10
    assert match.line.endswith(line_of(captured["scan_tiny"], "scan_tiny", "jax.lax.scan(trip")), match.line
    change = IDIOMS["scan_tiny_body"].change_text(match)
    assert change.startswith("unroll the loop at ") and "jax.lax.scan(body, carry, xs, unroll=8)" in change
    assert "the loop 512 trips" in change
    assert IDIOMS["scan_tiny_body"].platforms == ("TPU", "GPU")


@pytest.mark.parametrize("name, lead", [("segment_sum", "First, sort the segment ids once where the data is prepared"),
                                        ("pinv", "First, solve at ")])
def test_the_report_leads_with_the_change_at_the_users_line(name, lead, captured, tmp_path):
    findings = analyze_session(locate_session(captured[name]), tmp_path / name).diagnosis.findings
    top = findings[0]
    assert top.key == PROGRAMS[name][1], [(f.key, f.fix[:100]) for f in findings]
    assert top.fix.startswith(lead) and "Expected:" in top.fix, top.fix
    text = "jax.ops.segment_sum(rows" if name == "segment_sum" else "jnp.linalg.pinv(a)"
    assert line_of(captured[name], name, text) in top.fix, top.fix


def test_a_scatter_add_names_its_segments_and_the_flag(captured):
    (match,) = matches(captured["segment_sum"], "scatter_unsorted_indices")
    assert match.facts["segments"] == 1024 and match.facts["indices"] == "s32[262144,1]" and match.facts[
        "one_hot_plausible"]
    assert "indices_are_sorted=false" in match.what
    assert "num_segments=1024, indices_are_sorted=True" in IDIOMS["scatter_unsorted_indices"].change_text(match)


def test_a_pseudo_inverse_names_the_routine_and_its_replacement(captured):
    (match,) = matches(captured["pinv"], "svd_for_least_squares")
    change = IDIOMS["svd_for_least_squares"].change_text(match)
    assert match.params["routine"] == "pinv" and "instead of jnp.linalg.pinv(a) @ b" in change
    assert "jnp.linalg.qr(a)" in change and match.stake_percent > 50
    # the HIGHEST precision pinv's own products ask for is no change of the user's
    assert not matches(captured["pinv"], "precision_highest_matmul")


def test_a_tpu_matmul_xla_writes_as_a_convolution_is_named_a_matmul(tmp_path):
    """XLA:TPU writes a dot as a convolution with no spatial dimension: the finding names it a matmul, as the user
    wrote it (the committed float32 MLP at precision HIGHEST)."""
    import lzma

    packed = Path(__file__).parent / "profiles" / "fix_trials" / "mlp_f32_raw.before-a.xplane.pb.xz"
    (tmp_path / "mlp.xplane.pb").write_bytes(lzma.decompress(packed.read_bytes()))
    session = read_session_in_process([tmp_path / "mlp.xplane.pb"])
    [match] = IDIOMS["precision_highest_matmul"].recognise(Program(session))
    assert match.facts["example"].startswith("matmul f32[") and "convolution" not in match.what, match.what
