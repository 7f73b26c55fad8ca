"""The idiom catalogue (xdiag.idioms) on real profiles: JAX programs captured here on the CPU with each idiom and
without it, read by the recognisers and the rule engine as a user's profile would be."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, PATTERNS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.idiom_capture import capture_programs

REMAT_SCAN = """
        B, D, R, T = 8, 512, 16, 32
        k = jax.random.split(jax.random.key(0), 4)
        w, a = jax.random.normal(k[0], (D, D)) / 32, jax.random.normal(k[1], (D, R)) / 4
        b, xs = jax.random.normal(k[2], (R, D)) / 32, jax.random.normal(k[3], (T, B, D))
        def loss(u, xs):
            {outside}
            @jax.checkpoint
            def cell(h, x):
                {inside}
                return jnp.tanh(x + h @ rec), None
            h, _ = jax.lax.scan(cell, jnp.zeros((B, D)), xs @ u)
            return jnp.sum(h ** 2)
        step = jax.jit(jax.grad(loss))
        run = lambda: step(w, xs)
"""
PROGRAMS = {
    # name -> (body of step(x), the idiom it holds or None)
    "onehot": ("""
        V, D, N = 8192, 128, 1024
        table = jax.random.normal(jax.random.key(0), (V, D))
        ids = jax.random.randint(jax.random.key(1), (N,), 0, V)
        @jax.jit
        def embed(table, ids):
            return jax.nn.one_hot(ids, V) @ table
        run = lambda: embed(table, ids)
    """, "structured_matmul"),
    "lookup": ("""
        V, D, N = 8192, 128, 1024
        table = jax.random.normal(jax.random.key(0), (V, D))
        ids = jax.random.randint(jax.random.key(1), (N,), 0, V)
        @jax.jit
        def embed(table, ids):
            return table[ids] * 2.0
        run = lambda: embed(table, ids)
    """, None),
    "tril": ("""
        T, D = 1024, 256
        x = jax.random.normal(jax.random.key(0), (T, D))
        @jax.jit
        def running(x):
            return jnp.tril(jnp.ones((T, T))) @ x
        run = lambda: running(x)
    """, "structured_matmul"),
    "sort": ("""
        x = jax.random.normal(jax.random.key(0), (64, 16384))
        @jax.jit
        def best(x):
            return jnp.sort(x, axis=-1)[:, -8:]
        run = lambda: best(x)
    """, None),  # full_sort is no idiom on a CPU, where jax.lax.top_k is a full sort too (read directly below)
    "quantile": ("""
        x = jax.random.normal(jax.random.key(0), (1 << 18,))
        @jax.jit
        def clip_at(x):
            return jnp.percentile(jnp.abs(x), 99.0)
        run = lambda: clip_at(x)
    """, None),
    "top_k": ("""
        x = jax.random.normal(jax.random.key(0), (64, 16384))
        @jax.jit
        def best(x):
            return jax.lax.top_k(x, 8)[0]
        run = lambda: best(x)
    """, None),
    "per_row": ("""
        w = jax.random.normal(jax.random.key(0), (1024, 1024))
        xs = jax.random.normal(jax.random.key(1), (64, 1024))
        @jax.jit
        def serve(w, xs):
            return jax.lax.map(lambda x: jnp.tanh(x @ w), xs)
        run = lambda: serve(w, xs)
    """, "loop_invariant_weights"),
    "loop_of_calls": ("""
        w = jax.random.normal(jax.random.key(0), (64, 64)) / 8  # tiny calls: the device idles between them
        @jax.jit
        def relax(x):
            y = jnp.tanh(x @ w)
            return y, jnp.abs(y - x).max()
        x0 = jnp.ones((8, 64))
        def run():
            x = x0
            for _ in range(20):
                x, change = relax(x)
                if float(change) < 1e-9:
                    break
            return x
    """, "python_loop_of_calls"),
    "layouts": ("""
        x = jax.random.normal(jax.random.key(0), (8, 16, 256, 64))
        w = jax.random.normal(jax.random.key(1), (64, 64))
        @jax.jit
        def project(x, w):
            y = jnp.tanh(x @ w)
            return y, jnp.swapaxes(y, 1, 2), jnp.transpose(y, (0, 3, 2, 1))
        run = lambda: project(x, w)
    """, "transposed_outputs"),
    "one_transposed_output": ("""
        x = jax.random.normal(jax.random.key(0), (8, 16, 256, 64))
        w = jax.random.normal(jax.random.key(1), (64, 64))
        @jax.jit
        def project(x, w):
            return jnp.swapaxes(jnp.tanh(x @ w), 1, 2)
        run = lambda: project(x, w)
    """, None),
    "crop_head": ("""
        N, S, C, K, W = 2, 48, 32, 16, 12
        dn = ("NHWC", "HWIO", "NHWC")
        w1 = jax.random.normal(jax.random.key(0), (3, 3, C, C)) / 20
        w2 = jax.random.normal(jax.random.key(1), (1, 1, C, K)) / 6
        feats = jax.random.normal(jax.random.key(2), (N, S, S, C))
        offset = jnp.array([10, 20])
        @jax.jit
        def region(feats, offset):
            y = jax.nn.relu(jax.lax.conv_general_dilated(feats, w1, (1, 1), "SAME", dimension_numbers=dn))
            logp = jax.nn.log_softmax(jax.lax.conv_general_dilated(y, w2, (1, 1), "VALID", dimension_numbers=dn))
            return jax.lax.dynamic_slice(logp, (0, offset[0], offset[1], 0), (N, W, W, K))
        run = lambda: region(feats, offset)
    """, "discarded_rows"),
    "rows_first": ("""
        B, T, D, V = 8, 256, 128, 4096
        x = jax.random.normal(jax.random.key(0), (B, T, D))
        w = jax.random.normal(jax.random.key(1), (D, V)) / 11
        last = jax.random.randint(jax.random.key(2), (B,), 0, T)
        @jax.jit
        def score(x, w, last):
            x = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
            return jax.nn.log_softmax(x @ w, axis=-1)
        run = lambda: score(x, w, last)
    """, None),
    # the adapter merged inside the checkpointed cell (rebuilt every trip), then before the scan
    "remat_scan": (REMAT_SCAN.format(outside="pass", inside="rec = w + 0.5 * (a @ b)"), "loop_invariant_compute"),
    "remat_scan_merged": (REMAT_SCAN.format(outside="rec = w + 0.5 * (a @ b)", inside="pass"), None),
    "gates": ("""
        x = jax.random.normal(jax.random.key(0), (64, 256))
        w = jax.random.normal(jax.random.key(1), (256, 1024)) / 16
        @jax.jit
        def cell(x, w):  # an LSTM's gates: four slices of one matmul, each a quarter, all of it read
            i, f, g, o = jnp.split(x @ w, 4, axis=-1)
            return jax.nn.sigmoid(f) * jnp.tanh(g) + jax.nn.sigmoid(i) * jax.nn.sigmoid(o)
        run = lambda: cell(x, w)
    """, None),
    "host_preprocess": ("""
        images = np.random.default_rng(0).integers(0, 256, (64, 64, 64, 3), dtype=np.uint8)
        w = jax.random.normal(jax.random.key(0), (3, 16))
        @jax.jit
        def train(w, x):
            return w - 0.01 * jax.grad(lambda w: jnp.tanh(x.mean(axis=(1, 2)) @ w).mean())(w)
        def normalise(images):
            x = images.astype(np.float32) / 255.0
            x = (x - 0.45) / 0.22
            return np.ascontiguousarray(x[:, :, ::-1, :])
        run = lambda: train(w, normalise(images))
    """, "host_preprocessing"),
    "list_of_examples": ("""
        examples = [np.full((64,), i, np.int32) for i in range(64)]
        @jax.jit
        def train(tokens):
            return jnp.tanh(tokens.astype(jnp.float32) / 64).sum()
        run = lambda: train(jnp.stack([jnp.asarray(e) for e in examples]))
    """, "per_element_transfers"),
    "stacked_examples": ("""
        examples = [np.full((64,), i, np.int32) for i in range(64)]
        @jax.jit
        def train(tokens):
            return jnp.tanh(tokens.astype(jnp.float32) / 64).sum()
        run = lambda: train(np.stack(examples))
    """, None),
    "value_reads": ("""
        ws = [jax.random.normal(jax.random.key(i), (32, 32)) for i in range(48)]
        @jax.jit
        def norms(ws):
            return [jnp.linalg.norm(w) for w in ws]
        def run():
            return {f"layer{i}": float(v) for i, v in enumerate(norms(ws))}
    """, "per_element_transfers"),
    "loss_read": ("""
        import math
        rng = np.random.default_rng(0)
        state = {"w": jax.random.normal(jax.random.key(0), (768, 768)) / 28}
        x = jax.random.normal(jax.random.key(1), (768, 768))
        @jax.jit
        def train(w, x):
            loss, g = jax.value_and_grad(lambda w: jnp.tanh(jnp.tanh(x @ w) @ w).mean())(w)
            return w - 0.01 * g, loss
        def run():
            order = np.argsort(rng.random(400_000))  # the loader's shuffle, on the host
            state["w"], loss = train(state["w"], x)
            if not math.isfinite(float(loss)):
                raise FloatingPointError(order[0])
            return state["w"]
    """, "read_each_step"),
}
HOST_IDIOMS = {"host_preprocessing", "per_element_transfers", "read_each_step"}
@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("idioms"))


def test_every_idiom_names_its_pattern_and_a_gain():
    for key, idiom in IDIOMS.items():
        assert idiom.pattern in PATTERNS, key
        # a gain is measured on the chip (with where), or none is predicted
        assert (idiom.gain is None and not idiom.measured) or 0 < idiom.gain[0] <= idiom.gain[1] <= 1.5, key
        assert "{" not in idiom.why, f"{key}: its premise is quoted as it is, not formatted"
        assert not any("{" in a for a in idiom.alternatives), f"{key}: its alternatives are quoted as they are"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_idiom_is_recognised_where_the_program_has_it_and_only_there(name, captured):
    expected = PROGRAMS[name][1]
    found = {m.idiom for m in recognise(read_session_in_process([captured[name]]))}
    if expected is None:
        assert not found & ({"structured_matmul", "full_sort", "loop_invariant_weights", "discarded_rows",
                             "loop_invariant_compute", "transposed_outputs"} | HOST_IDIOMS), found
    else:
        assert expected in found, found
        if expected in HOST_IDIOMS:
            assert not found & HOST_IDIOMS - {expected}, found


def test_an_array_returned_again_in_other_layouts_names_its_outputs_and_lines(captured):
    [match] = [m for m in recognise(read_session_in_process([captured["layouts"]])) if m.idiom == "transposed_outputs"]
    assert match.params["shapes"] == "f32[8,256,16,64], f32[8,64,256,16]" and match.facts["reordered_outputs"] == 2
    assert "one f32 array of 2,097,152 elements" in match.what and match.function == "project"
    change = IDIOMS["transposed_outputs"].change_text(match)
    assert change.startswith("return the array once from project") and "layouts.py:" in match.params["outputs"]


def test_a_one_hot_matmul_is_named_with_its_shapes_and_its_line(captured):
    match = next(m for m in recognise(read_session_in_process([captured["onehot"]])) if m.idiom == "structured_matmul")
    assert match.params["kind"] == "one_hot" and match.params["values"] == 8192 and match.params["rows"] == 1024
    assert "f32[1024,8192]" in match.what and "f32[8192,128]" in match.what
    script = (captured["onehot"].parents[4] / "onehot.py").read_text().splitlines()
    line = next(n for n, text in enumerate(script, 1) if "jax.nn.one_hot(ids, V) @ table" in text)
    assert match.line.endswith(f"onehot.py:{line}"), match.line
    assert match.work_ratio == 8192


def _full_sort(path: Path) -> list:
    """The full_sort recogniser itself, on a CPU capture (the catalogue offers it on TPUs and GPUs only)."""
    return IDIOMS["full_sort"].recognise(Program(read_session_in_process([path])))


def test_a_sort_kept_to_its_top_k_names_k_and_n(captured):
    [match] = _full_sort(captured["sort"])
    assert (match.params["k"], match.params["n"]) == (8, 16384)
    assert IDIOMS["full_sort"].change_text(match).startswith("keep the top 8 at ")
    assert "full_sort" not in {m.idiom for m in recognise(read_session_in_process([captured["sort"]]))}


def test_a_quantile_is_no_top_k_and_top_k_itself_is_no_full_sort(captured):
    """jnp.percentile sorts all n values and reads one position deep inside: not 'the first k' (a user who took
    jax.lax.top_k(x, 1) for it got the maximum); and top_k, which XLA:CPU runs as a sort, is the change already."""
    [match] = _full_sort(captured["quantile"])
    change = IDIOMS["full_sort"].change_text(match)
    assert change.startswith("compute the percentile at ") and "m = ceil((1 - q)·262144) + 1" in change
    assert "first" not in match.what and match.work_ratio is None
    assert _full_sort(captured["top_k"]) == []


def test_the_report_leads_with_the_idioms_change_and_drops_what_it_explains(captured, tmp_path):
    analysis = analyze_session(locate_session(captured["onehot"]), tmp_path / "onehot")
    top = analysis.diagnosis.findings[0]
    assert top.key == "structured_matmul", [f.key for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, replace the one-hot matmul at ") and "table[ids]" in top.fix
    assert "Expected:" in top.fix
    assert analysis.diagnosis.status.value == "NEEDS_ATTENTION"
    assert any("the work its result needs" in r for r in analysis.health["unhealthy_because"])


def test_a_head_computed_over_every_position_then_cropped_names_the_share_kept_and_leads(captured, tmp_path):
    match = next(m for m in recognise(read_session_in_process([captured["crop_head"]])) if m.idiom == "discarded_rows")
    assert match.facts["kept_fraction"] == pytest.approx(144 / 2304) and match.work_ratio == 16
    assert match.needed_percent == pytest.approx(match.stake_percent / 16, abs=0.01)
    script = (captured["crop_head"].parents[4] / "crop_head.py").read_text().splitlines()
    lines = {n for n, text in enumerate(script, 1) if "conv_general_dilated" in text}
    assert int(match.line.rsplit(":", 1)[1]) in lines, match.line
    top = analyze_session(locate_session(captured["crop_head"]), tmp_path / "crop").diagnosis.findings[0]
    assert top.key == "discarded_rows" and top.fix.startswith("First, select the rows the result reads before")
    assert "1/16 of its rows" in top.fix


def test_a_value_a_rematerialised_scan_rebuilds_every_trip_is_named_with_its_trips_and_leads(captured, tmp_path):
    match = next(m for m in recognise(read_session_in_process([captured["remat_scan"]]))
                 if m.idiom == "loop_invariant_compute")
    assert match.params["trips"] == 32 and match.work_ratio == 32
    script = (captured["remat_scan"].parents[4] / "remat_scan.py").read_text().splitlines()
    line = next(n for n, text in enumerate(script, 1) if "rec = w + 0.5 * (a @ b)" in text)
    assert match.line.endswith(f"remat_scan.py:{line}"), match.line
    top = analyze_session(locate_session(captured["remat_scan"]), tmp_path / "scan").diagnosis.findings[0]
    assert top.key == "loop_invariant_compute" and top.fix.startswith("First, compute it once before the loop")
    assert "each of the 32 trips" in top.fix


@pytest.mark.parametrize("name", ["host_preprocess", "list_of_examples", "value_reads", "loss_read"])
def test_a_host_idioms_report_leads_with_its_change_at_the_users_line(name, captured, tmp_path):
    """How the host's Python feeds or reads the device: the report leads with the idiom's change, at the line of the
    script the Python tracer names."""
    analysis = analyze_session(locate_session(captured[name]), tmp_path / name)
    top = analysis.diagnosis.findings[0]
    assert top.key == PROGRAMS[name][1], [(f.key, f.fix[:120]) for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, ") and "Expected:" in top.fix
    script = (captured[name].parents[4] / f"{name}.py").read_text().splitlines()
    if name == "host_preprocess":
        line = next(n for n, text in enumerate(script, 1) if "def normalise" in text)
        assert f"{name}.py:{line}" in top.fix and "jax.device_put" in top.fix and "float32" in top.fix, top.fix
    elif name == "list_of_examples":
        line = next(n for n, text in enumerate(script, 1) if "jnp.asarray(e)" in text)
        assert f"{name}.py:{line}" in top.fix and "np.stack" in top.fix, top.fix
    elif name == "value_reads":
        line = next(n for n, text in enumerate(script, 1) if "float(v)" in text)
        assert f"{name}.py:{line}" in top.fix and "jax.device_get" in top.fix and "48 reads per step" in top.fix, \
            top.fix
    else:
        line = next(n for n, text in enumerate(script, 1) if "def run" in text)
        assert f"{name}.py:{line}" in top.fix and "every N steps" in top.fix, top.fix


REPO = Path(__file__).resolve().parents[1]


def test_every_measured_gain_cites_a_section_that_exists():
    """An idiom's `measured` names the row of docs/reference/measurements.md that holds its chip measurement."""
    page = (REPO / "docs" / "reference" / "measurements.md").read_text()
    for key, idiom in IDIOMS.items():
        if idiom.measured:
            path, _, anchor = idiom.measured.partition("#")
            assert path == "docs/reference/measurements.md" and f'<a id="{anchor}"></a>' in page, key


