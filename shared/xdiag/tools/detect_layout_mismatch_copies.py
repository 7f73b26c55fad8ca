"""detect_layout_mismatch_copies: how much time goes to copies and transposes that only change layout?"""

from __future__ import annotations

from math import prod

import numpy as np

from xdiag.analysis.op_table import op_table, profile_op_costs
from xdiag.analysis.session_cache import cached
from xdiag.cost.hlo import shape_bytes
from xdiag.profile.space import HloInstruction, Session
from xdiag.tools.hlo_checks import STRUCTURAL_OPCODES, ExecutedInstruction, detect
from xdiag.tools.registry import ToolOutput, tool


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


@tool(
    "detect_layout_mismatch_copies",
    "Copies and transposes that only change an array's layout (same elements, permuted dimensions or a "
    "different minor-to-major order), with their shapes, bytes moved and share of op time.",
)
def detect_layout_mismatch_copies(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, ops_with_hlo, op_time_with_hlo_percent, top_op, top_op_shape, top_op_why,
    top_op_next_to_convolution (the transpose feeds or follows a convolution: the conv's layout asks for it);
    xprof_data_formatting_percent and counted_ops_note where the profile files ops in XProf's categories (TPU).
    detail: ops (top 20, each with next_to_convolution)."""
    out = detect(session, _layout_copy, lambda top: {"top_op_shape": top["shape"], "top_op_why": top["why"],
                                                     "top_op_next_to_convolution": top["next_to_convolution"]})
    formatting = _xprof_data_formatting_percent(session)
    if formatting is not None:
        counted = out.summary["share_of_op_time_percent"]
        out.summary["xprof_data_formatting_percent"] = formatting
        out.summary["counted_ops_note"] = (
            f"counted: copies and transposes whose result is laid out differently from their input ({counted}% of op "
            f"time); XProf's 'data formatting' ({formatting}%) is a category of every copy, transpose and reshape op, "
            "also those that move data without re-laying it (a value copied into another buffer in the same layout), "
            "which detect_unfused_reshapes reports")
    return out


def _xprof_data_formatting_percent(session: Session) -> float | None:
    """Share of device op time in ops the profile's own cost model files as 'data formatting' (TPU); None where
    the profile records no op categories."""
    found = cached(session, "data_formatting", lambda: combined_data_formatting([data_formatting_ps(session)]))
    return round(100 * found[0] / found[1], 2) if found is not None and found[1] else None


def data_formatting_ps(session: Session) -> dict:
    """Device op time in ops the profile's cost model files as 'data formatting', of all device op time, and whether
    the profile records op categories at all: what the share is of, per host (combined_data_formatting)."""
    ops = op_table(session)
    costs = profile_op_costs(session)
    per_op = np.bincount(ops.op, weights=ops.duration_ps.astype(float), minlength=len(ops.op_keys))
    formatting = sum(ps for (module, _, name, *_), ps in zip(ops.op_keys, per_op)
                     if costs.get((module, name), {}).get("hlo_category") == "data formatting")
    return {"costed": bool(costs), "formatting_ps": float(formatting), "op_ps": float(per_op.sum())}


def combined_data_formatting(parts: list[dict]) -> tuple[float, float] | None:
    """(data-formatting op time, all op time) of several hosts' data_formatting_ps (integral picoseconds, so their
    sums are exact); None where no host records op categories."""
    if not any(part["costed"] for part in parts):
        return None
    return sum(part["formatting_ps"] for part in parts), sum(part["op_ps"] for part in parts)


def _is_convolution(ins: HloInstruction, module) -> bool:
    if ins.opcode == "convolution":
        return True
    if ins.opcode == "custom-call":
        return "conv" in ins.custom_call_target.lower()
    return ins.opcode == "fusion" and "convolution" in module.fused_opcodes.get(ins.name, [])


def _next_to_convolution(e: ExecutedInstruction) -> bool:
    """Whether the op reads a convolution's result or feeds a convolution (through tuple plumbing)."""
    by_name = e.computation.by_name
    near = [by_name[o] for o in e.instruction.operands if o in by_name]
    near += [u for u in e.computation.instructions if e.instruction.name in u.operands]
    for _ in range(2):  # look through get-tuple-element / bitcast between the op and the convolution
        near += [by_name[o] for n in near if n.opcode in ("get-tuple-element", "bitcast") for o in n.operands if o in by_name]
        near += [u for n in near if n.opcode in ("get-tuple-element", "bitcast")
                 for u in e.computation.instructions if n.name in u.operands]
    return any(_is_convolution(n, e.module) for n in near)


def _layout_copy(e: ExecutedInstruction, total_ps: int) -> dict | None:
    ins = e.instruction
    reason = None
    if ins.opcode in ("copy", "transpose"):
        operands = e.operands()
        reason = _layout_only(ins, operands[0] if operands else None)
    elif ins.opcode == "fusion":
        fused = [i for i in e.fused() if i.opcode not in STRUCTURAL_OPCODES]
        if fused and all(i.opcode in ("copy", "transpose") for i in fused):
            inner = {i.name: i for i in e.fused()}
            subject = fused[-1]
            reason = _layout_only(subject, inner.get(subject.operands[0]) if subject.operands else None)
            reason = f"fusion of only {', '.join(sorted({i.opcode for i in fused}))}: {reason}" if reason else None
    if not reason:
        return None
    operands = e.operands()
    return e.row(
        total_ps, opcode=ins.opcode, why=reason, shape=ins.shape_text, operand_shapes=[o.shape_text for o in operands],
        bytes_moved_per_run=shape_bytes(ins) + sum(shape_bytes(o) for o in operands),
        next_to_convolution=_next_to_convolution(e),
    )
