"""What the three detect_* tools share: a check run over the executed ops joined with their HLO instructions
(xdiag.analysis.executed_ops)."""

from __future__ import annotations

from collections.abc import Callable

from xdiag.analysis.executed_ops import ExecutedInstruction, executed_instructions, hlo_coverage
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.registry import ToolOutput

SOURCE = "HLO carried in the profile, joined with op times"


def detect(
    session: Session,
    finding: Callable[[ExecutedInstruction, int], dict | None],
    top_fields: Callable[[dict], dict],
) -> ToolOutput:
    """Runs `finding` over every executed op with HLO; the rows it returns, busiest first, make the output."""
    executed, total_ps = executed_instructions(session)
    if not executed:
        raise NotAvailable("no executed op could be matched to HLO carried in the profile")
    found = [row for row in (finding(e, total_ps) for e in executed) if row]
    found.sort(key=lambda r: -r["total_ms"])
    summary = {
        "count": len(found),
        "total_ms": round(sum(r["total_ms"] for r in found), 4),
        "share_of_op_time_percent": round(sum(r["share_of_op_time_percent"] for r in found), 2),
        **hlo_coverage(session),
    }
    if found:
        summary.update(top_op=found[0]["op"], **top_fields(found[0]))
    return ToolOutput(summary, {"ops": found[:20]}, SOURCE)
