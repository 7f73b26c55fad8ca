"""The verdict rules every investigator's diagnosis keeps, checked in one place (the investigate stage) whoever
investigated: OPTIMAL only on a healthy snapshot (among its conditions: LOW out-of-memory risk and a measured
efficiency of the work that dominates op time), and an out-of-memory risk above LOW always a finding."""

from __future__ import annotations

import re

from xdiag.investigators.health import OOM_RISKS_ABOVE_LOW, HealthSnapshot
from xdiag.investigators.rules.memory import memory_pressure_hypothesis
from xdiag.model import Diagnosis, Status, ToolResult

_CLAIMS_OPTIMAL = re.compile(
    r"^\W*OPTIMAL\b|\b(?:is|are|looks|runs|verdict:?)\s+(?:already\s+)?OPTIMAL\b"
    r"|\b(?:workload|profile|step|session|job|program) (?:is|looks|runs) (?:healthy|optimal)\b", flags=re.IGNORECASE)
_MEMORY_KEY = re.compile(r"memory_pressure|oom|out_of_memory|(?:memory|hbm)_(?:capacity|headroom|pressure)")


def claims_optimal(text: str) -> bool:
    """Whether a summary gives the verdict OPTIMAL or calls the session healthy ("OPTIMAL: …", "the step is
    optimal", "the workload is healthy"); "not OPTIMAL" or "far from optimal" do not."""
    return bool(_CLAIMS_OPTIMAL.search(text))


def checked_verdict(diagnosis: Diagnosis, health: HealthSnapshot, results: dict[str, ToolResult]) -> Diagnosis:
    """The diagnosis with the verdict rules enforced: an OPTIMAL status on a snapshot that is not healthy becomes
    NEEDS_ATTENTION with the snapshot's reasons, and an out-of-memory risk above LOW that no finding covers gets the
    rule engine's memory_pressure finding (its largest buffers and the lever)."""
    if diagnosis.status == Status.OPTIMAL and not health.healthy:
        reasons = "; ".join(health.unhealthy_because or ["the health snapshot is not clean"])
        diagnosis.status = Status.NEEDS_ATTENTION
        diagnosis.summary = f"Not OPTIMAL: {reasons}."
        diagnosis.investigator_note = "; ".join(
            x for x in (diagnosis.investigator_note, f"its verdict OPTIMAL was refused: {reasons}") if x)
    if health.oom_risk in OOM_RISKS_ABOVE_LOW and not any(_MEMORY_KEY.search(f.key) for f in diagnosis.findings):
        pressure = memory_pressure_hypothesis(health, results)
        if pressure is not None:
            diagnosis.findings.append(pressure.finding())
            diagnosis.findings.sort(key=lambda f: f.priority)  # stable: the investigator's order within a priority
    return diagnosis
