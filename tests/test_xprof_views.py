"""xdiag.analysis.xprof.views against the shared real device profiles (TPU v6e, V100, MI300X).

Each profile is copied into a temporary folder and its views are built once per module; the tests
that need a fresh instance (counting conversions, threads, logging, clean-up) use the small
MI300X and TPU profiles, so the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest
from xdiag.errors import NotAvailable, ProfileError

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "profiles"


@pytest.fixture(autouse=True)
def _shared_profiles_here():
    from tests.conftest import missing_shared

    if not PROFILES.is_dir():
        missing_shared(PROFILES)


pytest.importorskip("xprof", reason="the xprof wheel is not installed")

from xdiag.analysis.xprof import (XprofViews, common, conversions, host_events, memory_budget,  # noqa: E402
                                   session_dir, stored, worker)
from xdiag.analysis.xprof.quiet import quiet  # noqa: E402
from xdiag.profile import schema, slim  # noqa: E402
from xdiag.profile.reader import read_threads  # noqa: E402

TPU = "tpu/tpu_v6e_inference.xplane.pb"
V100 = "gpu/v100x8_tf_bert_worker.xplane.pb"
MI300X = "gpu/mi300x_jax_gemm.xplane.pb"
CORRUPT = "bad/tpu_v6e_inference_text_mangled.xplane.pb"
VIEWS = (
    "overview",
    "step_trace",
    "kpi_metrics",
    "device_information",
    "utilization",
    "smart_suggestions",
    "roofline",
    "hlo_op_profile",
    "memory_profile",
    "peak_allocations",
    "kernel_stats",
)


def _copy(name: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(PROFILES / name, folder))


def _all_views(views: XprofViews) -> dict[str, dict | NotAvailable]:
    outcomes: dict[str, dict | NotAvailable] = {}
    for name in VIEWS:
        try:
            outcomes[name] = getattr(views, name)()
        except NotAvailable as error:
            outcomes[name] = error
    return outcomes


def _open(name: str, tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    originals = tmp_path_factory.mktemp("originals")
    copy = _copy(name, originals)
    before = sorted(p.name for p in originals.iterdir())
    views = XprofViews([copy], workdir=tmp_path_factory.mktemp("work"))
    return types.SimpleNamespace(views=views, outcomes=_all_views(views), originals=originals, before=before)


@pytest.fixture(scope="module")
def tpu(tmp_path_factory):
    run = _open(TPU, tmp_path_factory)
    yield run
    run.views.close()


@pytest.fixture(scope="module")
def v100(tmp_path_factory):
    run = _open(V100, tmp_path_factory)
    yield run
    run.views.close()


@pytest.fixture(scope="module")
def mi300x(tmp_path_factory):
    run = _open(MI300X, tmp_path_factory)
    yield run
    run.views.close()


def _view(run: types.SimpleNamespace, name: str) -> dict:
    outcome = run.outcomes[name]
    assert isinstance(outcome, dict), f"{name}: {outcome}"
    return outcome


def _missing(run: types.SimpleNamespace, name: str) -> str:
    outcome = run.outcomes[name]
    assert isinstance(outcome, NotAvailable), f"{name} should be NotAvailable, got {outcome}"
    assert str(outcome).strip()
    return str(outcome)


# --- TPU v6e ---------------------------------------------------------------------------------------


def test_tpu_overview_reproduces_duty_cycle_and_roofline_utilisation(tpu):
    overview = _view(tpu, "overview")
    assert overview["device_type"] == "TPU v6 Lite"
    assert overview["device_core_count"] == 4
    assert overview["duty_cycle_percent"] == pytest.approx(86.5)
    assert overview["device_idle_percent"] == pytest.approx(13.4)
    assert overview["flop_rate_utilization_percent"] == pytest.approx(4.35)
    assert overview["mxu_utilization_percent"] == 0.0
    assert overview["bound_by"] == "HBM"
    assert overview["step_time_ms"] is None
    assert "step marker" in overview["unavailable"]["step_time_ms"]


def test_tpu_kpi_metrics_give_duty_cycle_peak_hbm_and_roofline(tpu):
    kpi = _view(tpu, "kpi_metrics")
    assert kpi["duty_cycle_percent"] == pytest.approx(86.5)
    assert kpi["peak_hbm_gib"] == pytest.approx(20.0, abs=0.05)
    assert kpi["memory_capacity_gib"] == pytest.approx(31.25, abs=0.01)
    assert kpi["hbm_utilization_percent"] == pytest.approx(64.06, abs=0.05)
    assert kpi["flop_rate_utilization_percent"] == pytest.approx(4.35)
    assert kpi["flops_provenance"] == "xla_cost_model"
    assert kpi["step_time_ms"] is None and "step_time_ms" in kpi["unavailable"]


def test_tpu_roofline_and_device_information(tpu):
    roofline = _view(tpu, "roofline")
    assert roofline["roofline_efficiency_percent"] == pytest.approx(4.35)
    assert roofline["bound_by"] == "HBM"
    assert roofline["hbm_bw_gibs"] == pytest.approx(66.33, abs=0.01)
    assert roofline["ops_analyzed"] == 17
    assert "copy-done.4" in [op["name"] for op in roofline["detail"]["top_operations"]]
    device = _view(tpu, "device_information")
    assert device["peak_flop_rate_gflops"] == pytest.approx(918000.0)
    assert device["peak_hbm_bw_gibs"] == pytest.approx(1525.5)
    assert device["hbm_ridge_point_flop_per_byte"] == pytest.approx(560.442)
    assert device["megacore"] is False


def test_tpu_memory_profile_and_peak_allocations_agree_on_20_gib(tpu):
    memory = _view(tpu, "memory_profile")
    assert memory["peak_hbm_gib"] == pytest.approx(20.0, abs=0.05)
    assert memory["peak_hbm_bytes"] == 21492671104
    assert memory["stack_at_peak_gib"] == pytest.approx(20.0, abs=0.05)
    assert memory["device_allocator_count"] == 4
    peak = _view(tpu, "peak_allocations")
    assert peak["module_count"] == 4
    assert peak["peak_module"].startswith("jit_f(")
    assert peak["peak_module_hbm_gib"] == pytest.approx(20.0, abs=0.05)
    assert peak["top_buffer_mib"] == pytest.approx(5120.0)
    one = tpu.views.peak_allocations(module="jit_f")
    assert one["module"] == peak["peak_module"] and len(one["detail"]["modules"]) == 1
    with pytest.raises(NotAvailable, match="no HLO module 'jit_nothing'"):
        tpu.views.peak_allocations(module="jit_nothing")


def test_tpu_hlo_op_profile_ranks_copy_done_and_caps_lists_at_top_n(tpu):
    profile = _view(tpu, "hlo_op_profile")
    assert profile["top_category"] == "copy-done"
    assert profile["top_category_percent"] == pytest.approx(83.59, abs=0.05)
    assert profile["idle_percent"] == pytest.approx(13.36, abs=0.05)
    assert profile["top_op"] == "copy-done.4"
    small = tpu.views.hlo_op_profile(top_n=2)
    for key in ("categories", "top_ops_by_time", "top_ops_by_flops", "top_ops_by_bytes"):
        assert 0 < len(small["detail"][key]) <= 2, key
    assert small["detail"]["top_ops_by_time"][0]["program"].startswith("jit_f(")


def test_tpu_has_no_steps_no_gpu_kernels_and_no_counters(tpu):
    assert "step marker" in _missing(tpu, "step_trace")
    assert re.search(r"TPU.*hlo_op_profile", _missing(tpu, "kernel_stats"))
    assert "performance-counter" in _missing(tpu, "utilization")
    assert _view(tpu, "smart_suggestions")["suggestion_count"] == 0


# --- V100, TensorFlow without XLA ---------------------------------------------------------------


def test_v100_kernel_stats_name_the_profiles_cuda_kernels(v100):
    kernels = _view(v100, "kernel_stats")
    assert kernels["kernel_count"] == 15
    assert kernels["total_kernel_time_ms"] == pytest.approx(29.69, abs=0.01)
    assert "FillPhiloxRandomKernelLaunch" in kernels["top_kernel"]
    names = [k["kernel_name"] for k in kernels["detail"]["kernels"]]
    assert any("Eigen::internal::EigenMetaKernel" in name for name in names)
    top = v100.views.kernel_stats(top_n=3)
    assert len(top["detail"]["kernels"]) == 3
    assert top["detail"]["kernels"][0]["block_dim"] == "1024,1,1"
    assert top["detail"]["kernels"][0]["registers_per_thread"] == 38


def test_v100_step_trace_and_memory_capacity_of_the_peak_device(v100):
    steps = _view(v100, "step_trace")
    assert steps["step_count"] == 1
    assert steps["step_time_ms"] == pytest.approx(21.31, abs=0.01)
    assert steps["idle_percent"] == pytest.approx(30.2)
    memory = _view(v100, "memory_profile")
    assert memory["peak_hbm_gib"] == pytest.approx(5.78, abs=0.01)
    assert memory["peak_allocator"] == "GPU_6_bfc"
    # XProf's get_memory_profile divides by the 64 GiB host allocator; the device holds 14.4 GiB.
    assert memory["memory_capacity_gib"] == pytest.approx(14.41, abs=0.01)
    assert memory["hbm_utilization_percent"] == pytest.approx(40.12, abs=0.05)
    largest = memory["detail"]["largest_allocations_at_peak"]
    assert any((row["op_name"] or "").startswith("replica_6/bert_span_labeler") for row in largest)


def test_v100_without_xla_has_no_roofline_hlo_ops_or_modules(v100):
    assert "0 HLO ops" in _missing(v100, "roofline")
    assert "no HLO ops" in _missing(v100, "hlo_op_profile") and "no XLA programs" in _missing(v100, "hlo_op_profile")
    assert "HLO modules" in _missing(v100, "peak_allocations")
    overview = _view(v100, "overview")
    assert overview["step_time_ms"] == pytest.approx(21.3)
    assert overview["flop_rate_utilization_percent"] is None
    assert "0 HLO ops" in overview["unavailable"]["flop_rate_utilization_percent"]
    assert overview["duty_cycle_percent"] is None and "TPU" in overview["unavailable"]["duty_cycle_percent"]
    device = _view(v100, "device_information")
    assert device["peak_flop_rate_gflops"] is None and device["peak_hbm_bw_gibs"] == pytest.approx(836.372)


# --- MI300X, JAX GEMM -----------------------------------------------------------------------------


def test_mi300x_kernel_stats_and_shape_derived_roofline(mi300x):
    kernels = _view(mi300x, "kernel_stats")
    assert kernels["top_kernel"].startswith("Cijk_Ailk_Bljk")
    assert kernels["detail"]["kernels"][0]["op_name"] == "jit(dot)/dot_general"
    assert kernels["tensor_core_time_percent"] == pytest.approx(93.05, abs=0.05)
    roofline = _view(mi300x, "roofline")
    assert roofline["roofline_efficiency_percent"] == pytest.approx(1.26)
    assert roofline["flops_provenance"] == "mixed"
    kpi = _view(mi300x, "kpi_metrics")
    assert kpi["flop_rate_utilization_percent"] == pytest.approx(1.26)
    assert kpi["derived_flops_fraction"] == pytest.approx(0.9907, abs=1e-4)
    assert _view(mi300x, "device_information")["device_type"] == "AMD GPU - gfx942"
    assert _view(mi300x, "peak_allocations")["peak_module"] == "jit_dot(49)"
    assert _view(mi300x, "hlo_op_profile")["top_op"] == "custom-call.1 [jit(dot)/dot_general:]"
    assert "step marker" in _missing(mi300x, "step_trace")


# --- on every profile -------------------------------------------------------------------------------


def _walk(value, path="") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]")
    elif isinstance(value, str):
        assert value.strip().upper() not in ("N/A", "NAN", "-NAN"), path
        assert not re.fullmatch(r"[+-]?\d+(\.\d+)?%", value.strip()), f"{path}: number as text {value!r}"
    elif isinstance(value, float):
        assert math.isfinite(value), path


def test_views_are_plain_json_with_numbers_as_numbers_and_bounded_detail(tpu, v100, mi300x):
    for run in (tpu, v100, mi300x):
        for name, outcome in run.outcomes.items():
            if isinstance(outcome, NotAvailable):
                continue
            assert json.loads(json.dumps(outcome)) == outcome, name
            _walk(outcome, name)
            assert "detail" in outcome, name
            for key, value in outcome.items():
                if key not in ("detail", "unavailable"):
                    assert value is None or isinstance(value, (int, float, str, bool)), f"{name}.{key}"
            for key, value in outcome.get("unavailable", {}).items():
                assert outcome[key] is None and value, f"{name}.unavailable.{key}"
            for key, value in outcome["detail"].items():
                if isinstance(value, list):
                    assert len(value) <= 20, f"{name}.detail.{key}"
            assert len(json.dumps(outcome)) < 64_000, name


def test_originals_folder_gets_no_new_files(tpu, v100, mi300x):
    for run in (tpu, v100, mi300x):
        assert sorted(p.name for p in run.originals.iterdir()) == run.before
        # XProf did write its cache files, into the private copy.
        assert (run.views.run_dir / "ALL_HOSTS.op_stats_v2.pb").is_file()


# --- computing once, isolation, threads, noise, clean-up ---------------------------------------


def test_each_conversion_runs_once_per_instance_and_not_across_instances(tmp_path, monkeypatch):
    from xprof.convert import raw_to_tool_data

    calls: list[tuple[str, str]] = []
    real = raw_to_tool_data.xspace_to_tool_data

    def counting(xspace_paths, tool, params, *args, **kwargs):
        calls.append((tool, str(params.get("module_name"))))
        return real(xspace_paths, tool, params, *args, **kwargs)

    monkeypatch.setattr(raw_to_tool_data, "xspace_to_tool_data", counting)
    copy = _copy(MI300X, tmp_path / "originals")
    with XprofViews([copy], workdir=tmp_path / "a") as views:
        first = _all_views(views)
        again = _all_views(views)
        views.kpi_metrics()
        views.hlo_op_profile(top_n=3)
        assert len(views.timings_s) == len(VIEWS) + 1  # + hlo_op_profile(top_n=3)
        assert all(count == 1 for count in views.conversion_counts.values()), views.conversion_counts
    assert {str(k): str(v) for k, v in first.items()} == {str(k): str(v) for k, v in again.items()}
    per_conversion = {call: calls.count(call) for call in calls}
    assert per_conversion[("overview_page", "None")] == 1  # overview, step trace, KPIs, device info share it
    assert per_conversion[("roofline_model", "None")] == 1  # overview, roofline, KPIs, device info share it
    assert per_conversion[("op_profile", "None")] == 1  # roofline, hlo_op_profile (two tools) share it
    assert set(per_conversion.values()) == {1}, per_conversion

    # A second instance on the same bytes converts again: results are per instance, not shared.
    calls.clear()
    with XprofViews([copy], workdir=tmp_path / "b") as other:
        other.overview()
    assert ("overview_page", "None") in calls


@pytest.mark.parametrize("fixture", ["tpu", "v100", "mi300x"])
def test_prefetched_views_equal_the_in_process_ones(fixture, request, tmp_path, monkeypatch):
    """prefetch() runs the conversions in worker processes, each on its own folder of links to the
    file; every view must come out exactly as when each conversion runs in-process on demand."""
    run = request.getfixturevalue(fixture)
    name = {"tpu": TPU, "v100": V100, "mi300x": MI300X}[fixture]
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "2")
    with XprofViews([_copy(name, tmp_path / "originals")]) as views:
        assert views.prefetch() == 2
        assert views.prefetch() == 0  # started once
        outcomes = _all_views(views)
        assert all(count == 1 for count in views.conversion_counts.values()), views.conversion_counts
        assert {"overview_page", "kernel_stats", "memory_profile"} <= set(views.worker_cpu_s)
        # converted only where it could suggest something (the TPU profile has barrier-cores events)
        assert ("smart_suggestion" in views.worker_cpu_s) == views.may_have_suggestions() == (fixture == "tpu")
        folders = [Path(folder) for folder in views.conversions.worker_folders]
        assert folders and all(folder.is_dir() for folder in folders)
    assert not any(folder.exists() for folder in folders)
    assert outcomes.keys() == run.outcomes.keys()
    for view, outcome in run.outcomes.items():
        if isinstance(outcome, dict):
            assert outcomes[view] == outcome, view
        else:
            assert type(outcomes[view]) is type(outcome) and str(outcomes[view]) == str(outcome), view


def test_prefetch_is_off_with_no_processes_and_a_corrupt_file_still_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "0")
    with XprofViews([_copy(MI300X, tmp_path / "a")]) as views:
        assert views.prefetch() == 0 and not views.worker_cpu_s
    monkeypatch.delenv("XDIAG_XPROF_PROCESSES")  # by default a small session converts in-process, a large one not
    with XprofViews([_copy(MI300X, tmp_path / "c")]) as views:
        assert views.prefetch() == 0 and not views.worker_cpu_s
        assert views.overview()["device_type"]
    monkeypatch.setattr(worker, "PREFETCH_MIN_BYTES", 1)
    with XprofViews([_copy(MI300X, tmp_path / "d")]) as views:
        assert views.prefetch() >= 1  # as many as the CPUs allow, up to its two conversion groups
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "2")
    with XprofViews([_copy(CORRUPT, tmp_path / "b")]) as views:
        assert views.prefetch() == 2
        with pytest.raises(ProfileError, match="Can't parse .* as binary proto"):
            views.overview()
        assert str(tmp_path / "b") in str(views.conversions.unreadable)  # the original's path, not a worker's link


def test_returned_dicts_are_copies(mi300x):
    first = mi300x.views.overview()
    first["duty_cycle_percent"] = 1.0
    first["detail"].clear()
    second = mi300x.views.overview()
    assert second["duty_cycle_percent"] is None and second["detail"]


def test_concurrent_instances_on_different_sessions_do_not_collide(tmp_path, tpu, mi300x):
    results: dict[str, dict] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2, timeout=30)

    def work(name: str, profile: str) -> None:
        try:
            with XprofViews([_copy(profile, tmp_path / name)]) as views:
                barrier.wait()
                results[name] = {
                    "kpi": views.kpi_metrics(),
                    "roofline": views.roofline(),
                    "memory": views.memory_profile(),
                }
        except BaseException as error:  # noqa: BLE001 (re-raised below in the main thread)
            errors.append(error)

    threads = [threading.Thread(target=work, args=("tpu", TPU)), threading.Thread(target=work, args=("mi300x", MI300X))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for name, run in (("tpu", tpu), ("mi300x", mi300x)):
        assert results[name]["kpi"] == _view(run, "kpi_metrics")
        assert results[name]["roofline"] == _view(run, "roofline")
        assert results[name]["memory"] == _view(run, "memory_profile")


def test_xprof_logging_is_kept_off_stderr(tmp_path, capfd):
    with XprofViews([_copy(MI300X, tmp_path / "originals")]) as views:
        views.overview()
        views.peak_allocations()
        views.kernel_stats()
    out, err = capfd.readouterr()
    assert not re.search(r"^[IWEF]\d{4} ", err + out, re.MULTILINE), (err + out)[:2000]
    assert "xplane_to" not in err


def test_close_removes_the_private_copy(tmp_path):
    copy = _copy(MI300X, tmp_path / "originals")
    with XprofViews([copy]) as views:
        views.memory_profile()
        private = views.run_dir.parents[2]  # the temporary workdir
        assert private.is_dir() and (views.run_dir / copy.name).exists()
    assert not private.exists()
    assert copy.is_file()
    with pytest.raises(RuntimeError, match="closed"):
        views.overview()


def test_a_given_workdir_keeps_everything_but_the_session(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "keep.txt").parent.mkdir(parents=True)
    (workdir / "keep.txt").write_text("mine")
    views = XprofViews([_copy(MI300X, tmp_path / "originals")], workdir=workdir)
    assert views.run_dir.parent == workdir / "plugins" / "profile"
    views.close()
    views.close()
    assert not views.run_dir.exists() and (workdir / "keep.txt").read_text() == "mine"


def test_corrupt_profile_raises_profile_error_with_xprofs_reason(tmp_path):
    with XprofViews([_copy(CORRUPT, tmp_path / "originals")]) as views:
        with pytest.raises(ProfileError, match="Can't parse .* as binary proto"):
            views.overview()
        with pytest.raises(ProfileError):
            views.kernel_stats()


# --- conversions whose answers are known, or shared ---------------------------------------------

H200 = Path(__file__).resolve().parent / "profiles" / "h200"
DEVICE_PROFILES = sorted(H200.glob("*.xplane.pb")) + sorted(
    p for p in PROFILES.glob("*/*.xplane.pb") if p.parent.name != "bad"
)


def _outcome(view: Callable[[], dict]) -> dict | str:
    try:
        return view()
    except NotAvailable as error:
        return f"NotAvailable: {error}"


@pytest.mark.parametrize("profile", DEVICE_PROFILES, ids=lambda p: p.name)
def test_answers_known_from_the_files_bytes_are_the_converters_own(profile, tmp_path, monkeypatch):
    """No real profile holds performance-counter samples, and only the TPU one `barrier-cores` events, so the
    utilization view and (on the GPUs) the smart-suggestion view answer without converting; with the
    conversions forced, XProf must say the same."""
    copy = Path(shutil.copy(profile, tmp_path))
    with XprofViews([copy]) as known:
        assert not known.may_have_counter_samples()
        assert known.may_have_suggestions() == (profile.parent.name == "tpu")
        known_answers = (_outcome(known.utilization), _outcome(known.smart_suggestions))
        converted_here = {key.split("{")[0] for key in known.conversion_counts}
        assert "utilization_viewer" not in converted_here
        assert ("smart_suggestion" in converted_here) == known.may_have_suggestions()
    with XprofViews([copy]) as converted:
        monkeypatch.setattr(converted, "may_have_counter_samples", lambda: True)
        monkeypatch.setattr(converted, "may_have_suggestions", lambda: True)
        converted_answers = (_outcome(converted.utilization), _outcome(converted.smart_suggestions))
        assert {"utilization_viewer", "smart_suggestion"} <= {key.split("{")[0] for key in converted.conversion_counts}
    assert known_answers == converted_answers
    assert "performance-counter samples" in known_answers[0] and known_answers[1]["suggestion_count"] == 0


def _comparable(outcome: dict | NotAvailable) -> dict | str:
    return outcome if isinstance(outcome, dict) else f"{type(outcome).__name__}: {outcome}"


@pytest.mark.parametrize("profile", DEVICE_PROFILES, ids=lambda p: p.name)
def test_views_without_the_events_xprof_makes_no_use_of_are_the_views_of_the_whole_file(profile, tmp_path):
    """The private copy leaves out the Python tracer's events and the stat-less host events whose names XProf gives
    no meaning (xdiag.profile.slim, host_events) because XProf's answers do not use them: every view, from every
    converter xdiag runs, must be what XProf gives for the file as it is."""
    copy = Path(shutil.copy(profile, tmp_path))
    python_only = slim.write_without_unused_events(copy, tmp_path / "python_only.xplane.pb")
    with XprofViews([copy]) as thinned, XprofViews([copy], all_events=True) as whole:
        jax_profile = profile.parent.name == "h200" or profile.name.startswith("mi300x")  # TF's V100 and the TPU: none
        assert (python_only > 0) == jax_profile
        if jax_profile:  # JAX's runtime and compiler events: most host events that are not the Python tracer's
            assert thinned.events_left_out > python_only
            assert not thinned.files[0].is_symlink() and thinned.files[0].stat().st_size < copy.stat().st_size
        assert whole.events_left_out == 0 and whole.files[0].is_symlink()
        thinned_views = {name: _comparable(outcome) for name, outcome in _all_views(thinned).items()}
        whole_views = {name: _comparable(outcome) for name, outcome in _all_views(whole).items()}
    assert thinned_views == whole_views


TPU_V5E = Path(__file__).resolve().parent / "profiles" / "tpu_v5e"


def _without_tie_order(view: dict | str) -> dict | str:
    """An hlo_op_profile view less what XProf orders at random among ops of equal measure: each category's top_op
    and the op lists' names and order (their numbers stay, as a sorted list)."""
    if not isinstance(view, dict):
        return view
    detail = dict(view["detail"])
    detail["categories"] = [{k: v for k, v in row.items() if k != "top_op"} for row in detail["categories"]]
    for key in ("top_ops_by_time", "top_ops_by_flops", "top_ops_by_bytes"):
        detail[key] = sorted(json.dumps({k: v for k, v in row.items() if k != "name"}, sort_keys=True)
                             for row in detail[key])
    return {**{k: v for k, v in view.items() if k != "top_op"}, "detail": detail}


