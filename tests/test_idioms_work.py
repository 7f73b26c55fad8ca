"""Idioms of work the result does not need, on JAX programs captured here on the CPU with each idiom and with the
change its finding offers: a product chain multiplied in the costly order, a full product read for its diagonal,
pairwise distances built by broadcasting, a loss computed apart from its gradient, a softmax read only by argmax."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.idioms import IDIOMS, recognise
from xdiag.idioms.program import Program
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process

from tests.idiom_capture import capture_programs

CATALOGUE = """
    def dense(key, sizes):
        keys = jax.random.split(key, len(sizes) - 1)
        return [jax.random.normal(k, (a, b)) / a ** 0.5 for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
    def tower(layers, x):
        for w in layers:
            x = jax.nn.relu(x @ w)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    user_params, item_params = dense(jax.random.key(0), [32, 256, 32]), dense(jax.random.key(1), [64, 256, 256, 32])
    user_x = jax.random.normal(jax.random.key(2), ({requests}, 32))
    item_x = jax.random.normal(jax.random.key(3), ({items}, 64))
"""


def catalogue(step: str, items: int = 8192, requests: int = 16) -> str:
    """A two-tower retrieval program: `requests` requests scored against a catalogue of `items` items by `step`."""
    return textwrap.dedent(CATALOGUE.format(items=items, requests=requests)) + textwrap.dedent(step)


RETRIEVE = """
    @jax.jit
    def retrieve(user_params, item_params, user_x, item_x):
        users = tower(user_params, user_x)
        items = tower(item_params, item_x)
        return jax.lax.top_k(users @ items.T, 10)
    run = lambda: retrieve(user_params, item_params, user_x, item_x)
    """
"""The request step as a recommender writes it: both towers inside the jitted function."""


PROGRAMS = {
    # name -> (the program's body, the idiom it holds or None, the text of the line(s) its change is at)
    "chain_order": ("""
        A = jax.random.normal(jax.random.key(0), (1024, 1024)) / 32
        B = jax.random.normal(jax.random.key(1), (1024, 1024)) / 32
        v = jax.random.normal(jax.random.key(2), (1024, 4))
        @jax.jit
        def apply(A, B, v):
            return jnp.tanh((A @ B) @ v)
        run = lambda: apply(A, B, v)
    """, "matmul_chain_order", ("(A @ B) @ v",)),
    "chain_reordered": ("""
        A = jax.random.normal(jax.random.key(0), (1024, 1024)) / 32
        B = jax.random.normal(jax.random.key(1), (1024, 1024)) / 32
        v = jax.random.normal(jax.random.key(2), (1024, 4))
        @jax.jit
        def apply(A, B, v):
            return jnp.tanh(A @ (B @ v))
        run = lambda: apply(A, B, v)
    """, None, ()),
    "diagonal": ("""
        A = jax.random.normal(jax.random.key(0), (1024, 512))
        B = jax.random.normal(jax.random.key(1), (512, 1024))
        @jax.jit
        def scores(A, B):
            d = jnp.diag(A @ B)
            return d, jnp.trace(B.T @ A.T)
        run = lambda: scores(A, B)
    """, "diagonal_of_product", ("jnp.diag(A @ B)", "jnp.trace(B.T @ A.T)")),
    "diagonal_einsum": ("""
        A = jax.random.normal(jax.random.key(0), (1024, 512))
        B = jax.random.normal(jax.random.key(1), (512, 1024))
        @jax.jit
        def scores(A, B):
            d = jnp.einsum('ij,ji->i', A, B)
            return d, jnp.einsum('ij,ji->', B.T, A.T)
        run = lambda: scores(A, B)
    """, None, ()),
    "pairwise": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 64))
        y = jax.random.normal(jax.random.key(1), (512, 64))
        @jax.jit
        def nearest(x, y):
            d = jnp.sqrt(jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, axis=-1))
            return d.min(axis=1)
        run = lambda: nearest(x, y)
    """, "pairwise_broadcast_reduce", ("(x[:, None, :] - y[None, :, :]) ** 2",)),
    "pairwise_matmul": ("""
        x = jax.random.normal(jax.random.key(0), (1024, 64))
        y = jax.random.normal(jax.random.key(1), (512, 64))
        @jax.jit
        def nearest(x, y):
            d2 = (x ** 2).sum(-1)[:, None] + (y ** 2).sum(-1)[None, :] - 2 * x @ y.T
            return jnp.sqrt(jnp.maximum(d2, 0)).min(axis=1)
        run = lambda: nearest(x, y)
    """, None, ()),
    "loss_then_grad": ("""
        w1 = jax.random.normal(jax.random.key(0), (512, 512)) / 22
        w2 = jax.random.normal(jax.random.key(1), (512, 512)) / 22
        x = jax.random.normal(jax.random.key(2), (512, 512))
        def loss(p, x):
            return jnp.mean(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]) ** 2)
        loss_fn, grad_fn = jax.jit(loss), jax.jit(jax.grad(loss))
        def run():
            p = (w1, w2)
            value = loss_fn(p, x)
            grads = grad_fn(p, x)
            return value, grads
    """, "forward_computed_twice", ("value = loss_fn(p, x)",)),
    "value_and_grad": ("""
        w1 = jax.random.normal(jax.random.key(0), (512, 512)) / 22
        w2 = jax.random.normal(jax.random.key(1), (512, 512)) / 22
        x = jax.random.normal(jax.random.key(2), (512, 512))
        def loss(p, x):
            return jnp.mean(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]) ** 2)
        step = jax.jit(jax.value_and_grad(loss))
        run = lambda: step((w1, w2), x)
    """, None, ()),
    "softmax_argmax": ("""
        logits = jax.random.normal(jax.random.key(0), (128, 32768))
        @jax.jit
        def predict(logits):
            probs = jax.nn.softmax(logits, axis=-1)
            return jnp.argmax(probs, axis=-1), probs.max(axis=-1)
        run = lambda: predict(logits)
    """, "softmax_for_argmax", ("jnp.argmax(probs, axis=-1)",)),
    "logits_argmax": ("""
        logits = jax.random.normal(jax.random.key(0), (128, 32768))
        @jax.jit
        def predict(logits):
            return jnp.argmax(logits, axis=-1), jnp.exp(logits.max(-1) - jax.nn.logsumexp(logits, axis=-1))
        run = lambda: predict(logits)
    """, None, ()),
    "catalogue_tower": (catalogue(RETRIEVE), "call_invariant_compute", ("items = tower(item_params, item_x)",)),
    "catalogue_embedded_once": (catalogue("""
        @jax.jit
        def retrieve(user_params, user_x, item_emb):
            return jax.lax.top_k(tower(user_params, user_x) @ item_emb.T, 10)
        item_emb = jax.jit(tower)(item_params, item_x)
        run = lambda: retrieve(user_params, user_x, item_emb)
    """), None, ()),
    "catalogue_trained": (catalogue("""
        @jax.jit
        def step(user_params, item_params, user_x, item_x):
            users = tower(user_params, user_x)
            items = tower(item_params, item_x)
            loss, grads = jax.value_and_grad(lambda p: jnp.sum(users @ tower(p, item_x).T))(item_params)
            return jax.lax.top_k(users @ items.T, 10), jax.tree.map(lambda w, g: w - 1e-3 * g, item_params, grads)
        run = lambda: step(user_params, item_params, user_x, item_x)
    """), None, ()),
    "catalogue_small": (catalogue(RETRIEVE, items=16, requests=4096), None, ()),
}
WORK_IDIOMS = {"matmul_chain_order", "diagonal_of_product", "pairwise_broadcast_reduce", "forward_computed_twice",
               "softmax_for_argmax", "call_invariant_compute"}
