"""Steps, per-device timelines, busy/idle and stragglers on real profiles (issue 11 point 1, issue 12).

The shared accelerator profiles' numbers come from ../shared/profiles/EXPECTED.md (an expert reading of the raw
planes and XProf's views); the multi-device and multi-process sessions are captured here from the bundled
workloads (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from xdiag.analysis.steps import NO_REPEATING_STEP, repeating_period, step_set
from xdiag.cloud.embedded import analyze_session
from xdiag.profile.locate import locate_session
from xdiag.profile.session import read_session
from xdiag.tools import run_tool
from xdiag.examples.capture import capture_workload

from tests.conftest import shared_profile


def _tool(path, name):
    session = read_session(sorted(path.glob("*.xplane.pb")) if path.is_dir() else [path])
    result = run_tool(session, name)
    assert result.ok, result.reason
    return session, result


def _device(rows, suffix):
    return next(r for r in rows if r["device"].endswith(suffix))


# --- steps without step markers -------------------------------------------------------------------------------


def test_a_repeating_op_sequence_is_found_and_a_layer_inside_a_step_is_not_taken_for_it():
    layer = ["matmul", "add", "tanh"]
    step = ["embed"] + layer * 6 + ["loss", "update"]
    assert repeating_period(np.array(step * 5, dtype=object)) == (len(step), 1.0)
    # A capture that starts and stops inside a step still repeats.
    assert repeating_period(np.array((step * 4)[5:-3], dtype=object))[0] == len(step)
    rng = np.random.default_rng(0)
    assert repeating_period(rng.integers(0, 50, 400).astype(str).astype(object)) is None


def test_tpu_steps_run_from_one_execution_to_the_next_so_gaps_count_and_xprofs_idle_is_explained():
    _, result = _tool(shared_profile("tpu/tpu_v6e_inference.xplane.pb"), "get_step_trace")
    s = result.summary
    assert s["timelines"] == 4 and s["steps"] == 100  # each core its own timeline of 100 executions of jit_f
    assert "start to start" in s["step_source"]
    assert s["device_idle_percent"] < 1  # ~1 µs between executions: the steady state is not idle
    # XProf's duty cycle (86.5%) counts the ~5.5 s before the first execution; xdiag says so.
    assert s["window_busy_percent"] == pytest.approx(86.5, abs=1.5)
    assert s["largest_idle_gap_where"] == "before the first step"
    assert s["largest_idle_gap_ms"] == pytest.approx(5547, rel=0.02)
    assert "before the first step" in s["window_vs_step_note"]


def test_xprof_duty_cycle_is_reconciled_with_in_step_busy(private_copy):
    _, result = _tool(private_copy(shared_profile("tpu/tpu_v6e_inference.xplane.pb")), "get_xprof_overview")
    note = result.summary["duty_cycle_note"]
    assert "86.5%" in note and "100.0% inside the steps" in note and "before the first step" in note


def test_tpu_step_windows_are_each_cores_own():
    session = read_session([shared_profile("tpu/tpu_v6e_inference.xplane.pb")])
    steps = step_set(session).steps
    by_device = {}
    for step in steps:
        by_device.setdefault(step.device, []).append(step)
    assert len(by_device) == 4
    for device_steps in by_device.values():
        ends = np.array([s.end_ps for s in device_steps[:-1]])
        starts = np.array([s.start_ps for s in device_steps[1:]])
        assert (starts == ends).all()  # start to start: no gap falls between two steps


def test_v100_each_gpu_is_busy_in_its_own_step_window_and_the_memcpy_only_gpu_is_apart():
    _, result = _tool(shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb"), "get_step_trace")
    rows = result.detail["devices"]
    gpu4, gpu6 = _device(rows, "GPU:4"), _device(rows, "GPU:6")
    assert gpu4["compute_percent"] == pytest.approx(74.6, abs=1.5)
    assert gpu6["compute_percent"] == pytest.approx(69.8, abs=1.5)  # XProf: 21.3 ms step, compute 69.8%
    assert gpu6["step_ms_mean"] == pytest.approx(21.3, abs=0.2)
    assert [d.rsplit(" ", 1)[1] for d in result.summary["transfer_only_devices"]] == ["/device:GPU:1"]
    assert result.summary["active_devices"] == 2
    assert result.summary["least_busy_device"].endswith("GPU:6") and result.summary["device_busy_percent_min"] > 60
    session, util = _tool(shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb"), "get_utilization_viewer")
    assert util.summary["devices"] == 2 and util.summary["busy_percent_min"] > 60  # never "0% busy on GPU:6"
    step6 = next(s for s in step_set(session).steps if s.device.endswith("GPU:6"))
    step4 = next(s for s in step_set(session).steps if s.device.endswith("GPU:4"))
    assert (step6.start_ps - step4.start_ps) / 1e9 == pytest.approx(647, abs=10)  # GPU:6 runs ~650 ms later


def test_mi300x_attention_busy_is_measured_over_the_whole_window_including_host_gaps():
    _, result = _tool(shared_profile("gpu/mi300x_jax_attention.xplane.pb"), "get_step_trace")
    s = result.summary
    assert s["step_source"].startswith("repeating op sequence") and s["steps"] == 3
    assert s["compute_percent"] == pytest.approx(11.6, abs=1.0)  # not 34% inside cut-out steps
    assert s["device_idle_percent"] == pytest.approx(88, abs=1.5)
    assert s["steps"] * s["step_time_ms_mean"] == pytest.approx(32.6, abs=0.5)  # the steps cover the window


def test_the_repeated_unit_is_a_program_sequence_and_different_programs_are_no_repetition():
    session = read_session([shared_profile("gpu/mi300x_jax_conv_8gpu.xplane.pb")])
    sources = step_set(session).sources
    # GPU:0 also runs a varying number of input copies per call: its ops differ, its program launches repeat.
    assert "program launches" in next(v for k, v in sources.items() if k.endswith("GPU:0"))
    assert all("repeating" in v for v in sources.values())
    # The GEMM benchmark runs jit_dot compiled six times (one program per benchmark case): no step repeats.
    gemm = step_set(read_session([shared_profile("gpu/mi300x_jax_gemm.xplane.pb")]))
    assert gemm.source == NO_REPEATING_STEP


@pytest.mark.parametrize("profile, idle", [
    ("gpu/mi300x_jax_gemm.xplane.pb", 64), ("gpu/mi300x_jax_elementwise.xplane.pb", 62),
    ("gpu/mi300x_jax_conv_8gpu.xplane.pb", 97),
])
def test_mi300x_device_idle_matches_the_expert_reading(profile, idle):
    _, result = _tool(shared_profile(profile), "get_step_trace")
    assert result.summary["device_idle_percent"] == pytest.approx(idle, abs=3)


@pytest.fixture(scope="module")
def unmarked_input_bound(tmp_path_factory):
    """The input_bound workload captured without step annotations, as many real captures are."""
    return capture_workload("input_bound", tmp_path_factory.mktemp("unmarked"), steps=6, step_markers=False)


def test_without_step_markers_the_hosts_launches_of_the_program_are_the_steps(unmarked_input_bound, tmp_path):
    # XLA:CPU's threads may interleave the step's ops, so its op sequence repeats exactly on some runs and not on
    # others; where it does not, the host's launches of the program give the steps. Either way the steps are found.
    _, result = _tool(unmarked_input_bound, "get_step_trace")
    s = result.summary
    assert s["step_source"].startswith(("host launches", "repeating op sequence")) and 4 <= s["steps"] <= 6
    assert s["host_other_percent"] > 60
    analysis = analyze_session(locate_session(unmarked_input_bound), tmp_path / "out")
    assert analysis.diagnosis.findings[0].key == "input_bound"


# --- several devices, several hosts ----------------------------------------------------------------------------


def test_collective_bound_devices_read_as_collective_bound_each_on_its_own(cpu_profiles):
    _, result = _tool(cpu_profiles["collective_dominated"], "get_step_trace")
    assert result.summary["active_devices"] == 8
    assert result.summary["collective_percent"] > 50 and result.summary["compute_percent"] < 40
    # Each device, not just the mean: the psum inside the scan's while loop is waiting, not compute.
    assert min(r["collective_percent"] for r in result.detail["devices"]) > 40


def test_healthy_data_parallel_devices_compute(cpu_profiles):
    _, result = _tool(cpu_profiles["healthy_data_parallel"], "get_step_trace")
    assert result.summary["active_devices"] == 2
    assert result.summary["device_compute_percent_mean"] > 80 and result.summary["collective_percent"] < 10


@pytest.mark.parametrize("workload, cause", [("straggler_input", "host_other"), ("straggler_compute", "compute")])
def test_the_straggler_arrives_last_and_its_own_breakdown_says_why(workload, cause, cpu_profiles, tmp_path):
    session, result = _tool(cpu_profiles[workload], "get_hosts")
    s = result.summary
    hosts = result.detail["hosts"]
    slow = next(h for h in hosts if h["host"].endswith("process1"))
    fast = next(h for h in hosts if h["host"].endswith("process0"))
    assert s["participant_level"] == "hosts" and s["straggler"] == slow["host"]
    assert s["straggler_last_arrival_share_percent"] >= 80 and s["collective_instances"] >= 4
    assert s["arrival_skew_ms_mean"] > 10
    assert s["straggler_cause"] == cause
    # Lockstep: same step times; the fast host waits inside the all-reduce, the slow one hardly does.
    assert slow["step_time_ms_mean"] == pytest.approx(fast["step_time_ms_mean"], rel=0.1)
    assert fast["collective_wait_ms_per_step"] > 10
    assert slow["collective_wait_ms_per_step"] < fast["collective_wait_ms_per_step"] / 4
    assert fast["collective_percent"] > 40
    analysis = analyze_session(locate_session(cpu_profiles[workload]), tmp_path / "out")
    findings = analysis.diagnosis.findings
    assert findings[0].key == "straggler_host" and slow["host"] in findings[0].title
    assert "input_bound" not in {f.key for f in findings}  # the slow host's input is not everyone's


def test_a_capture_whose_flow_ids_repeat_later_breaks_down_as_the_capture_did(cpu_profiles, tmp_path):
    """XLA:CPU's async ops end at the `end:` event of their flow. Here every line of a real capture is repeated
    later in time, flow ids and all (bench/make_large_profile.py, as a long capture whose id counter restarted
    would): each op must end at its own flow's end, not at a later copy's seconds away, which read as a device
    busy 100% of every step."""
    from bench.make_large_profile import build

    source = cpu_profiles["dispatch_bound"]
    doubled = tmp_path / "doubled.xplane.pb"
    copies, _ = build(source, doubled, size_mib=2.5 * source.stat().st_size / 2**20)
    assert copies == 2
    _, once = _tool(source, "get_step_trace")
    _, twice = _tool(doubled, "get_step_trace")
    assert twice.summary["steps"] == 2 * once.summary["steps"]
    assert once.summary["compute_percent"] < 50 and once.summary["dispatch_percent"] > 20
    for key in ("compute_percent", "dispatch_percent", "device_busy_percent_mean"):
        assert twice.summary[key] == pytest.approx(once.summary[key], abs=1.0)


def test_union_of_merged_intervals_covers_what_the_union_of_all_intervals_does(h200_profiles):
    """The breakdown adds each layer to the union of the layers before it already merged (union_with) instead of
    merging every interval again, and merges host events line by line (HostThreads.union): the same coverage per
    window, on a real profile's ops and host events; and merge_intervals answers the same whether its input comes
    sorted or not."""
    from xdiag.analysis.host_threads import host_threads
    from xdiag.analysis.host_vocabulary import DISPATCH_EVENT
    from xdiag.analysis.intervals import covered, covered_by_merged, merge_intervals, union_with
    from xdiag.analysis.op_table import op_table

    session = read_session([h200_profiles["dispatch_bound"]])
    ops = op_table(session)
    events = host_threads(session)[0]
    line_by_line = events.union(DISPATCH_EVENT)  # merged per line, then together: nothing selected before it
    dispatch = events.select(DISPATCH_EVENT)
    for a, b in zip(line_by_line, merge_intervals(dispatch.start_ps, dispatch.end_ps)):
        assert np.array_equal(a, b)
    assert len(ops) > 1000 and len(dispatch.start_ps) > 100
    lo, hi = int(min(ops.start_ps.min(), dispatch.start_ps.min())), int(max(ops.end_ps.max(), dispatch.end_ps.max()))
    edges = np.linspace(lo, hi, 41).astype(np.int64)
    win_s, win_e = edges[:-1], edges[1:]
    everything = covered(np.concatenate([ops.start_ps, dispatch.start_ps]), np.concatenate([ops.end_ps, dispatch.end_ps]),
                         win_s, win_e)
    layered = covered_by_merged(union_with(merge_intervals(ops.start_ps, ops.end_ps), dispatch.start_ps, dispatch.end_ps),
                                win_s, win_e)
    assert np.array_equal(everything, layered) and everything.sum() > 0
    shuffled = np.random.default_rng(0).permutation(len(ops))
    for a, b in zip(merge_intervals(ops.start_ps, ops.end_ps), merge_intervals(ops.start_ps[shuffled], ops.end_ps[shuffled])):
        assert np.array_equal(a, b)


def _merged_one_at_a_time(starts, ends) -> tuple[list[int], list[int]]:
    """The reference union: intervals in order of start, each joining the one before where it starts at or before
    that one's end (merge_intervals' rule, its ends held at 0 or more)."""
    out_s, out_e = [], []
    for s, e in sorted(zip(starts.tolist(), ends.tolist()), key=lambda pair: pair[0]):
        if out_s and s <= running:
            running = max(running, e)
            out_e[-1] = max(running, 0)
        else:
            running = e
            out_s.append(s)
            out_e.append(max(e, 0))
    return out_s, out_e


def _intervals(case: str, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`size` intervals in order of start: apart, touching, nested, before 0 or ending before they start (by `case`;
    any other case: apart or touching at random)."""
    starts = np.cumsum(rng.integers(5, 50, size)).astype(np.int64)
    ends = starts + {"apart": 3, "touching": 5}.get(case, 0) + rng.integers(0, 4, size) * (case != "touching")
    if case == "nested":
        ends = starts + rng.integers(0, 400, size)
    elif case == "negative":
        starts, ends = starts - 5_000, starts - 5_000 + 2
    elif case == "backwards":
        ends = starts + rng.integers(-8, 8, size)
    return starts, ends


