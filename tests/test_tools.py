"""Each tool on real profiles, including its 'not available' answers."""

from __future__ import annotations

import pytest
from xdiag.analysis.breakdown import CATEGORIES
from xdiag.model import ToolStatus
from xdiag.profile.session import read_session
from xdiag.tools import BROAD_TOOLS, REGISTRY, run_tool
from xdiag.tools.common import xprof_source

from tests.conftest import shared_profile


@pytest.fixture(scope="module")
def healthy_cpu(cpu_profiles):
    return read_session([cpu_profiles["healthy"]])


def test_registry_has_the_broad_tools_and_the_follow_ups():
    # The managed service's 15, plus the line view (issue 63: the report's lines, xdiag diff's), kernel statistics and
    # custom kernels (issue 13: every report shows them), and the program's anatomy the investigators choose their
    # levers against (issue 61).
    assert len(BROAD_TOOLS) == 19 and set(BROAD_TOOLS) <= set(REGISTRY)
    assert BROAD_TOOLS[-3:] == ("get_kernel_stats", "get_custom_kernels", "get_program_anatomy")
    for name in ("get_hlo_neighborhood", "aggregate_xplane_events", "get_kernel_stats", "llo_load", "llo_query"):
        assert name in REGISTRY


def test_every_broad_tool_answers_on_a_cpu_profile(healthy_cpu):
    for name in BROAD_TOOLS:
        result = run_tool(healthy_cpu, name)
        assert result.status in (ToolStatus.OK, ToolStatus.NOT_AVAILABLE), (name, result.reason)
        if result.status == ToolStatus.NOT_AVAILABLE:
            assert result.reason and not result.summary


def test_step_trace_on_cpu_matches_the_annotations(healthy_cpu):
    summary = run_tool(healthy_cpu, "get_step_trace").summary
    assert summary["steps"] == 15 and summary["step_source"] == "step annotations"
    parts = sum(summary[f"{c}_percent"] for c in CATEGORIES)
    assert parts == pytest.approx(100, abs=0.5)  # the categories partition the step time
    assert summary["compute_percent"] > 80


def test_op_profile_joins_hlo_shapes_and_costs(healthy_cpu):
    result = run_tool(healthy_cpu, "get_hlo_op_profile", {"top_n": 5})
    assert len(result.detail["ops"]) == 5
    matmul = [o for o in result.detail["ops"] if o["category"] == "matmul"]
    assert matmul and matmul[0]["flops_per_run"] > 0 and matmul[0]["arithmetic_intensity_flops_per_byte"] > 1


@pytest.mark.parametrize("tool", ["get_roofline_model", "get_smart_suggestions", "get_kernel_stats", "llo_load"])
def test_device_only_tools_say_why_on_cpu(healthy_cpu, tool):
    result = run_tool(healthy_cpu, tool)
    assert result.status == ToolStatus.NOT_AVAILABLE
    assert "CPU" in result.reason


def test_kernel_stats_on_h200_name_real_kernels(h200_profiles):
    session = read_session([h200_profiles["healthy"]])
    result = run_tool(session, "get_kernel_stats")
    assert result.ok
    assert any("gemm" in k["kernel"] for k in result.detail["kernels"])


def test_llo_is_not_available_on_a_tpu_capture_without_llo_lines():
    session = read_session([shared_profile("tpu/tpu_v6e_inference.xplane.pb")])
    result = run_tool(session, "llo_load")
    assert result.status == ToolStatus.NOT_AVAILABLE and "no LLO lines" in result.reason


def test_detectors_find_their_pattern(cpu_profiles):
    layout_result = run_tool(read_session([cpu_profiles["layout_transpose"]]), "detect_layout_mismatch_copies")
    layout = layout_result.summary
    assert layout["share_of_op_time_percent"] > 30
    # The workload's transposes and the layout-changing copies XLA adds beside them take about the same time: which
    # one comes first varies between captures, and both are the pattern.
    assert "transpose:" in layout["top_op_why"] or "copy from layout" in layout["top_op_why"]
    assert any("transpose" in op["op"] for op in layout_result.detail["ops"])
    convert = run_tool(read_session([cpu_profiles["widening_convert"]]), "detect_unnecessary_convert_reduce").summary
    assert convert["widening"] == "bf16->f32" and convert["share_of_op_time_percent"] > 30
    reshapes = run_tool(read_session([cpu_profiles["layout_transpose"]]), "detect_unfused_reshapes").summary
    assert reshapes["count"] >= 1


def test_hlo_neighborhood_and_bad_arguments(cpu_profiles):
    session = read_session([cpu_profiles["widening_convert"]])
    result = run_tool(session, "get_hlo_neighborhood", {"op": "wrapped_convert"})
    assert result.ok and result.summary["opcode"] == "fusion" and result.summary["consumers"]
    missing = run_tool(session, "get_hlo_neighborhood", {"op": "no_such_op"})
    assert missing.status == ToolStatus.NOT_AVAILABLE and "no_such_op" in missing.reason
    bad = run_tool(session, "get_hlo_neighborhood", {"op": 3})
    assert bad.status == ToolStatus.FAILED and "must be a string" in bad.reason
    unknown_arg = run_tool(session, "get_hosts", {"verbose": True})
    assert unknown_arg.status == ToolStatus.FAILED and "verbose" in unknown_arg.reason