WITH_IDIOM = sorted(name for name, (_, expected, _) in PROGRAMS.items() if expected)
TRIAL_PROGRAMS = Path(__file__).resolve().parents[1] / "bench" / "fix_trials" / "programs"
TRIALS = {"two_hop_propagate": "matmul_chain_order", "mahalanobis_diag": "diagonal_of_product",
          "kmeans_broadcast": "pairwise_broadcast_reduce", "loss_then_grad": "forward_computed_twice",
          "softmax_argmax": "softmax_for_argmax"}
"""The chip trial programs of these idioms (bench/fix_trials/programs/), each run here at its CPU size."""
TRIAL = """
    import importlib
    sys.path.insert(0, {folder!r})
    step, carry, _ = importlib.import_module({program!r}).build({variant!r})
    state = [carry]
    def run():
        state[0] = step(state[0])
        return state[0]
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Path]:
    """Each program above captured once on this CPU (tests/idiom_capture.py)."""
    return capture_programs({name: body for name, (body, _, _) in PROGRAMS.items()}, tmp_path_factory.mktemp("work"))


def _matches(captured, name: str) -> list:
    return sorted((m for m in recognise(read_session_in_process([captured[name]])) if m.idiom == PROGRAMS[name][1]),
                  key=lambda m: m.line)


def _match(captured, name: str):
    [match] = _matches(captured, name)
    return match


def _lines_of(captured, name: str) -> list[str]:
    """`<name>.py:N` for each line of the program's script that holds a text its change is at, in order."""
    script = (captured[name].parents[4] / f"{name}.py").read_text().splitlines()
    return [f"{name}.py:{next(n for n, text in enumerate(script, 1) if part in text)}" for part in PROGRAMS[name][2]]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_idiom_is_recognised_in_its_program_and_not_once_changed(name, captured):
    found = {m.idiom for m in recognise(read_session_in_process([captured[name]]))} & WORK_IDIOMS
    expected = PROGRAMS[name][1]
    assert found == ({expected} if expected else set()), found


