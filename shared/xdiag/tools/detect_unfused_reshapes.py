"""detect_unfused_reshapes: which pure data-movement ops run as kernels of their own?"""

from __future__ import annotations

from xdiag.analysis.categories import DATA_MOVEMENT_OPCODES
from xdiag.analysis.executed_ops import ExecutedInstruction
from xdiag.cost.hlo import shape_bytes
from xdiag.profile.space import Session
from xdiag.tools.hlo_checks import detect
from xdiag.tools.registry import ToolOutput, tool

_MOVES = DATA_MOVEMENT_OPCODES - {"copy-start", "copy-done", "iota"}


@tool(
    "detect_unfused_reshapes",
    "Reshape, transpose, copy, broadcast, slice and similar data-movement ops left unfused (run as their own "
    "op or as a fusion of nothing else), with their bytes and share of op time.",
)
def detect_unfused_reshapes(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, ops_with_hlo, op_time_with_hlo_percent (the ops the HLO names, and their share of op time), top_op, top_op_shape, top_op_opcodes. detail: ops (top 20)."""
    return detect(session, _unfused_move, lambda top: {"top_op_shape": top["shape"], "top_op_opcodes": top["opcodes"]})


def _unfused_move(e: ExecutedInstruction, total_ps: int) -> dict | None:
    ins = e.instruction
    fused = e.fused_opcodes()
    if ins.opcode in _MOVES:
        kinds = {ins.opcode}
    elif ins.opcode == "fusion" and fused and fused <= _MOVES:
        kinds = fused
    else:
        return None
    operands = e.operands()
    return e.row(
        total_ps, opcodes=sorted(kinds), shape=ins.shape_text, operand_shapes=[o.shape_text for o in operands],
        bytes_per_run=shape_bytes(ins) + sum(shape_bytes(o) for o in operands),
    )