def test_aggregate_events_counts_compiles_in_the_recompiling_workload(cpu_profiles):
    session = read_session([cpu_profiles["recompilation"]])
    result = run_tool(session, "aggregate_xplane_events", {"pattern": "backend_compile"})
    assert result.ok and result.summary["matches"] >= 6
    bad = run_tool(session, "aggregate_xplane_events", {"pattern": "("})
    assert bad.status == ToolStatus.FAILED and "is not a regular expression RE2 accepts" in bad.reason


def test_hosts_and_device_information_on_device_profiles():
    session = read_session([shared_profile("tpu/tpu_v6e_inference.xplane.pb")])
    info = run_tool(session, "get_device_information").summary
    assert info["device_type"] == "TPU v6 Lite" and info["peak_teraflops_per_second"] == pytest.approx(918.0)
    assert run_tool(session, "get_hosts").summary["hosts"] == 1


def test_kpis_agree_with_the_step_trace(healthy_cpu):
    kpi = run_tool(healthy_cpu, "get_kpi_metrics").summary
    step = run_tool(healthy_cpu, "get_step_trace").summary
    assert kpi["step_time_ms"] == step["step_time_ms_mean"]
    assert kpi["achieved_gflops_per_s_during_ops"] > 0 and kpi["hlo_costed_op_share_percent"] > 90


def test_utilization_sees_the_four_cpu_devices_of_the_collective_workload(cpu_profiles):
    summary = run_tool(read_session([cpu_profiles["collective_bound"]]), "get_utilization_viewer").summary
    assert summary["devices"] == 4 and 0 < summary["busy_percent_min"] <= summary["busy_percent_max"] <= 100


def test_list_hlo_modules_shows_one_version_per_recompile(cpu_profiles):
    summary = run_tool(read_session([cpu_profiles["recompilation"]]), "list_hlo_modules").summary
    assert summary["recompiled_names"].get("jit_train_step", 0) >= 6


def test_memory_and_roofline_come_from_xprof_on_tpu():
    session = read_session([shared_profile("tpu/tpu_v6e_inference.xplane.pb")])
    memory = run_tool(session, "get_memory_profile").summary
    assert memory["peak_memory_gib"] == pytest.approx(20.0, abs=0.1) and memory["oom_risk"] == "LOW"
    roofline = run_tool(session, "get_roofline_model").summary
    assert roofline["roofline_efficiency_percent"] == pytest.approx(4.35) and roofline["bound_by"] == "HBM"
    assert run_tool(session, "get_smart_suggestions").ok
    assert run_tool(session, "get_peak_allocations").summary["module"].startswith("jit_")


def test_largest_buffers_sum_only_what_is_live_together():
    # TPU v6e host offload: six 10 GiB copy-start tuples and 5 GiB arrays, most in host memory or aliases of
    # each other; what the device holds at once is what XProf's allocator measured, on a 31.2 GiB chip.
    session = read_session([shared_profile("tpu/tpu_v6e_inference.xplane.pb")])
    memory = run_tool(session, "get_memory_profile").summary
    buffers = run_tool(session, "get_peak_allocations")
    assert buffers.ok and "top10_total_mib" not in buffers.summary
    assert buffers.summary["hlo_values_live_at_once_gib"] <= memory["capacity_gib"]
    assert buffers.summary["hlo_values_live_at_once_gib"] == pytest.approx(memory["peak_memory_gib"], rel=0.02)
    assert all("(" not in b["shape"] for b in buffers.detail["buffers"]), "a tuple is not a buffer"


def test_memory_capacity_is_the_device_and_the_allocator_limit_is_named():
    # MI300X: XProf's capacity is the BFC allocator's limit, 75% of the 192 GiB the device plane records.
    session = read_session([shared_profile("gpu/mi300x_jax_gemm.xplane.pb")])
    memory = run_tool(session, "get_memory_profile").summary
    device_bytes = session.device_planes()[0].stats["memory_size"]
    assert memory["capacity_gib"] == pytest.approx(device_bytes / 2**30, rel=1e-3)
    assert memory["allocator_limit_gib"] == pytest.approx(0.75 * memory["capacity_gib"], rel=0.01)
    assert memory["headroom_percent"] == pytest.approx(
        100 * (1 - memory["peak_memory_gib"] / memory["allocator_limit_gib"]), abs=0.05)
    assert not {"peak_hbm_gib", "memory_capacity_gib", "hbm_utilization_percent"} & set(memory), "said twice"


def test_h200_device_and_memory(h200_profiles):
    session = read_session([h200_profiles["healthy"]])
    info = run_tool(session, "get_device_information").summary
    assert "H200" in info["device_type"] and info["core_count"] == 132
    memory = run_tool(session, "get_memory_profile").summary
    assert 0 < memory["peak_memory_gib"] < memory["capacity_gib"]
    llo = run_tool(session, "llo_query", {"pattern": "."})
    assert llo.status == ToolStatus.NOT_AVAILABLE and "GPU" in llo.reason