XPROF_TPU_CONVERTERS = ("overview_page", "op_profile", "roofline_model", "hlo_stats", "framework_op_stats",
                        "input_pipeline_analyzer", "kernel_stats", "smart_suggestion", "pod_viewer")
"""XProf's converters that read a TPU profile's device planes: all its UI runs but memory_profile (the host plane
alone, compared through xdiag's views) and utilization_viewer (performance-counter samples, which no capture here
holds)."""


def _in_one_order(value):
    """A parsed op_profile with every list in one order and its ops (the nodes that carry an HLO op, `xla`) without
    what names them: where ops tie (equal measure), XProf orders them, picks those a list keeps and the duplicate
    that names a group at random from one conversion of the same file to the next. Every op's numbers stay."""
    if isinstance(value, dict):
        if "xla" in value:
            value = {key: item for key, item in value.items() if key not in ("name", "xla")}
        return {key: _in_one_order(item) for key, item in value.items()}
    if isinstance(value, list):
        return sorted((_in_one_order(item) for item in value), key=lambda item: json.dumps(item, sort_keys=True))
    return value


def _xprof_outputs(profile: Path, folder: Path) -> dict:
    """What each of XPROF_TPU_CONVERTERS gives for `profile`, converted as XProf's UI converts (op_stats kept beside
    the file and read by the next converters), in a run folder of its own under `folder`; parsed, op_profile's lists
    in one order."""
    run_dir = folder / "plugins" / "profile" / "session"
    run_dir.mkdir(parents=True)
    shutil.copy(profile, run_dir / "host.xplane.pb")
    from xprof.convert import raw_to_tool_data

    outputs = {}
    with quiet():
        for converter in XPROF_TPU_CONVERTERS:
            data = raw_to_tool_data.xspace_to_tool_data([run_dir / "host.xplane.pb"], converter, {})
            data = data[0] if isinstance(data, tuple) else data
            outputs[converter] = json.loads(data) if data else data
    outputs["op_profile"] = _in_one_order(outputs["op_profile"])
    return outputs


