"""Numbers that hold (issue 61, item 4), on the real committed profiles: every figure a report gives is checked
against an independent measurement, a hand count from the example program's source or a count the profile makes
itself by another route."""

from __future__ import annotations

import collections
import functools
from pathlib import Path

import pytest
from xdiag.analysis.op_stats import op_stats
from xdiag.profile.reader import read_session_in_process
from xdiag.tools import run_tool

TPU = Path(__file__).resolve().parent / "profiles" / "tpu_v5e"
H200 = Path(__file__).resolve().parent / "profiles" / "h200"
COMMITTED = sorted([*TPU.glob("*.xplane.pb"), *H200.glob("*.xplane.pb")])


@functools.lru_cache(maxsize=4)
def _session(path: Path):
    return read_session_in_process([path])


def _loops(session) -> list[tuple[str, str, int]]:
    return [(m.name, i.name, i.trip_count) for m in session.hlo_modules for c in m.computations.values()
            for i in c.instructions if i.opcode == "while"]


# Hand counts, from each program's source (shared/xdiag/examples/<name>.py, TPU sizes of `pick`): every while loop
# of the traced program, with how many times it runs its body.
HAND_TRIP_COUNTS = {
    "lstm_scan": [4096],  # lax.scan over xs of (8, 256, 4096)'s 4,096 time steps
    "lstm_batch64": [512],  # lax.scan over 512 time steps
    "gru_scan_train": [1024] * 4,  # LAYERS = 2 scans of 1,024 steps, forward and backward (transpose)
    "kv_decode": [32],  # fori_loop(0, NEW_TOKENS = 32)
    "kv_decode_b64": [32],  # kv_decode's loop at batch 64
    "decode_prefetched": [32],  # kv_decode's loop, a smaller model
    "int8_weight_decode": [32],  # fori_loop(0, TOKENS = 32)
    "decode_streamed": [16, 24],  # fori_loop(0, NEW_TOKENS = 16) around a lax.scan over 24 layers
    "decode_streamed_b64": [16, 24],  # the same at batch 64
    "running_sum": [],  # cumsum: a reduce-window, no loop
    "remat_train": [],  # an MLP under jax.checkpoint: no loop
}


@pytest.mark.parametrize("workload", sorted(HAND_TRIP_COUNTS))
def test_trip_counts_are_those_of_the_programs_source(workload):
    """The trip count xdiag reads from each loop (its bound, start and step in the HLO) is the hand count."""
    session = _session(TPU / f"{workload}.xplane.pb")
    assert sorted(trips for _, _, trips in _loops(session)) == sorted(HAND_TRIP_COUNTS[workload])


def _profiles_with_loops() -> list[Path]:
    return [p for p in COMMITTED if b"while" in p.read_bytes()]


@pytest.mark.parametrize("path", _profiles_with_loops(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_trip_count_disagrees_with_the_loop(path):
    """Every committed profile with while loops: each loop's trip count is what the profile counts, its body's ops'
    executions over the loop's own; and the op profile's loop_trips_per_run is that whole number, never a ratio of
    op counts (256 was given for a GRU's 1,024 steps, 22.6 and 0.9 for a 24-layer scan)."""
    session = _session(path)
    loops = _loops(session)
    if not loops:
        pytest.skip("no while loop in its HLO")
    stats = {(s.module, s.name): s.count for s in op_stats(session)}
    for module in session.hlo_modules:
        body_counts = collections.defaultdict(set)
        for computation, loop in module.enclosing_loop.items():
            for instruction in module.computations[computation].instructions:
                if (module.name, instruction.name) in stats and instruction.opcode != "while":
                    body_counts[loop.name].add(stats[(module.name, instruction.name)])
        for computation in module.computations.values():
            for loop in (i for i in computation.instructions if i.opcode == "while"):
                runs = stats.get((module.name, loop.name))
                if not runs or not body_counts[loop.name]:
                    continue  # not run in the capture, or its body's ops are not timed
                assert body_counts[loop.name] == {runs * loop.trip_count}, (module.name, loop.name, loop.trip_count)
    summary = run_tool(session, "get_hlo_op_profile").summary
    trips = summary.get("loop_trips_per_run")
    if trips is not None:
        assert isinstance(trips, int) and trips >= 1
        loop = summary["loop_of_busiest_op"]
        assert trips in {t for _, name, t in loops if name == loop}


def test_recomputation_is_the_recomputed_ops_only():
    """remat_train (shared/xdiag/examples/remat_train.py): 8 blocks of tanh(tanh(h @ w) @ w.T), each under
    jax.checkpoint with nothing saved. By hand: a block runs 2 products forward, re-runs both in the backward pass
    (the tanh derivatives need their outputs) and 4 to differentiate them (two per product: into h and into w),
    so 16 of the step's 64 products, all 8192x4096x4096, recompute: 25% of the matmul time. The backward products
    that only fuse a recomputed `1 - tanh²` beside them are not recomputation (37.6% counted them)."""
    session = _session(TPU / "remat_train.xplane.pb")
    summary = run_tool(session, "get_hlo_op_profile").summary
    assert summary["rematerialised_op_count"] == 16
    matmul = summary["category_percent"]["matmul"]
    assert summary["rematerialised_op_percent"] == pytest.approx(matmul * 16 / 64, abs=1.5)