@pytest.mark.parametrize("case", ["apart", "touching", "nested", "negative", "unsorted", "empty"])
def test_merge_and_union_shortcuts_answer_as_merging_everything_again(case):
    """merge_intervals where no interval reaches the next (a TPU line's ops, one after another) and union_with of
    nothing new (most layers on most profiles) skip the work: the same union as merging one interval at a time,
    never the caller's arrays, and a union that is not merge_intervals' own answer is merged again."""
    from xdiag.analysis.intervals import merge_intervals, union_with

    rng = np.random.default_rng(len(case))
    starts, ends = _intervals(case, rng, 200)
    if case == "unsorted":
        order = rng.permutation(200)
        starts, ends = starts[order], ends[order]
    elif case == "empty":
        starts, ends = starts[:0], ends[:0]
    given = starts.copy(), ends.copy()
    merged = merge_intervals(starts, ends)
    assert [m.tolist() for m in merged] == list(_merged_one_at_a_time(starts, ends)), case
    assert merged[0] is not starts and merged[1] is not ends
    assert np.array_equal(starts, given[0]) and np.array_equal(ends, given[1])
    nothing = np.empty(0, np.int64)
    for union in (merged, (starts, ends)):  # merge_intervals' answer, and intervals as given (maybe not merged)
        again = union_with(union, nothing, nothing)
        assert [a.tolist() for a in again] == list(_merged_one_at_a_time(*union)), case