@pytest.mark.parametrize("name", ["kv_decode", "host_sync", "flash_attention_train", "remat_train", "decode_prefetched",
                                  "near_hbm_limit", "input_bound"])
def test_tpu_views_without_what_xprof_never_reads_are_the_views_of_the_whole_file(name, tmp_path):
    """The private copy of a TPU profile also leaves out its TPU planes' `Async XLA Ops` lines (slim.UNREAD_TPU_LINES,
    a third of the 87.6 MiB capture's bytes), which XProf's op_stats and memory_profile never visit, and its op
    events' `Time Scale Multiplier` where it holds 1.0, the factor XProf takes without it (slim.DEFAULT_TPU_OP_STATS,
    a third of their stats): XProf's op_stats is the whole file's, and so is every view, on training, inference,
    host-bound and input-bound captures of a TPU v5e. Where ops tie (equal self time or bytes), XProf names them in
    an order that changes from one conversion of the same whole file to the next (kv_decode: 3 of 7 conversions),
    so hlo_op_profile is compared without that order; the TPU v6e profile above compares it exactly."""
    copy = Path(shutil.copy(TPU_V5E / f"{name}.xplane.pb", tmp_path))
    left_out = slim.write_for_xprof(copy, tmp_path / "thin.xplane.pb", host_events.unread_name_filter(
        common.xprof_version()), slim.UNREAD_TPU_LINES, slim.DEFAULT_TPU_OP_STATS)
    assert left_out.device_line_events > 0  # the capture has such lines, and they go
    assert left_out.default_stats > 0 and b"Time Scale Multiplier" in copy.read_bytes()  # every op event's
    with XprofViews([copy]) as thinned, XprofViews([copy], all_events=True) as whole:
        assert thinned.events_left_out >= left_out.events and not thinned.files[0].is_symlink()
        assert thinned.files[0].stat().st_size == (tmp_path / "thin.xplane.pb").stat().st_size  # that copy
        thinned_views = {name: _comparable(outcome) for name, outcome in _all_views(thinned).items()}
        whole_views = {name: _comparable(outcome) for name, outcome in _all_views(whole).items()}
    assert isinstance(thinned_views["overview"], dict) and isinstance(thinned_views["hlo_op_profile"], dict)
    for views in (thinned_views, whole_views):
        views["hlo_op_profile"] = _without_tie_order(views["hlo_op_profile"])
    assert thinned_views == whole_views
    thinned_outputs = _xprof_outputs(tmp_path / "thin.xplane.pb", tmp_path / "thin")
    assert thinned_outputs == _xprof_outputs(copy, tmp_path / "whole") and thinned_outputs["op_profile"]


