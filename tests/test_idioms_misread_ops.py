"""Ops that are not what they look like (xdiag.idioms.op_identity): a grouped convolution whose window is hundreds or
thousands of taps long, jnp.searchsorted's default binary search as a loop of gathers, and an FFT that XLA:TPU runs as
stages of HIGHEST-precision matmuls, which is no precision the program asked for. The CPU programs hold each idiom
and its change; what only XLA:TPU writes (an FFT's matmuls) is read from the chip's committed captures."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.idioms import IDIOMS

from tests.idiom_capture import capture_programs
from tests.test_idioms_ops import line_of, matches
from tests.test_idioms_tpu_captures import program  # noqa: F401  (a fixture: the chip's captures, read once)

PROGRAMS = {
    # name -> (body that defines run(), the idiom it holds or None)
    "long_depthwise": ("""
        v = jax.random.normal(jax.random.key(0), (2, 16, 1024))
        h = jax.random.normal(jax.random.key(1), (16, 512)) / 20
        @jax.jit
        def causal(v, h):
            return jax.lax.conv_general_dilated(v, h[:, None, ::-1], (1,), [(511, 0)], dimension_numbers=(
                "NCH", "OIH", "NCH"), feature_group_count=16)
        run = lambda: causal(v, h)
    """, "long_window_convolution"),
    "long_by_fft": ("""
        v = jax.random.normal(jax.random.key(0), (2, 16, 1024))
        h = jax.random.normal(jax.random.key(1), (16, 512)) / 20
        @jax.jit
        def causal(v, h):
            spec = jnp.fft.rfft(v, n=2048) * jnp.fft.rfft(h, n=2048)
            return jnp.fft.irfft(spec, n=2048)[..., :1024]
        run = lambda: causal(v, h)
    """, None),
    "short_depthwise": ("""
        v = jax.random.normal(jax.random.key(0), (2, 16, 8192))
        h = jax.random.normal(jax.random.key(1), (16, 7)) / 3
        @jax.jit
        def smooth(v, h):
            return jax.lax.conv_general_dilated(v, h[:, None, :], (1,), "SAME", dimension_numbers=(
                "NCH", "OIH", "NCH"), feature_group_count=16)
        run = lambda: smooth(v, h)
    """, None),
    "buckets_scan": ("""
        bounds = jnp.sort(jax.random.normal(jax.random.key(0), (8, 255)), axis=-1)
        x = jax.random.normal(jax.random.key(1), (65536, 8))
        @jax.jit
        def bucketize(bounds, x):
            return jax.vmap(lambda b, c: jnp.searchsorted(b, c, side="right"), in_axes=(0, 1), out_axes=1)(bounds, x)
        run = lambda: bucketize(bounds, x)
    """, "searchsorted_binary_search"),
    "buckets_compare_all": ("""
        bounds = jnp.sort(jax.random.normal(jax.random.key(0), (8, 255)), axis=-1)
        x = jax.random.normal(jax.random.key(1), (65536, 8))
        @jax.jit
        def bucketize(bounds, x):
            return jax.vmap(lambda b, c: jnp.searchsorted(b, c, side="right", method="compare_all"), in_axes=(0, 1),
                            out_axes=1)(bounds, x)
        run = lambda: bucketize(bounds, x)
    """, None),
}
OURS = ("long_window_convolution", "searchsorted_binary_search", "fft_lowered_to_matmuls")


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("misread"))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_holds_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {key for key in OURS if matches(captured[name], key)}
    assert found == ({expected} if expected else set()), found


def test_a_long_depthwise_convolution_names_its_taps_its_groups_and_the_fft(captured):
    (match,) = matches(captured["long_depthwise"], "long_window_convolution")
    assert match.facts["taps"] == 512 and match.facts["features_per_group"] == 1 and match.facts["channels"] == 16
    assert match.facts["multiply_adds_per_run"] == 2 * 16 * 1024 * 512 and match.stake_percent > 50
    assert match.line.endswith(line_of(captured["long_depthwise"], "long_depthwise", "conv_general_dilated")), \
        match.line
    change = IDIOMS["long_window_convolution"].change_text(match)
    assert change.startswith("convolve by FFT at ") and "L >= n + 512 - 1" in change and "jnp.fft.rfft(x, n=L" in change


def test_jnp_searchsorted_default_method_names_its_table_trips_and_compare_all(captured):
    (match,) = matches(captured["buckets_scan"], "searchsorted_binary_search")
    assert match.facts["table_entries"] == 255 and match.facts["trips"] == 8 and match.facts["queries"] == 65536 * 8
    assert match.line.endswith(line_of(captured["buckets_scan"], "buckets_scan", "jnp.searchsorted(b, c")), \
        match.line
    change = IDIOMS["searchsorted_binary_search"].change_text(match)
    assert change.startswith('search with method="compare_all" at ') and "all 255 entries" in change
    long_table = IDIOMS["searchsorted_binary_search"].change_text(
        type(match)(match.idiom, match.stake_percent, match.what, params={**match.params, "short_table": False}))
    assert long_table.startswith('search with method="sort" at ')
    assert IDIOMS["searchsorted_binary_search"].platforms == ("TPU", "GPU")


def test_an_ffts_highest_matmuls_on_a_tpu_are_not_the_programs_precision(program):
    """jnp.fft.fft, which XLA:TPU runs as stages of float32 matmuls at precision HIGHEST: the precision finding names
    only the matmul the program wrote with precision=HIGHEST (the mel filterbank's), not the FFT's line, and no
    stage's table is read as a structured matrix standing in for a sum."""
    audio = program("blind4_audio_tagging", "before-a")
    (precision,) = IDIOMS["precision_highest_matmul"].recognise(audio)
    assert precision.line.endswith("blind4_audio_tagging.py:71") and precision.stake_percent < 5, precision.what
    assert not IDIOMS["structured_matmul"].recognise(audio)  # nor are the FFT's coefficient tables a lookup's
    (fft,) = IDIOMS["fft_lowered_to_matmuls"].recognise(audio)
    assert fft.line.endswith("blind4_audio_tagging.py:64") and fft.facts["points"] == 1024 and fft.stake_percent > 60
    assert "n = 1024; " in IDIOMS["fft_lowered_to_matmuls"].change_text(fft)
    assert IDIOMS["fft_lowered_to_matmuls"].platforms == ("TPU",)
    # the spectrum as two matmuls holds no FFT; a 4,096-point FFT (a long convolution's) is past the premise
    assert not IDIOMS["fft_lowered_to_matmuls"].recognise(program("blind4_audio_tagging", "dft"))
    assert not IDIOMS["fft_lowered_to_matmuls"].recognise(program("blind4_dna_longconv", "fixed"))