def test_kernels_run_inside_a_cuda_graph_keep_their_own_names(h200_profiles):
    """Kernels replayed from a CUDA graph carry the command buffer's name as hlo_op (all 720 on the H200 healthy
    profile's stream): the op table names them by the kernel, as XProf's kernel stats do, and the library's GEMM
    kernels by the custom call that launched them (test_cost_model checks their FLOPs)."""
    from xdiag.analysis.op_table import _KERNEL_SUFFIX, op_table

    session = read_session([h200_profiles["healthy"]])
    plane, stream = next(
        (plane, line) for plane in session.planes if plane.is_device for line in plane.lines if "hlo_op" in line.strings
    )
    hlo_ops = [plane.strings[i] for i in stream.strings["hlo_op"].tolist() if i >= 0]
    assert len(hlo_ops) == len(stream) == 720 and all(name.startswith("command_buffer") for name in hlo_ops)
    names = set(op_table(session).name.tolist())
    assert not any(str(name).startswith("command_buffer") for name in names)
    # each kernel is there by its name, or by its HLO instruction's where the kernel writes '.N' as '_N'; cuBLAS's
    # by its custom call's
    kernels = set(plane.names_of(stream))
    library = {k for k in kernels if k.endswith("_cublas")}
    assert library and all(k in names or _KERNEL_SUFFIX.sub(r".\1", k) in names for k in kernels - library)
    assert not names & library and {f"custom-call.{n}" for n in range(14)} <= names