def test_the_converters_read_the_stat_the_copy_leaves_out(tmp_path):
    """XProf does read `Time Scale Multiplier` (each op's normalized time): at 0.5 instead of 1.0 its op_profile and
    roofline_model differ, so the test above would see a copy that changed what XProf makes of it."""
    space = schema.XSpace.FromString((TPU_V5E / "host_sync.xplane.pb").read_bytes())
    for plane in space.planes:
        stat_ids = {key for key, meta in plane.stat_metadata.items() if meta.name in slim.DEFAULT_TPU_OP_STATS}
        for line in plane.lines:
            for event in line.events:
                for stat in event.stats:
                    if stat.metadata_id in stat_ids:
                        stat.double_value = 0.5
    (tmp_path / "scaled.xplane.pb").write_bytes(space.SerializeToString())
    scaled = _xprof_outputs(tmp_path / "scaled.xplane.pb", tmp_path / "scaled")
    whole = _xprof_outputs(TPU_V5E / "host_sync.xplane.pb", tmp_path / "whole")
    assert [name for name in XPROF_TPU_CONVERTERS if scaled[name] != whole[name]] == ["op_profile", "roofline_model"]


@pytest.mark.parametrize("name", [TPU, MI300X])
def test_the_op_profile_tools_answer_the_same_from_its_other_forms_and_parse_its_json_once(name, tmp_path,
                                                                                          monkeypatch):
    """get_hlo_op_profile and get_top_hlo_ops get op_profile as binary protobuf, get_roofline_model as its nodes'
    names and HLO expressions (conversions.op_profile_as), both made from one parse of its JSON: their answers are
    the ones they give from the JSON, which each parsed."""
    from google.protobuf import json_format

    parses: list[str] = []
    real_parse = json_format.Parse

    def counting(text, message, *args, **kwargs):
        parses.append(f"{type(message).__name__} of {len(text):,} characters")
        return real_parse(text, message, *args, **kwargs)

    monkeypatch.setattr(json_format, "Parse", counting)
    copy = _copy(name, tmp_path / "originals")
    real_forms = conversions._op_profile_forms
    answers, whole_parses = {}, {}
    for forms in (True, False):
        if not forms:
            monkeypatch.setattr(conversions, "_op_profile_forms", lambda outcome: None)
        parses.clear()
        with XprofViews([copy]) as views:
            answers[forms] = [views.tool("get_hlo_op_profile", common.xprof_api().hlo_op_profile, view="category",
                                         top_n=0),
                              views.tool("get_top_hlo_ops", common.xprof_api().top_hlo_ops, limit=0),
                              views.tool("get_roofline_model", common.xprof_api().roofline, top_n=common.DEFAULT_TOP_N)]
            raw = views.fetch("op_profile")
        whole_parses[forms] = sum(entry == f"Profile of {len(raw):,} characters" for entry in parses)
    assert whole_parses == {True: 1, False: 3}
    assert answers[True] == answers[False]
    assert answers[True][1].get("top_by_time") and answers[True][2].get("top_operations")

    from xprof.cli.internal import hlo_shape_utils
    from xprof.protobuf import op_profile_pb2

    def expressions(text) -> dict[str, str]:  # as get_roofline_model's _fetch_op_profile_expressions reads them
        profile, found = op_profile_pb2.Profile(), {}
        real_parse(text.decode() if isinstance(text, bytes) else text, profile, ignore_unknown_fields=True)
        for field in ("by_program", "by_category"):
            if profile.HasField(field):
                hlo_shape_utils.extract_expressions_from_op_profile_node(getattr(profile, field), found)
        return found

    trimmed = real_forms(("application/json", raw))["expressions"][1]
    assert len(trimmed) < len(raw) / 2 and expressions(trimmed) == expressions(raw) and expressions(raw)


