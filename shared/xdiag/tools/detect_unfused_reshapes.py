"""detect_unfused_reshapes: which pure data-movement ops run as kernels of their own?"""

from __future__ import annotations

from xdiag.errors import NotAvailable
from xdiag.hlo_cost import shape_bytes
from xdiag.profile.space import Session
from xdiag.timeline import DATA_MOVEMENT_OPCODES
from xdiag.tools.hlo_checks import executed_instructions, hlo_coverage
from xdiag.tools.registry import ToolOutput, tool

_STRUCTURAL = {"parameter", "bitcast", "tuple", "get-tuple-element", "constant"}
_MOVES = DATA_MOVEMENT_OPCODES - {"copy-start", "copy-done", "iota"}


@tool(
    "detect_unfused_reshapes",
    "Reshape, transpose, copy, broadcast, slice and similar data-movement ops left unfused (run as their own "
    "op or as a fusion of nothing else), with their bytes and share of op time.",
)
def detect_unfused_reshapes(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, bytes_per_step_estimate, top_op. detail: ops (top 20)."""
    executed, total_ps = executed_instructions(session)
    if not executed:
        raise NotAvailable("no executed op could be matched to HLO carried in the profile")
    found = []
    for e in executed:
        ins = e.instruction
        if ins.opcode in _MOVES:
            kinds = [ins.opcode]
        elif ins.opcode == "fusion":
            fused = [i.opcode for i in e.fused() if i.opcode not in _STRUCTURAL]
            kinds = fused if fused and all(k in _MOVES for k in fused) else []
        else:
            kinds = []
        if not kinds:
            continue
        operands = e.operands()
        found.append(
            {
                "op": e.stat.name, "module": e.module.display_name, "opcodes": sorted(set(kinds)),
                "shape": ins.shape_text, "operand_shapes": [o.shape_text for o in operands],
                "bytes_per_run": shape_bytes(ins) + sum(shape_bytes(o) for o in operands),
                "count": e.stat.count, "total_ms": round(e.stat.total_ms, 4),
                "share_of_op_time_percent": round(100 * e.stat.total_ps / total_ps, 2) if total_ps else 0.0,
                "framework_op": ins.op_name,
            }
        )
    found.sort(key=lambda r: -r["total_ms"])
    summary = {
        "count": len(found),
        "total_ms": round(sum(r["total_ms"] for r in found), 4),
        "share_of_op_time_percent": round(sum(r["share_of_op_time_percent"] for r in found), 2),
        **hlo_coverage(session),
    }
    if found:
        summary.update(top_op=found[0]["op"], top_op_shape=found[0]["shape"], top_op_opcodes=found[0]["opcodes"])
    return ToolOutput(summary, {"ops": found[:20]}, "HLO carried in the profile, joined with op times")