@pytest.mark.parametrize("case", ["apart", "touching", "nested", "negative", "backwards", "empty_base", "no_layers"])
def test_coverage_of_unions_with_layers_is_the_coverage_of_the_unions_built(case):
    """covered_by_unions (a device's ops, then its collectives, loops and copies joined to them one layer at a time)
    answers what merging each union and covering the windows with it answers, without building the unions: on
    intervals apart, touching, nested, before 0, ending before they start, and windows that overlap, nest or run
    backwards."""
    from xdiag.analysis.intervals import covered_by_merged, covered_by_unions, merge_intervals, union_with

    rng = np.random.default_rng(len(case))
    starts, ends = _intervals(case, rng, 300)
    layers = [(s, s + rng.integers(-8 if case == "backwards" else 0, 60, len(s))) for s in
              (np.sort(rng.integers(-100, 8_000, k)) for k in (0, 7, 40, 0))]
    if case == "no_layers":
        layers = [(starts[:0], ends[:0])] * 3
    base = merge_intervals(starts[:0], ends[:0]) if case == "empty_base" else merge_intervals(starts, ends)
    win_s = np.sort(rng.integers(-6_000, 9_000, 60))
    win_e = win_s + rng.integers(-50, 3_000, 60)
    built, expected = base, [covered_by_merged(base, win_s, win_e)]
    for layer in layers:
        built = union_with(built, *layer)
        expected.append(covered_by_merged(built, win_s, win_e))
    got = covered_by_unions(base, layers, win_s, win_e)
    assert [g.tolist() for g in got] == [e.tolist() for e in expected], case
    assert any(e.any() for e in expected)