def test_a_tpu_profile_that_may_hold_counter_samples_keeps_its_lines(tmp_path):
    """utilization_viewer, the one converter that reads performance-counter samples, runs on no profile here, so a
    file that may hold them keeps every device line and stat."""
    plain = TPU_V5E / "kv_decode.xplane.pb"
    copy = Path(shutil.copy(plain, tmp_path))
    with copy.open("ab") as out:  # an XSpace warning (field 3) naming the stat: still a valid XSpace
        out.write(bytes([0x1A, len(session_dir.COUNTER_SAMPLE_STAT)]) + session_dir.COUNTER_SAMPLE_STAT)
    left_out = session_dir.copy_without_unused_events(copy, tmp_path / "copy.xplane.pb")
    assert b"Async XLA Ops" in (tmp_path / "copy.xplane.pb" if any(left_out) else copy).read_bytes()
    assert left_out.device_line_events == left_out.default_stats == 0
    plain_left_out = session_dir.copy_without_unused_events(plain, tmp_path / "plain.xplane.pb")
    assert plain_left_out.device_line_events > 0 and plain_left_out.default_stats > 0
    assert b"Async XLA Ops" not in (tmp_path / "plain.xplane.pb").read_bytes()


def test_the_converters_memory_profile_from_the_host_planes_is_the_whole_files(tmp_path):
    """The detached converter's views (memory_from_host_planes) convert memory_profile from copies without the device
    planes: the same view, kpi_metrics too, and the whole copy is not converted for it."""
    copy = Path(shutil.copy(TPU_V5E / "kv_decode.xplane.pb", tmp_path))
    with XprofViews([copy], memory_from_host_planes=True) as host, XprofViews([copy]) as whole:
        assert host.memory_profile() == whole.memory_profile() and host.kpi_metrics() == whole.kpi_metrics()
        assert not any(key.startswith("memory_profile") for key in host.conversion_counts)
        assert any(key.startswith("memory_profile") for key in host.host_plane_views().conversion_counts)
        folder = host.host_plane_views().originals[0].parent
    assert not folder.exists()