def test_peak_allocations_take_the_busiest_module_the_profile_carries(h200_profiles):
    # Its busiest ops include autotuning kernels named after modules that are not in the profile (gemm_fusion_dot.4).
    session = read_session([h200_profiles["recompilation"]])
    peak = run_tool(session, "get_peak_allocations")
    assert peak.ok, peak.reason
    assert peak.summary["module"].startswith("jit_train_step(") and peak.source == xprof_source()


def test_memory_profile_is_not_invented_on_cpu(healthy_cpu):
    result = run_tool(healthy_cpu, "get_memory_profile")
    assert result.status == ToolStatus.NOT_AVAILABLE and "CPU profiles have no device memory" in result.reason
    peak = run_tool(healthy_cpu, "get_peak_allocations")
    assert peak.ok and peak.summary["largest_buffer_mib"] > 0 and "HLO value sizes" in peak.summary["basis"]


def test_counter_samples_and_zero_length_lines_are_never_summed_as_time(tmp_path):
    """A TPU capture's `_counters_` line holds samples (a throttle percentage at an instant), and a line of
    zero-length events holds instants: aggregate_xplane_events counts them and says what they are, never adds them to
    total_ms (on main the counter line below added its 491 ms to a capture whose ops took 58 ms), and
    get_custom_kernels does not call them low-level lines that are available (on main: `available: True`)."""
    from pathlib import Path

    from xdiag.profile import schema

    from tests.conftest import TESTS

    original = TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb"
    space = schema.XSpace()
    space.ParseFromString(original.read_bytes())
    device = next(p for p in space.planes if p.name.startswith("/device:TPU"))
    counters = next(ln for ln in device.lines if ln.name == "_counters_" and len(ln.events))
    for event in counters.events:
        event.duration_ps = 491 * 10**9  # as one capture's counter line recorded it
    key = next(k for k in range(1, 10**6) if k not in device.event_metadata)
    device.event_metadata[key].id, device.event_metadata[key].name = key, "marker"
    taken = {ln.id for ln in device.lines}
    instants = device.lines.add(id=next(i for i in range(1, 10**6) if i not in taken), name="Markers",
                                timestamp_ns=counters.timestamp_ns)
    for i in range(5):
        instants.events.add(metadata_id=key, offset_ps=i * 10**6, duration_ps=0)
    mutated = Path(tmp_path) / "counters.xplane.pb"
    mutated.write_bytes(space.SerializeToString())

    def answer(path, tool, args=None):
        session = read_session([path], name="s", max_bytes=2**30)
        try:
            return run_tool(session, tool, args or {})
        finally:
            session.close()

    before, after = answer(original, "aggregate_xplane_events", {"pattern": "."}), answer(
        mutated, "aggregate_xplane_events", {"pattern": "."})
    assert after.summary["total_ms"] == before.summary["total_ms"]  # neither the 491 ms nor the instants
    said = {g["line"]: g["is"] for g in after.detail["not_time"]}
    assert said == {"_counters_": "counter samples (values at instants), not time",
                    "Markers": "zero-length events (instants), not time"}
    assert after.summary["not_time_matches"] == len(counters.events) + 5
    assert not {g["line"] for g in after.detail["groups"]} & set(said)
    only = answer(mutated, "aggregate_xplane_events", {"pattern": "Throttle|marker"})
    assert only.status == ToolStatus.OK and only.summary["total_ms"] is None and "never sum" in only.summary["total_is"]
    kernels = answer(mutated, "get_custom_kernels")
    low = kernels.detail["low_level"]
    assert low["available"] is False and kernels.summary["low_level_lines"] == 0
    assert [c["line"] for c in low["counters"]] == ["_counters_"] and "not time" in low["counters"][0]["is"]


def test_capture_time_paths_are_said_to_be_the_capture_machines_where_not_readable_here(tmp_path):
    """A profile names its files as the capture machine had them: where they are not readable here, get_line_view
    says so and what reads them (source_root); a checkout holding them takes the note away."""
    from pathlib import Path

    from xdiag.analysis.line_view import line_view

    from tests.conftest import TESTS

    session = read_session([TESTS / "profiles" / "tpu_v5e" / "gpt_train.xplane.pb"], name="s", max_bytes=2**30)
    try:
        named = {e.file for e in line_view(session).lines.values() if e.line and not e.library and e.file}
        assert named and not any(Path(f).is_file() for f in named)  # captured on another machine
        far = run_tool(session, "get_line_view", {"top_n": 3})
        note = far.summary["paths_are"]
        assert "capture machine" in note and "source_root" in note and f"{len(named)} files" in note
        assert all("capture machine" in row["code_not_available"] for row in far.detail["lines"] if row.get("line"))
        for recorded in named:  # a checkout here: each recorded path's last two parts below it
            copy = Path(tmp_path) / Path(recorded).parent.name / Path(recorded).name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text("\n" * 200)
        here = run_tool(session, "get_line_view", {"top_n": 3, "source_root": str(tmp_path)})
        assert "paths_are" not in here.summary
    finally:
        session.close()
