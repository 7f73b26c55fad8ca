"""FLOPs and bytes of an HLO instruction, from the shapes the profile's HLO carries.

Used where the profile has no cost model of its own (XLA:CPU). Counts: a dot is
2·|out|·K multiply-adds; an elementwise op one FLOP per output element; a reduce one per
input element. Bytes are the operands read plus the result written, once each.
"""

from __future__ import annotations

from math import prod

from xdiag.profile.schema import BYTES_PER_ELEMENT
from xdiag.profile.space import HloComputation, HloInstruction, HloModule

_NO_FLOP = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy", "transpose", "reshape", "broadcast",
    "slice", "concatenate", "pad", "dynamic-slice", "dynamic-update-slice", "gather", "scatter", "iota", "reverse",
    "copy-start", "copy-done", "custom-call", "while", "conditional", "call", "convert", "after-all",
}


def shape_bytes(ins: HloInstruction) -> float:
    if ins.dtype == "tuple":
        return sum(prod(d) * BYTES_PER_ELEMENT.get(t, 4) for t, d in ins.tuple_shapes)
    return prod(ins.dims) * BYTES_PER_ELEMENT.get(ins.dtype, 4) if ins.dtype in BYTES_PER_ELEMENT else 0.0


def _flops(ins: HloInstruction, computation: HloComputation, module: HloModule) -> float:
    if ins.opcode == "dot":
        lhs = computation.by_name.get(ins.operands[0]) if ins.operands else None
        k = prod(lhs.dims[d] for d in ins.lhs_contracting if d < len(lhs.dims)) if lhs is not None else 1
        return 2.0 * prod(ins.dims) * k
    if ins.opcode == "fusion" and ins.called:
        called = module.computations.get(ins.called[0])
        return sum(_flops(i, called, module) for i in called.instructions) if called else 0.0
    if ins.opcode in ("reduce", "reduce-window"):
        operand = computation.by_name.get(ins.operands[0]) if ins.operands else None
        return float(prod(operand.dims)) if operand is not None else 0.0
    if ins.opcode in _NO_FLOP or ins.dtype == "tuple":
        return 0.0
    return float(prod(ins.dims))


def instruction_cost(module: HloModule, name: str) -> dict | None:
    """{flops, bytes, shape, operand_shapes} of instruction `name`, or None if it is not in the module."""
    found = module.find(name)
    if found is None:
        return None
    computation, ins = found
    operands = [computation.by_name[o] for o in ins.operands if o in computation.by_name]
    read = sum(shape_bytes(o) for o in operands)
    written = shape_bytes(ins)
    fused = module.fused_opcodes.get(ins.name, [])
    return {
        "flops_known": ins.opcode != "custom-call" and "custom-call" not in fused,
        "cost_source": "HLO shapes",
        "flops": _flops(ins, computation, module),
        "bytes": read + written,
        "shape": ins.shape_text,
        "operand_shapes": [o.shape_text for o in operands],
        "opcode": ins.opcode,
        "fusion_kind": ins.fusion_kind,
        "op_name": ins.op_name,
        "source": ins.source,
    }