def test_another_xprof_version_gets_a_copy_without_the_python_tracers_events_alone(tmp_path, monkeypatch):
    """The names XProf gives a meaning were read for one xprof version; another may know more, so its copy keeps
    every event but the Python tracer's."""
    copy = Path(shutil.copy(H200 / "recompilation.xplane.pb", tmp_path))
    python_only = slim.write_without_unused_events(copy, tmp_path / "python_only.xplane.pb")
    with XprofViews([copy]) as audited:
        assert audited.events_left_out > python_only
    monkeypatch.setattr(session_dir, "xprof_version", lambda: "2.25.0")
    with XprofViews([copy]) as other:
        assert other.events_left_out == python_only


@pytest.mark.parametrize("profile", DEVICE_PROFILES, ids=lambda p: p.name)
def test_hlo_protos_from_the_metadata_plane_are_the_ones_xprof_extracts_from_the_whole_file(
    profile, tmp_path, monkeypatch
):
    """XProf's memory viewer gets its HLO modules from a copy holding the metadata plane alone: the same modules,
    and the same buffers in each, as when XProf extracts them from the whole file itself."""
    copy = Path(shutil.copy(profile, tmp_path))
    with XprofViews([copy]) as from_metadata:
        ours = _comparable(_outcome(from_metadata.peak_allocations))
        our_files = sorted(p.name for p in from_metadata.run_dir.glob("*.hlo_proto.pb"))
    with XprofViews([copy]) as from_whole:
        monkeypatch.setattr(from_whole, "extract_hlo_protos", lambda: None)
        xprofs = _comparable(_outcome(from_whole.peak_allocations))
        xprofs_files = sorted(p.name for p in from_whole.run_dir.glob("*.hlo_proto.pb"))
    assert ours == xprofs and our_files == xprofs_files
    modules = [name for name in our_files if name != "NO_MODULE.hlo_proto.pb"]
    assert bool(modules) == (profile.name != Path(V100).name)  # TensorFlow without XLA: no modules


def test_a_truncated_profile_goes_to_xprof_as_it_is_and_gets_xprofs_reason(tmp_path):
    """The copy without Python events cannot be made of a file cut short: XProf gets the file itself (a link), and
    its reason (a short read, which names no file) becomes a ProfileError naming the original."""
    whole = H200 / "recompilation.xplane.pb"
    truncated = tmp_path / "originals" / whole.name
    truncated.parent.mkdir()
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size * 3 // 4])
    with XprofViews([truncated]) as views:
        assert views.events_left_out == 0 and views.files[0].is_symlink()
        with pytest.raises(ProfileError, match=f"XProf cannot read the profile: {truncated}: .*truncated"):
            views.overview()


def test_only_the_audited_smart_suggestion_rules_are_skipped(tmp_path, monkeypatch):
    copy = _copy(MI300X, tmp_path / "originals")
    with XprofViews([copy]) as views:
        assert not views.may_have_suggestions()
        monkeypatch.setattr("xdiag.analysis.xprof.views.xprof_version", lambda: "2.25.0")
        assert views.may_have_suggestions()  # another xprof may have other rules: convert
    marked = tmp_path / "marked.xplane.pb"
    marked.write_bytes(copy.read_bytes() + b"barrier-cores counter_value")  # names anywhere in a file count
    monkeypatch.undo()
    with XprofViews([marked]) as views:
        assert views.may_have_suggestions() and views.may_have_counter_samples()


def test_plan_puts_kernel_stats_with_op_stats_and_skips_known_answers(tmp_path):
    one = [tmp_path / "host.xplane.pb"]
    plan = conversions.planned_conversions(one, counter_samples=True, suggestions=True)
    op_stats_group = next(group for group in plan if ("overview_page", {}) in group)
    assert ("kernel_stats", {}) in op_stats_group  # a table of op_stats: computed once, in that process
    assert [("utilization_viewer", {})] in plan and [("smart_suggestion", {})] in plan
    converters = [name for group in plan for name, _ in group]
    assert sorted(converters) == sorted(set(converters))  # each once
    lean_plan = conversions.planned_conversions(one, counter_samples=False, suggestions=False)
    lean = [name for group in lean_plan for name, _ in group]
    assert "utilization_viewer" not in lean and "smart_suggestion" not in lean and "memory_profile" in lean


def test_missing_or_empty_files_are_refused(tmp_path):
    with pytest.raises(ProfileError, match="no such file"):
        XprofViews([tmp_path / "absent.xplane.pb"])
    (tmp_path / "empty.xplane.pb").write_bytes(b"")
    with pytest.raises(ProfileError, match="empty"):
        XprofViews([tmp_path / "empty.xplane.pb"])
    with pytest.raises(ProfileError, match="no xplane files"):
        XprofViews([])


def test_conversions_that_would_not_fit_in_memory_are_not_started_and_the_views_say_why(tmp_path, monkeypatch, tpu):
    """With less memory than a conversion is estimated to need (here: a budget of 10 MiB), no XSpace conversion
    starts, in a worker or in-process, and every view it feeds answers why, with the figures; the peak-allocation
    table, read from the HLO modules alone, is still XProf's, and utilization still answers from the file's bytes
    (no counter samples to convert)."""
    monkeypatch.setenv(memory_budget.MEMORY_ENV, "0.01")
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "2")
    with XprofViews([_copy(TPU, tmp_path / "originals")]) as views:
        assert views.prefetch() == 0 and views.workers_converting == 0
        outcomes = _all_views(views)
        need = memory_budget.conversion_bytes(views.xspace_bytes)
    refused = {name for name, outcome in outcomes.items() if isinstance(outcome, conversions.ConversionTooLarge)}
    assert refused == set(VIEWS) - {"peak_allocations", "utilization"}, outcomes
    reason = str(outcomes["overview"])
    assert f"would need about {need / 2**20:.0f} MiB" in reason
    assert "more than the 10 MiB they may use (XDIAG_XPROF_MEMORY_GIB=0.01)" in reason
    assert all(str(outcomes[name]) == reason for name in refused)
    assert outcomes["peak_allocations"] == tpu.outcomes["peak_allocations"]
    # the same answer, less the device's name (the overview's)
    assert str(outcomes["utilization"]).split(" (device:")[0] == str(tpu.outcomes["utilization"]).split(" (device:")[0]
    assert all(key.startswith("memory_viewer") for key in views.conversion_counts), views.conversion_counts


