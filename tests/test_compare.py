"""`xdiag diff`: two real analysed sessions compared from their own tool outputs (H200 captures of two bundled
workloads, analysed by the embedded default), diff.json and diff.html, and the command line. The before/after pair
of one workload and its fix is compared on the local stack in test_viewer_stack.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.cloud.memory import LocalBlobStore
from xdiag.compare.html import render_diff_html, write_diff
from xdiag.compare.outputs import load_outputs
from xdiag.compare.sessions import compare_sessions
from xdiag.profile.locate import locate_session


@pytest.fixture(scope="module")
def analysed(h200_profiles, tmp_path_factory) -> dict[str, Path]:
    """host_sync and healthy, each analysed into its own folder."""
    out = tmp_path_factory.mktemp("analyses")
    folders = {}
    for name in ("host_sync", "healthy"):
        analysis = analyze_session(locate_session(h200_profiles[name], None), out / name)
        assert analysis.status == "DONE", analysis.failure_reason
        folders[name] = out / name
    return folders


def _outputs(folder: Path, label: str):
    return load_outputs(LocalBlobStore(), str(folder), label)


def test_the_step_time_change_is_the_difference_of_the_two_step_traces(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    diff = compare_sessions(before, after)
    a, b = before.tools["get_step_trace"]["summary"], after.tools["get_step_trace"]["summary"]
    assert diff.step_time.baseline == pytest.approx(a["step_time_ms_mean"])
    assert diff.step_time.candidate == pytest.approx(b["step_time_ms_mean"])
    assert diff.step_time.delta == pytest.approx(b["step_time_ms_mean"] - a["step_time_ms_mean"], abs=1e-3)
    assert diff.verdict == ("faster" if diff.step_time.delta < 0 else "slower")
    # the categories' changes add up to the step-time change
    assert sum(c.delta_ms for c in diff.breakdown) == pytest.approx(diff.step_time.delta, rel=0.02)
    host_sync = next(c for c in diff.breakdown if c.category == "host_sync")
    assert host_sync.baseline_ms == pytest.approx(a["step_time_ms_mean"] * a["host_sync_percent"] / 100, rel=1e-3)


def test_ops_are_compared_per_step_and_the_diagnosis_itself_is_diffed(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    diff = compare_sessions(before, after, top=1000)
    ops_a = {o["op"] for o in before.tools["get_hlo_op_profile"]["detail"]["ops"]}
    ops_b = {o["op"] for o in after.tools["get_hlo_op_profile"]["detail"]["ops"]}
    assert {c.name for c in diff.ops.gone} == ops_a - ops_b
    assert {c.name for c in diff.ops.appeared} == ops_b - ops_a
    steps = before.tools["get_step_trace"]["summary"]["steps"]
    for change in diff.ops.gone:  # an op's time per step: its executions' total (over every module) / steps
        total = sum(o["total_ms"] for o in before.tools["get_hlo_op_profile"]["detail"]["ops"] if o["op"] == change.name)
        assert change.baseline_ms_per_step == pytest.approx(total / steps, rel=1e-3, abs=1e-6)
    keys_a = {f["key"] for f in before.analysis["diagnosis"]["findings"]}
    keys_b = {f["key"] for f in after.analysis["diagnosis"]["findings"]}
    assert {f.key for f in diff.findings.gone} == keys_a - keys_b and keys_a - keys_b
    assert {f.key for f in diff.findings.appeared} == keys_b - keys_a
    assert diff.findings.baseline_status == "NEEDS_ATTENTION"
    # GPU profiles carry device memory: the peak is compared, from each side's memory profile
    peak_a = before.tools["get_memory_profile"]["summary"]["peak_memory_gib"]
    peak_b = after.tools["get_memory_profile"]["summary"]["peak_memory_gib"]
    assert diff.memory_peak.available and diff.memory_peak.delta == pytest.approx(peak_b - peak_a, abs=1e-3)


def test_missing_data_is_said_with_the_tool_s_reason_never_a_number(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    after.tools["get_memory_profile"] = {"status": "not_available", "reason": "no allocator events", "summary": {}}
    del before.tools["get_step_trace"]
    diff = compare_sessions(before, after)
    assert not diff.step_time.available and diff.step_time.baseline is None and "get_step_trace" in diff.step_time.reason
    assert diff.verdict == "not_comparable" and diff.breakdown == []
    assert not diff.memory_peak.available and "no allocator events" in diff.memory_peak.reason
    assert not diff.kernels.available or diff.kernels.source == "get_kernel_stats"


def test_diff_html_is_self_contained_and_escapes_profile_text(analysed, tmp_path):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    before.tools["get_hlo_op_profile"]["detail"]["ops"][0]["op"] = "<script>alert(1)</script>"
    diff = compare_sessions(before, after, top=1000)
    html = render_diff_html(diff)
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    json_path, html_path = write_diff(diff, tmp_path / "d")
    assert json.loads(json_path.read_text())["verdict"] == diff.verdict and html_path.read_text() == html


def test_xdiag_diff_on_two_analysis_folders_writes_diff_html_and_json(analysed, tmp_path):
    answer = subprocess.run([sys.executable, "-m", "xdiag.cli", "diff", str(analysed["host_sync"]),
                             str(analysed["healthy"]), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stderr
    assert Path(answer.stdout.strip()) == tmp_path / "out" / "diff.html"
    written = json.loads((tmp_path / "out" / "diff.json").read_text())
    assert written["baseline"]["session_id"] and written["headline"][0] in answer.stderr.replace("\n", " ")


def test_xdiag_report_of_an_analysis_folder_prints_its_summary(analysed):
    answer = subprocess.run([sys.executable, "-m", "xdiag.cli", "report", str(analysed["healthy"])],
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert Path(answer.stdout.strip()) == (analysed["healthy"] / "summary.html").absolute()