@pytest.mark.parametrize("in_order", [True, False])
def test_each_op_is_named_by_the_module_span_it_starts_in(in_order):
    """A TPU op's module is the 'XLA Modules' span it starts in (the last to start at or before it), "" before the
    first and past a span's end: the same whether a line's ops come in time order (each span's run of rows found by
    a search per span) or not."""
    from xdiag.analysis.op_table import _modules_at

    rng = np.random.default_rng(int(in_order))
    for _ in range(300):
        span_starts = np.sort(rng.integers(0, 100, int(rng.integers(1, 6)))).astype(np.int64)
        span_ends = span_starts + rng.integers(-5, 40, len(span_starts))
        span_names = np.array([f"jit_{int(k)}" for k in rng.integers(0, 3, len(span_starts))], dtype=object)
        starts = np.sort(rng.integers(-10, 150, int(rng.integers(2, 40)))).astype(np.int64)
        if not in_order:
            starts = rng.permutation(starts)
        expected = []
        for t in starts.tolist():
            at = [j for j, s in enumerate(span_starts.tolist()) if s <= t]
            expected.append(span_names[at[-1]] if at and t < span_ends[at[-1]] else "")
        modules = _modules_at((span_starts, span_ends, span_names), starts)
        assert [modules.values[c] for c in modules.codes.tolist()] == expected