def test_prefetch_starts_only_as_many_workers_as_fit_in_memory(tmp_path, monkeypatch, mi300x):
    """Room for one conversion at a time: one worker converts the groups in turn, and the views are the same."""
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "2")
    with XprofViews([_copy(MI300X, tmp_path / "originals")]) as views:
        one_and_a_half = 1.5 * memory_budget.conversion_bytes(views.xspace_bytes) / memory_budget.GIB
        monkeypatch.setenv(memory_budget.MEMORY_ENV, f"{one_and_a_half:.6f}")
        assert views.prefetch() == 1
        outcomes = _all_views(views)
        assert {"overview_page", "memory_profile"} <= set(views.worker_cpu_s)
    for view, outcome in mi300x.outcomes.items():
        assert _comparable(outcomes[view]) == _comparable(outcome), view


@pytest.mark.parametrize("fixture", ["tpu", "v100", "mi300x"])
def test_recorded_views_are_answered_as_recorded_without_converting_and_the_others_convert(fixture, request, tmp_path):
    """What register records once (xdiag.analysis.xprof.stored), through JSON as it is stored: every recorded view,
    and every recorded reason, comes back as the views gave it, with no XprofViews made and no file fetched; a view
    with other arguments converts, on the files asked for then, and is XProf's."""
    run = request.getfixturevalue(fixture)
    calls = [*stored.BROAD_CALLS, ("peak_allocations", {"module": None})]
    recorded = json.loads(json.dumps(stored.record(run.views, calls)))
    fetched: list[bool] = []
    copy = _copy({"tpu": TPU, "v100": V100, "mi300x": MI300X}[fixture], tmp_path)
    answers = stored.StoredViews(recorded, lambda: fetched.append(True) or [copy])
    for method, arguments in calls:
        try:
            outcome = getattr(answers, method)(**arguments)
        except NotAvailable as error:
            outcome = error
        assert _comparable(outcome) == _comparable(run.outcomes[method]), method
    assert answers.converted is None and not fetched
    assert _outcome(lambda: answers.kernel_stats(top_n=2)) == _outcome(lambda: run.views.kernel_stats(top_n=2))
    assert _outcome(lambda: answers.hlo_op_profile(top_n=3)) == _outcome(lambda: run.views.hlo_op_profile(top_n=3))
    assert answers.converted is not None and fetched == [True]
    answers.close()
    assert answers.converted.closed


def _loader_inputs(paths: list[Path]):
    from xdiag.cloud.memory import LocalBlobStore

    blobs = LocalBlobStore()
    return blobs, [blobs.stat(str(path)) for path in paths]


def test_a_device_sessions_conversions_start_before_the_read_and_serve_its_views(tmp_path, monkeypatch, mi300x):
    """Where one process runs every tool, the loader starts XProf's conversions before its own read (the files'
    plane names already say GPU) and the session's views are those: converted once each, in the worker, equal to
    the in-process ones."""
    from xdiag.pipeline.deps import SessionLoader
    from xdiag.analysis.xprof.session_views import views as session_views

    monkeypatch.setattr(worker, "PREFETCH_MIN_BYTES", 1)
    monkeypatch.delenv("XDIAG_XPROF_PROCESSES", raising=False)
    started = []
    real_prefetch = XprofViews.prefetch

    def recording_prefetch(self):
        started.append((self, reads[:]))
        return real_prefetch(self)

    reads: list[str] = []
    import xdiag.pipeline.deps as deps_module

    real_read = deps_module.read_session

    def recording_read(paths, **kwargs):
        reads.append(kwargs["threads"])
        return real_read(paths, **kwargs)

    monkeypatch.setattr(XprofViews, "prefetch", recording_prefetch)
    monkeypatch.setattr(deps_module, "read_session", recording_read)
    blobs, inputs = _loader_inputs([_copy(MI300X, tmp_path / "originals")])
    loader = SessionLoader(blobs, prefetch_views=True)
    try:
        session = loader.load(inputs, "s")
        assert started and started[0][1] == []  # prefetch ran before the read
        early = started[0][0]
        # the read left the workers converting meanwhile their cores
        assert early.workers_converting >= 1 and reads == [read_threads(early.workers_converting)]
        assert session_views(session) is early
        assert early.overview() == mi300x.views.overview()
        assert "overview_page" in early.worker_cpu_s and set(early.conversion_counts.values()) == {1}
        # the op_stats group (what the first view waits for) at this process's priority, memory_profile's lower
        base = os.getpriority(os.PRIO_PROCESS, 0)
        lowered = min(19, base + worker.LATER_GROUPS_NICENESS)
        workers = list(early.conversions._executor._processes)
        priorities = sorted(os.getpriority(os.PRIO_PROCESS, pid) for pid in workers)
        assert priorities == ([base, lowered] if len(priorities) == 2 else [lowered])
        assert early.memory_profile() == mi300x.views.memory_profile() and "memory_profile" in early.worker_cpu_s
        # what the wait for a worker may have computed early is what the views compute in their turn
        for view in ("peak_allocations", "roofline", "hlo_op_profile"):
            assert _outcome(getattr(early, view)) == _outcome(getattr(mi300x.views, view))
        # every conversion taken, the workers exit while the analysis goes on, before close()
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(pid) for pid in workers) and not early.closed and not early.workers_converting
    finally:
        loader.close()
    assert early.closed