def test_a_finding_the_catalogue_recognises_has_no_second_lever():
    """Issue 71: the folded recognisers (arguments copied instead of donated, recomputation the memory does not need)
    are catalogue entries whose change is their lever; no lever of the bottleneck-class catalogue leads them too."""
    from xdiag.investigators import levers

    assert {"argument_copies", "needless_remat"} <= set(IDIOMS)
    assert not [lever.key for lever in levers.LEVERS if set(lever.findings) & set(IDIOMS)]


def test_arguments_copied_because_not_donated_are_an_idiom(tmp_path):
    """paged_decode_nnx on a TPU v5e after pages_per_compute_block=32: 12 KV caches that no output aliases are
    copied whole every step (47% of op time); donating them took 45.7% off the step."""
    import lzma

    pb = tmp_path / "paged_decode_nnx.ppcb32.xplane.pb"
    pb.write_bytes(lzma.decompress((REPO / "tests" / "profiles" / "fix_trials" / f"{pb.name}.xz").read_bytes()))
    [match] = [m for m in recognise(read_session_in_process([pb])) if m.idiom == "argument_copies"]
    assert match.facts["argument_count"] == 12 and match.facts["share_of_op_time_percent"] == pytest.approx(47, abs=1)
    assert 40 <= match.stake_percent <= 48, match.stake_percent
    change = IDIOMS["argument_copies"].change_text(match)
    assert change.startswith("donate the arguments of the jitted decode that hold k_cache_0_, ") and (
        "donate_argnums" in change), change


def test_recomputation_the_memory_does_not_need_is_an_idiom():
    """remat_train on a TPU v5e: 25.2% of op time recomputed under jax.checkpoint with the peak at 1.4 of 15.7 GiB."""
    path = REPO / "tests" / "profiles" / "tpu_v5e" / "remat_train.xplane.pb"
    [match] = [m for m in recognise(read_session_in_process([path])) if m.idiom == "needless_remat"]
    assert match.facts["rematerialised_op_percent"] == pytest.approx(25.2, abs=0.5)
    assert "1.415 of 15.7" in match.what and IDIOMS["needless_remat"].predicted_percent(match) == (12.3, 24.6)
