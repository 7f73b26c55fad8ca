"""End to end on real profiles: each bundled workload's known problem is the top finding."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.investigators import MAX_FOLLOW_UP_CALLS
from xdiag.model import Analysis, Status
from xdiag.profile.locate import locate_session
from xdiag.tools import REGISTRY
from xdiag.examples import WORKLOADS

H200 = Path(__file__).resolve().parent / "profiles" / "h200"
NOT_CAPTURED_ON_H200 = {"widened_statistics": "written after the H200 captures (2026-12), with no GPU to capture "
                                              "it on since"}
# One GPU: no collectives, no second process (tests/profiles/README.md).
H200_WORKLOADS = [w for w, spec in WORKLOADS.items()
                  if spec.needs_devices == 1 and spec.processes == 1 and w not in NOT_CAPTURED_ON_H200]


def _analyze(path, tmp_path) -> Analysis:
    return analyze_session(locate_session(path), tmp_path / "out")


def _check(analysis: Analysis, expected: str) -> None:
    assert analysis.status == "DONE", analysis.failure_reason
    diagnosis = analysis.diagnosis
    if expected == "optimal":
        assert diagnosis.status == Status.OPTIMAL, [f.title for f in diagnosis.findings]
        assert diagnosis.follow_up_calls == [], "a healthy workload needs no follow-up tool calls"
        assert analysis.health["healthy"] is True
        return
    assert diagnosis.status == Status.NEEDS_ATTENTION
    top = diagnosis.findings[0]
    assert top.key == expected, f"top finding {top.key!r}; all: {[(f.key, f.priority) for f in diagnosis.findings]}"
    assert top.priority in ("P0", "P1")
    assert top.evidence and all(e.tool in REGISTRY for e in top.evidence)
    assert top.whats_happening and top.expected_impact and top.fix
    made = [c for c in diagnosis.follow_up_calls if not (c.reason or "").startswith("refused")]
    assert len(made) <= MAX_FOLLOW_UP_CALLS


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_cpu_workload_problem_is_the_top_finding(workload, cpu_profiles, tmp_path):
    _check(_analyze(cpu_profiles[workload], tmp_path), WORKLOADS[workload].expected_on("CPU"))


def test_every_single_gpu_workload_has_an_h200_capture_or_says_why_not():
    captured = {p.name.removesuffix(".xplane.pb") for p in H200.glob("*.xplane.pb")}
    assert captured == set(H200_WORKLOADS) and not captured & set(NOT_CAPTURED_ON_H200)


@pytest.mark.parametrize("workload", H200_WORKLOADS)
def test_h200_workload_problem_is_the_top_finding(workload, h200_profiles, tmp_path):
    _check(_analyze(h200_profiles[workload], tmp_path), WORKLOADS[workload].expected_on("GPU"))


def test_evidence_points_at_the_right_ops(cpu_profiles, h200_profiles, tmp_path):
    layout = _analyze(cpu_profiles["layout_transpose"], tmp_path / "a").diagnosis.findings[0]
    assert any("transpose" in str(e.metric) + str(e.value) for e in layout.evidence)
    # On GPU the widening is fused into the reductions (nothing widened is written): the CPU capture has the copy.
    convert = _analyze(cpu_profiles["widening_convert"], tmp_path / "b").diagnosis.findings[0]
    assert any("bf16->f32" in f"{e.value}" or "bf16" in f"{e.note}" for e in convert.evidence) or "bf16->f32" in convert.whats_happening
    collectives = _analyze(cpu_profiles["collective_bound"], tmp_path / "c").diagnosis.findings[0]
    assert any(e.metric.startswith("top collective") for e in collectives.evidence)


def test_collective_fix_follows_what_the_top_collective_shows(cpu_profiles, tmp_path):
    # collective_dominated all-reduces its gradients once per micro-batch (2) inside a scan, with a 4 MB extra buffer
    top = _analyze(cpu_profiles["collective_dominated"], tmp_path).diagnosis.findings[0]
    assert top.key == "collectives"
    assert "2 times per device and step inside a loop" in top.fix and "reduce once per step" in top.fix
    assert "f32[1048576] carries" in top.fix


def _rows(value):
    """Every dict inside a tool's JSON answer (its summary, detail rows, nested tables)."""
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _rows(v)
    elif isinstance(value, list):
        for v in value:
            yield from _rows(v)


def _same(a, b) -> bool:
    return (isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float))
            and not isinstance(b, bool) and abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b)))


def _where_the_evidence_says(outputs: list[dict], metric: str, value) -> bool:
    """The value sits where the metric names it: under the key `metric` (or its dotted path from the summary);
    for "events matching ..." in the summary's `matches` ("outermost events matching ...": `outermost_matches`); for "<op or name> <field>" (or "top op <op>") in the row
    that names that op. A number that merely occurs somewhere in the answer does not count."""
    for output in outputs:
        summary = output.get("summary") or {}
        node = summary
        for part in metric.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if _same(node, value):
            return True
        if metric.startswith("events matching ") and _same(summary.get("matches"), value):
            return True
        if metric.startswith("outermost events matching ") and _same(summary.get("outermost_matches"), value):
            return True
        words = set(metric.split())
        for row in _rows(output):
            if _same(row.get(metric), value):
                return True
            named = any(isinstance(v, str) and v in words for v in row.values())
            if named and any(_same(v, value) for k, v in row.items() if k in words or metric.startswith("top ")):
                return True
    return False


@pytest.mark.parametrize("workload", ["input_bound", "host_sync", "memory_bound", "layout_transpose"])
def test_findings_quote_numbers_from_tool_outputs(workload, tmp_path):
    """Every number a finding quotes is in the output of the tool it names, at the place its metric names, the
    follow-up calls' outputs (tools/followup-N-<tool>.json) included; committed TPU v5e profiles (deterministic)."""
    import json

    analysis = _analyze(Path(__file__).resolve().parent / "profiles" / "tpu_v5e" / f"{workload}.xplane.pb", tmp_path)
    outputs: dict[str, list[dict]] = {}
    for path in sorted((tmp_path / "out" / "tools").glob("*.json")):
        answer = json.loads(path.read_text())
        outputs.setdefault(answer["tool"], []).append(answer)
    quoted = 0
    for finding in analysis.diagnosis.findings:
        for evidence in finding.evidence:
            if isinstance(evidence.value, bool) or not isinstance(evidence.value, (int, float)):
                continue
            assert evidence.tool in outputs, (finding.key, evidence)
            assert _where_the_evidence_says(outputs[evidence.tool], evidence.metric, evidence.value), (
                finding.key, evidence)
            quoted += 1
    assert quoted >= 3, "too few quoted numbers to check"