def _running(pid: int) -> bool:
    """Whether the process is there and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_views_a_caller_started_before_building_the_loader_are_the_ones_its_load_adopts(tmp_path, mi300x):
    """`xdiag analyze` starts XProf's conversions as soon as the session is located, before it imports the pipeline
    (xdiag.analysis.xprof.start_views), and hands them to the loader: the load of those files takes them instead of
    starting its own; views nobody loads, or handed over twice, are closed, not leaked."""
    from xdiag.analysis.xprof import start_views
    from xdiag.pipeline.deps import SessionLoader
    from xdiag.analysis.xprof.session_views import views as session_views

    files = [_copy(MI300X, tmp_path / "originals")]
    blobs, inputs = _loader_inputs(files)
    loader = SessionLoader(blobs, prefetch_views=True)
    replaced, early = start_views(files), start_views(files)
    try:
        loader.take_views(files, replaced)
        loader.take_views(files, early)
        assert replaced.closed and not early.closed  # a second hand-over of the same files replaces the first
        session = loader.load(inputs, "s")
        assert session_views(session) is early
        assert early.overview() == mi300x.views.overview()
    finally:
        loader.close()
    assert early.closed
    unused = SessionLoader(blobs, prefetch_views=True)
    never_loaded = start_views(files)
    unused.take_views(files, never_loaded)
    unused.close()
    assert never_loaded.closed


def test_the_worker_module_imports_nothing_heavy():
    """The forkserver imports the worker module: it must import neither numpy nor xdiag's views."""
    code = (
        "import sys, xdiag.analysis.xprof.worker, xdiag.analysis.xprof.forkserver_setup; "
        "print(sorted(m for m in ('numpy', 'xdiag.analysis.xprof.views', 'xprof') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


_UNGUARDED_SCRIPT = """
import json, os, sys
from pathlib import Path
from xdiag.analysis.xprof import XprofViews
from xdiag.cloud.embedded import analyze_session
from xdiag.profile.locate import locate_session

with open(sys.argv[2], "a") as runs:  # a line each time this script runs, in any process
    runs.write(str(os.getpid()) + " ")
started = []
prefetch = XprofViews.prefetch
XprofViews.prefetch = lambda views: started.append(prefetch(views)) or started[-1]
analysis = analyze_session(locate_session(Path(sys.argv[1]), None), Path(sys.argv[3]))
print(json.dumps({"status": analysis.status, "overview": analysis.tools["get_xprof_overview"]["status"],
                  "workers": max(started, default=0)}))
"""


def test_a_script_without_a_main_guard_runs_once_while_workers_convert(tmp_path):
    """multiprocessing starts each forkserver child by running the caller's main script again. A script that calls
    analyze_session at its top level, with no `if __name__ == "__main__":`, ran its whole analysis again in every
    XProf worker; the workers must not run it, and still convert."""
    script = tmp_path / "analyse.py"
    script.write_text(_UNGUARDED_SCRIPT)
    runs = tmp_path / "runs.txt"
    env = {**os.environ, "XDIAG_XPROF_PROCESSES": "2"}  # workers for this 6.4 MiB profile too
    profile = Path(__file__).parent / "profiles" / "h200" / "recompilation.xplane.pb"
    done = subprocess.run([sys.executable, str(script), str(profile), str(runs), str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"status": "DONE", "overview": "ok", "workers": 2}
    assert len(runs.read_text().split()) == 1, runs.read_text()  # in its own process only


def test_no_conversions_start_before_the_read_of_a_cpu_profile_or_an_unreadable_file(
    tmp_path, monkeypatch, cpu_profiles
):
    from xdiag.analysis.xprof import start_views

    monkeypatch.setattr(worker, "PREFETCH_MIN_BYTES", 1)
    assert start_views([cpu_profiles["healthy"]]) is None  # plane names: /host:CPU only
    assert start_views([_copy(CORRUPT, tmp_path / "bad")]) is None  # the read says why
    gpu = _copy(MI300X, tmp_path / "big")
    assert start_views([gpu], max_bytes=gpu.stat().st_size - 1) is None  # over the limit: the read refuses it
    monkeypatch.setenv("XDIAG_XPROF_VIEWS", "0")
    assert start_views([_copy(MI300X, tmp_path / "off")]) is None


def test_as_many_workers_as_cpus_for_a_large_session_none_for_a_small_one(monkeypatch):
    monkeypatch.delenv("XDIAG_XPROF_PROCESSES", raising=False)
    big = worker.PREFETCH_MIN_BYTES
    for cpus in (1, 2, 4):
        monkeypatch.setattr(worker.os, "sched_getaffinity", lambda _pid, n=cpus: set(range(n)))
        assert worker.processes_allowed(big) == cpus
        assert worker.processes_allowed(big - 1) == 0  # small sessions convert in-process
    monkeypatch.setenv("XDIAG_XPROF_PROCESSES", "3")
    assert worker.processes_allowed(1) == 3


_ALLOCATOR_SCRIPT = """
import json, os
from concurrent.futures import ProcessPoolExecutor
from xdiag.analysis.xprof import worker

before = dict(os.environ)
worker.ensure_server()
with ProcessPoolExecutor(1, mp_context=worker.context()) as pool:
    mapped = pool.submit(worker.mapped_allocator).result()
print(json.dumps({"chosen": worker.allocator_library(), "mapped": mapped, "caller": worker.mapped_allocator(),
                  "environment_kept": dict(os.environ) == before}))
"""


@pytest.mark.parametrize("choice", ["", "system", "/nonexistent/libmalloc.so"])
def test_xprofs_workers_run_with_the_chosen_malloc_and_the_caller_keeps_its_own(choice):
    """XProf's converters spend a sixth of their time in glibc's malloc and free; their workers preload the pinned
    mimalloc unless told otherwise (`XDIAG_XPROF_ALLOCATOR`). A choice that cannot be loaded falls back to the
    system's. The caller's process and environment stay as they were. In a fresh interpreter each: the forkserver is
    one per process, and its environment is fixed when it starts."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", worker.ALLOCATOR_ENV)}
    env[worker.ALLOCATOR_ENV] = choice
    done = subprocess.run([sys.executable, "-c", _ALLOCATOR_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["environment_kept"] and report["caller"] is None
    if choice:
        assert report["chosen"] is None and report["mapped"] is None
    else:
        assert Path(report["chosen"]).name.startswith("libmimalloc.so.")
        assert os.path.realpath(report["mapped"]) == os.path.realpath(report["chosen"])


def test_an_op_profile_without_ops_says_the_kernels_ran_from_command_buffers_where_they_did(tmp_path):
    """XLA:GPU replays most of these H200 profiles' kernels from CUDA graphs (their hlo_op names a command buffer),
    and XProf's op_profile attributes none of them to an HLO op. The reason must say so, not that the profile has no
    XLA programs: it carries them, and xdiag's own op table names their kernels."""
    with XprofViews([Path(shutil.copy(H200 / "healthy.xplane.pb", tmp_path))]) as views:
        assert views.may_have_command_buffers() and views.has_metadata_plane()
        reason = _outcome(lambda: views.hlo_op_profile())
    assert reason.startswith("NotAvailable: XProf's op_profile holds no HLO ops") and "command buffers" in reason
    assert "no XLA programs" not in reason


def test_the_host_event_names_xprof_reads_are_in_its_native_library():
    """The table of names XProf's event types are looked up by was copied from the TSL xprof 2.24.2 bundles: each
    name must be a string of the wheel's converter library (a typo would let events of that name be left out)."""
    from xdiag.analysis.xprof import host_events

    assert common.xprof_version() == host_events.AUDITED_VERSION
    library = Path(common.xprof_api().package_dir) / "convert" / "profiler_plugin_c_api.so"
    strings = set(re.findall(rb"[\x20-\x7e]{4,}", library.read_bytes()))
    missing = [name for name in host_events.HOST_EVENT_TYPE_NAMES if name.encode() not in strings]
    assert not missing
    assert not host_events.xprof_ignores("TraceContext") and not host_events.xprof_ignores("ExecutorState::Process")
    assert not host_events.xprof_ignores("MemcpyHToD") and not host_events.xprof_ignores("train_step")
    assert host_events.xprof_ignores("RunInvariantCheckers")
