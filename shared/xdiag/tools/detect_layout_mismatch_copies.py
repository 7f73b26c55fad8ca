"""detect_layout_mismatch_copies: how much time goes to copies and transposes that only change layout?"""

from __future__ import annotations

from math import prod

from xdiag.errors import NotAvailable
from xdiag.hlo_cost import shape_bytes
from xdiag.profile.space import HloInstruction, Session
from xdiag.tools.hlo_checks import executed_instructions, hlo_coverage
from xdiag.tools.registry import ToolOutput, tool

_STRUCTURAL = {"parameter", "bitcast", "tuple", "get-tuple-element", "constant"}


def _layout_only(ins: HloInstruction, operand: HloInstruction | None) -> str | None:
    """Why `ins` only moves data into another layout, or None when it does more."""
    if ins.opcode == "transpose":
        return "transpose: same elements, permuted dimensions"
    if ins.opcode == "copy" and operand is not None and operand.dims and prod(operand.dims) == prod(ins.dims):
        if operand.layout and ins.layout and operand.layout != ins.layout:
            return f"copy from layout {{{','.join(map(str, operand.layout))}}} to {{{','.join(map(str, ins.layout))}}}"
        if sorted(operand.dims) == sorted(ins.dims) and operand.dims != ins.dims:
            return "copy into permuted dimensions"
    return None  # a same-layout copy moves data but changes no layout: detect_unfused_reshapes reports it
    return None


@tool(
    "detect_layout_mismatch_copies",
    "Copies and transposes that only change an array's layout (same elements, permuted dimensions or a "
    "different minor-to-major order), with their shapes, bytes moved and share of op time.",
)
def detect_layout_mismatch_copies(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, top_op, top_op_shape. detail: ops (top 20)."""
    executed, total_ps = executed_instructions(session)
    if not executed:
        raise NotAvailable("no executed op could be matched to HLO carried in the profile")
    found = []
    for e in executed:
        ins = e.instruction
        if ins.opcode in ("copy-start", "copy-done"):
            continue  # async copies between memory spaces, not layout changes
        reason, subject = None, ins
        if ins.opcode in ("copy", "transpose"):
            operands = e.operands()
            reason = _layout_only(ins, operands[0] if operands else None)
        elif ins.opcode == "fusion":
            fused = [i for i in e.fused() if i.opcode not in _STRUCTURAL]
            if fused and all(i.opcode in ("copy", "transpose") for i in fused):
                inner = {i.name: i for i in e.fused()}
                subject = fused[-1]
                reason = _layout_only(subject, inner.get(subject.operands[0]) if subject.operands else None)
                reason = f"fusion of only {', '.join(sorted({i.opcode for i in fused}))}: {reason}" if reason else None
        if reason:
            operands = e.operands()
            found.append(
                {
                    "op": e.stat.name, "module": e.module.display_name, "opcode": ins.opcode, "why": reason,
                    "shape": ins.shape_text, "operand_shapes": [o.shape_text for o in operands],
                    "bytes_moved_per_run": shape_bytes(ins) + sum(shape_bytes(o) for o in operands),
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
        summary.update(top_op=found[0]["op"], top_op_shape=found[0]["shape"], top_op_why=found[0]["why"])
    return ToolOutput(summary, {"ops": found[:20]}, "HLO carried in the profile, joined with op times")