@pytest.mark.parametrize("name", WITH_IDIOM)
def test_the_report_leads_with_the_idioms_change_at_the_users_line(name, captured, tmp_path):
    analysis = analyze_session(locate_session(captured[name]), tmp_path / name)
    top = analysis.diagnosis.findings[0]
    assert top.key == PROGRAMS[name][1], [(f.key, f.fix[:120]) for f in analysis.diagnosis.findings]
    assert top.fix.startswith("First, ") and "Expected:" in top.fix, top.fix
    change = top.fix.split(" Expected:")[0]
    assert any(line in change for line in _lines_of(captured, name)), top.fix
    assert analysis.diagnosis.status.value == "NEEDS_ATTENTION"


def test_a_chain_multiplied_in_the_costly_order_counts_both_orders(captured, tmp_path):
    match = _match(captured, "chain_order")
    # (A @ B) @ v: 2·1024³ + 2·1024²·4 FLOPs; A @ (B @ v): 2·(1024²·4) twice
    assert match.facts["flops_per_run"] == 2 * 1024 ** 3 + 2 * 1024 ** 2 * 4
    assert match.facts["flops_reordered_per_run"] == 4 * 1024 ** 2 * 4
    assert match.work_ratio == pytest.approx(128.5, abs=0.1)
    change = IDIOMS["matmul_chain_order"].change_text(match)
    assert "A @ (B @ v)" in change and "jnp.linalg.multi_dot([A, B, v])" in change and "f32[1024,4]" in change
    health = analyze_session(locate_session(captured["chain_order"]), tmp_path / "chain").health
    assert any("the work its result needs" in reason for reason in health["unhealthy_because"]), health


def test_a_product_read_for_its_diagonal_or_its_trace_is_named_at_each_line(captured):
    diagonal, trace = _matches(captured, "diagonal")  # jnp.diag(A @ B) reads a gather; jnp.trace an identity mask
    found = {m.idiom for m in recognise(read_session_in_process([captured["diagonal"]]))}
    assert "discarded_rows" not in found, found  # a diagonal reads one element of every row: no row is left out
    diagonal_line, trace_line = _lines_of(captured, "diagonal")
    assert diagonal.line.endswith(diagonal_line) and trace.line.endswith(trace_line), (diagonal.line, trace.line)
    assert "(gather)" in diagonal.what and "(select)" in trace.what
    for match in (diagonal, trace):
        assert match.work_ratio == 1024 and match.facts["diagonal_elements"] == 1024 and "f32[1024,1024]" in match.what
    assert "jnp.einsum('ij,ji->i', A, B)" in IDIOMS["diagonal_of_product"].change_text(diagonal)


