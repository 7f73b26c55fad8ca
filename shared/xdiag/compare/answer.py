"""The comparison as an agent reads it (MCP `diff_sessions`): diff.json's answer, each fact once.

What diff.json holds twice or for a page is left out: the raw step times and the test's method (the interval says
what they gave), the mean over every step (`step_time`: the step test's means are the ones the verdict reads), the
findings diff's gone, changed and kept (the outcomes say each baseline finding's fate), the kernels where there are
none, the schema's version. Field names are diff.json's.
"""

from __future__ import annotations

from typing import Any

from xdiag.compare.sessions import SessionDiff

LEFT_OUT: dict[str, Any] = {
    "version": True,
    "refused_because": True,  # a refusal is no answer: the caller says it instead
    "step_time": True,
    "step_test": {"method": True, "baseline": {"step_ms"}, "candidate": {"step_ms"}},
    "findings": {"gone", "changed", "kept"},
    # an op row's list says its status; its runs and modules are the report's (the agent decides on time moved)
    "ops": {side: {"__all__": {"status", "modules", "baseline_runs_per_step", "candidate_runs_per_step"}}
            for side in ("slower", "faster", "appeared", "gone")},
}


def agent_answer(diff: SessionDiff) -> dict[str, Any]:
    """verdict, headline, step_test (each side's steps used, mean and interval; the change, its 95% interval, z,
    the realized gain), outcomes (each baseline finding: gone | smaller | unchanged | larger, its predicted stake
    beside the realized gain), lines (the user's lines whose device time moved), baseline and candidate (each
    session, platform, device, report), breakdown, ops, kernels (where there are any), memory_peak, findings
    (those that appeared)."""
    left_out = dict(LEFT_OUT)
    if not diff.kernels.available:
        left_out["kernels"] = True
    return diff.model_dump(mode="json", exclude=left_out)
