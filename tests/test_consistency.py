"""One account of time in every report: the findings, their impact and the summary agree with the breakdown.

Runs over every profile the tests have: the CPU workloads the suite captures, every committed profile under
tests/profiles/ (new folders are picked up as they land) and the shared profiles beside the checkout.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.investigators.health import OOM_RISKS_ABOVE_LOW, HealthSnapshot, efficiency_not_measured
from xdiag.model import Analysis
from xdiag.profile.locate import locate_session
from xdiag.examples import WORKLOADS

from tests.conftest import SHARED_PROFILES, TESTS

COMMITTED = sorted(p for p in (TESTS / "profiles").glob("*/*.xplane.pb") if p.parent.name != "hostile")  # refused by design: test_fuzz
SHARED = sorted(p for p in SHARED_PROFILES.glob("*/*.xplane.pb") if p.parent.name != "bad")

# Which findings explain which share of the breakdown (a finding may explain several).
EXPLAINS = {
    "collective": {"collectives", "straggler_host"},
    "transfer": {"memory_transfers"},
    "compile": {"recompilation", "recompile_per_shape"},
    "warm_up": {"warm_up"},
    "host_sync": {"host_sync", "low_utilization", "python_loop_of_calls", "callback_in_step", "eager_ops"},
    "dispatch": {"dispatch_overhead", "low_utilization", "unfused_kernels", "python_loop_of_calls", "eager_ops"},
    "host_other": {"input_bound", "dispatch_overhead", "low_utilization", "straggler_host", "device_idle",
                   "unfused_kernels", "python_loop_of_calls", "eager_ops", "callback_in_step"},
}
NOT_TIME_FINDINGS = {"memory_pressure"}
PLACEHOLDER = re.compile(r"\(\?\)|shape \?|\bNone\b|\bnan\b|\bundefined\b")
# Words that only belong to another platform's or framework's advice.
FOREIGN_WORDS = {
    "GPU": ("offload", "MXU", "pltpu", "TPU"),
    "TPU": ("CUDA", "cuDNN", "cuBLAS", "ROCm", "MIOpen", "hipBLASLt"),
    "CPU": ("CUDA", "cuDNN", "ROCm", "MIOpen", "MXU", "offload"),
    "AMD": ("cuDNN", "cuBLAS", "Tensor Core", "CUDA"),
    "NVIDIA": ("MIOpen", "ROCm", "hipBLASLt"),
    "TensorFlow": ("jax.jit", "jnp.", "lax."),
    "JAX": ("tf.function", "torch."),
}


def _analysis(path: Path, tmp_path: Path) -> tuple[Analysis, dict[str, dict], str]:
    """The analysis, its broad tools' summaries (those that answered, and the op profile's rows as `op_rows`) and
    the text of its summary.html."""
    out = tmp_path / "out"
    analysis = analyze_session(locate_session(path), out)
    assert analysis.status == "DONE", analysis.failure_reason
    tools = {}
    for file in (out / "tools").glob("*.json"):
        result = json.loads(file.read_text())
        if result.get("status") == "ok" and not file.name.startswith("followup-"):
            tools[file.stem] = result.get("summary") or {}
            if file.stem == "get_hlo_op_profile":
                tools["op_rows"] = (result.get("detail") or {}).get("ops") or []
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", (out / "summary.html").read_text(), flags=re.S)
    return analysis, tools, html.unescape(re.sub(r"<[^>]+>", " ", page))


def _scores(analysis: Analysis) -> dict[str, float]:
    """Finding key -> its score (share of step time at stake), from the hypotheses list the investigator keeps."""
    by_title = {}
    for line in analysis.diagnosis.hypotheses:
        match = re.match(r"(.*) \(score ([\d.]+)\)$", line)
        if match:
            by_title[match.group(1)] = float(match.group(2))
    return {f.key: by_title[f.title] for f in analysis.diagnosis.findings if f.title in by_title}


def check_report(analysis: Analysis, tools: dict[str, dict], page: str) -> list[str]:
    """Every contradiction between the report's account of time and its findings, as sentences."""
    problems: list[str] = []
    health, diagnosis = analysis.health, analysis.diagnosis
    breakdown = health.get("breakdown_percent") or {}
    findings = diagnosis.findings
    scores = _scores(analysis) if diagnosis.investigator == "rules" else {}
    keys = {f.key for f in findings}

    # The top finding names the largest non-compute share, or stakes more of the step than it.
    shares = {k: v or 0.0 for k, v in breakdown.items() if k in EXPLAINS}
    if findings and shares:
        largest = max(shares, key=shares.get)
        top = findings[0]
        if shares[largest] >= 5 and top.key not in EXPLAINS[largest] and scores.get(top.key, 100) < shares[largest]:
            problems.append(f"top finding {top.key} ({scores.get(top.key)}% of the step) is below the largest "
                            f"non-compute share, {largest} {shares[largest]}%, and does not name it")

    for f in findings:
        score = scores.get(f.key)
        # No finding under 1% of the step.
        if score is not None and f.key not in NOT_TIME_FINDINGS and score < 1.0:
            problems.append(f"finding {f.key} stakes {score}% of the step (< 1%)")
        # The impact is bounded by the time the finding names.
        said = re.search(r"up to (\d+)% shorter steps", f.expected_impact, flags=re.I)
        if said and score is not None and int(said.group(1)) > round(score) + 1:
            problems.append(f"finding {f.key} promises {said.group(1)}% shorter steps for {score}% of the step at stake")
        text = " ".join([f.title, f.whats_happening, f.expected_impact, f.fix,
                         *(f"{e.metric} {e.value} {e.note}" for e in f.evidence)])
        if PLACEHOLDER.search(text):
            problems.append(f"finding {f.key} holds a placeholder: {PLACEHOLDER.search(text).group(0)!r}")
        for context in _contexts(tools):
            for word in FOREIGN_WORDS.get(context, ()):
                if word in f.whats_happening + f.fix:
                    problems.append(f"finding {f.key} speaks of {word!r} on a {context} profile")
    if PLACEHOLDER.search(diagnosis.summary):
        problems.append(f"the summary holds a placeholder: {PLACEHOLDER.search(diagnosis.summary).group(0)!r}")
    for phrase in ("(?)", "shape ?"):
        if phrase in page:
            problems.append(f"summary.html shows {phrase!r}")

    # A health flag is a finding, or the report says why it is not.
    said_why = "Not findings:" in diagnosis.summary
    if health.get("memory_bound_is_defect") and "memory_bound" not in keys and not said_why:
        problems.append("the op profile flags a memory-bound defect, with no finding and no reason why not")
    efficiency = health.get("dominant_ops_roofline_efficiency_percent")
    if (efficiency is not None and efficiency < 30 and not keys & {"low_kernel_efficiency", "memory_bound", "memory_transfers"}
            and not said_why):
        problems.append(f"the busiest ops run at {efficiency}% of their roof, with no finding and no reason why not")

    # OPTIMAL needs LOW out-of-memory risk and a measured efficiency; a risk above LOW is always a finding.
    if health.get("oom_risk") in OOM_RISKS_ABOVE_LOW and "memory_pressure" not in keys:
        problems.append(f"out-of-memory risk {health['oom_risk']} with no memory_pressure finding")
    if diagnosis.status.value == "OPTIMAL" and health.get("oom_risk") in OOM_RISKS_ABOVE_LOW:
        problems.append(f"OPTIMAL with out-of-memory risk {health['oom_risk']}")
    if diagnosis.status.value == "OPTIMAL" and efficiency_not_measured(HealthSnapshot.from_dict(health)):
        problems.append(f"OPTIMAL though {efficiency_not_measured(HealthSnapshot.from_dict(health))}")

    # No rate above a hardware peak is shown as a measurement, and a custom kernel holding a fifth of op time is
    # costed (FLOPs and bytes) or has a stated floor.
    peak_gb_s = (tools.get("get_hlo_op_profile") or {}).get("peak_hbm_gb_per_s")
    for row in tools.get("op_rows", []):
        if (peak_gb_s and (row.get("achieved_gb_per_s") or 0) > 1.05 * peak_gb_s
                or (row.get("roofline_efficiency_percent") or 0) > 100) and not row.get("not_a_measurement"):
            problems.append(f"{row['op']} is shown at {row.get('achieved_gb_per_s')} GB/s, "
                            f"{row.get('roofline_efficiency_percent')}% of its roof, as a measurement")
        if row.get("opcode") == "custom-call" and row["share_of_op_time_percent"] >= 20:
            if not (row.get("flops_per_run") is not None and row.get("bytes_per_run")) and not row.get("achieved_gb_per_s_floor"):
                problems.append(f"custom kernel {row['op']} holds {row['share_of_op_time_percent']}% of op time with "
                                "neither FLOPs and bytes nor a floor")

    # One value per fact: the devices' busy share is the same number in every tool that reports it.
    step = tools.get("get_step_trace") or {}
    busy = {
        "get_step_trace.device_busy_percent_mean": step.get("device_busy_percent_mean"),
        "get_utilization_viewer.busy_percent_mean": (tools.get("get_utilization_viewer") or {}).get("busy_percent_mean"),
        "100 - get_step_trace.device_idle_percent": 100 - step["device_idle_percent"] if "device_idle_percent" in step else None,
    }
    values = {k: v for k, v in busy.items() if v is not None}
    if values and max(values.values()) - min(values.values()) > 0.05:
        problems.append(f"device busy has several values: {values}")
    # The key card's device idle and the busy parts it names make the whole step (copies only the host's lines show
    # leave the devices idle: they are not a busy part).
    for busy_text in re.findall(r"of step time; busy the rest: ((?:[a-z]+ [\d.]+% \+ )*[a-z]+ [\d.]+%)", page):
        parts = [float(v) for v in re.findall(r"([\d.]+)%", busy_text)]
        idle = health.get("device_idle_percent")
        if idle is not None and abs(idle + sum(parts) - 100) > 0.25:
            problems.append(f"device idle {idle}% and busy {busy_text!r} do not make the step")
    compute = breakdown.get("compute")
    for quoted in re.findall(r"devices compute ([\d.]+)%", diagnosis.summary + " ".join(f.whats_happening for f in findings)):
        if compute is not None and abs(float(quoted) - compute) > 0.05:
            problems.append(f"devices compute {quoted}% in the text, {compute}% in the breakdown")
    return problems


def _contexts(tools: dict[str, dict]) -> list[str]:
    """The platform, vendor and framework the profile came from (get_device_information)."""
    info = tools.get("get_device_information") or {}
    return [c for c in (info.get("platform"), info.get("vendor"), info.get("framework")) if c]


def _assert_consistent(path: Path, tmp_path: Path) -> None:
    analysis, tools, page = _analysis(path, tmp_path)
    problems = check_report(analysis, tools, page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_cpu_workload_report_has_one_account_of_time(workload, cpu_profiles, tmp_path):
    _assert_consistent(cpu_profiles[workload], tmp_path)


@pytest.mark.parametrize("profile", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_profile_report_has_one_account_of_time(profile, tmp_path):
    _assert_consistent(profile, tmp_path)


@pytest.mark.parametrize("profile", SHARED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_shared_profile_report_has_one_account_of_time(profile, tmp_path):
    _assert_consistent(profile, tmp_path)