def test_pairwise_distances_count_the_broadcast_against_the_matmul_form(captured):
    match = _match(captured, "pairwise")
    assert match.facts["kind"] == "squared distance"
    assert match.facts["broadcast_elements"] == 1024 * 512 * 64
    assert match.facts["matmul_elements"] == 1024 * 64 + 512 * 64 + 1024 * 512
    assert match.work_ratio == pytest.approx(1024 * 512 * 64 / (1024 * 64 + 512 * 64 + 1024 * 512), abs=0.1)
    assert "x @ y.T" in IDIOMS["pairwise_broadcast_reduce"].change_text(match)


def test_a_loss_computed_apart_from_its_gradient_names_both_calls(captured):
    match = _match(captured, "loss_then_grad")
    script = (captured["loss_then_grad"].parents[4] / "loss_then_grad.py").read_text().splitlines()
    grad_line = next(n for n, text in enumerate(script, 1) if "grads = grad_fn(p, x)" in text)
    assert match.line.endswith(_lines_of(captured, "loss_then_grad")[0]), match.line
    assert match.params["gradient_line"].endswith(f"loss_then_grad.py:{grad_line}") and match.function == "loss"
    assert match.facts["forward_matmuls"] == 2 and match.needed_percent == 0.0
    # the two forward matmuls again, over the gradient's two forward and three backward ones (none for x)
    assert match.facts["forward_flops_per_call"] == 2 * (2 * 512 ** 3)
    assert match.facts["gradient_flops_per_call"] == 5 * (2 * 512 ** 3) and match.work_ratio == 1.4
    assert "jax.value_and_grad(loss)" in IDIOMS["forward_computed_twice"].change_text(match)


def test_a_softmax_read_only_by_argmax_names_both_reads(captured):
    match = _match(captured, "softmax_argmax")
    assert match.facts["reads"] == ["argmax"] and match.facts["array_passes"] >= 3
    script = (captured["softmax_argmax"].parents[4] / "softmax_argmax.py").read_text().splitlines()
    softmax_line = next(n for n, text in enumerate(script, 1) if "jax.nn.softmax" in text)
    assert match.facts["softmax_line"].endswith(f"softmax_argmax.py:{softmax_line}")
    change = IDIOMS["softmax_for_argmax"].change_text(match)
    assert "jnp.argmax(logits, axis=1)" in change and "jax.nn.logsumexp" in change  # the max is read too


@pytest.fixture(scope="module")
def trials(tmp_path_factory) -> dict[str, Path]:
    """'<program>.<variant>' -> the capture of each trial program's before and fixed variants on this CPU."""
    return capture_programs({f"{program}.{variant}": TRIAL.format(folder=str(TRIAL_PROGRAMS), program=program,
                                                                  variant=variant)
                             for program in TRIALS for variant in ("before", "fixed")},
                            tmp_path_factory.mktemp("work_trials"))


@pytest.mark.parametrize("program", sorted(TRIALS))
def test_each_trial_program_holds_its_idiom_before_its_change_and_not_after(program, trials):
    before = [m for m in recognise(read_session_in_process([trials[f"{program}.before"]])) if m.idiom in WORK_IDIOMS]
    assert [m.idiom for m in before] == [TRIALS[program]], before
    source = (TRIAL_PROGRAMS / f"{program}.py").read_text().splitlines()
    line = int(before[0].line.rsplit(":", 1)[1])
    assert "# as written" in source[line - 1], (before[0].line, source[line - 1])  # the line the change edits
    after = {m.idiom for m in recognise(read_session_in_process([trials[f"{program}.fixed"]]))}
    assert not after & WORK_IDIOMS, after


def test_a_part_from_unchanged_arguments_is_left_alone_where_small_or_updated(captured, monkeypatch):
    """A catalogue of 16 items against 4,096 requests: its tower is a small share of the step and is found only
    where the threshold is lifted. A training step that returns new item weights recomputes the catalogue from
    arguments it updates: no part of it is the same on the next call."""
    import xdiag.idioms.work_not_needed as work

    small = Program(read_session_in_process([captured["catalogue_small"]]))
    assert not work.call_invariant_compute(small)
    monkeypatch.setattr(work, "CALL_INVARIANT_MIN_STAKE_PERCENT", 0.0)
    (found,) = work.call_invariant_compute(small)
    assert found.facts["arguments"] == ["item_params", "item_x"] and found.stake_percent < 10
    assert not work.call_invariant_compute(Program(read_session_in_process([captured["catalogue_trained"]])))
