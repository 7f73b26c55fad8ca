"""FLOPs and bytes of an HLO instruction, from the shapes the profile's HLO carries.

Used where the profile has no cost model of its own (XLA:CPU, XLA:GPU). Counts: a dot is
2·|out|·K multiply-adds, and so is a GEMM custom call (cuBLAS, hipBLASLt, TransformerEngine),
whose K comes from the dot dimension numbers in its backend config, or else from its operand
and result shapes; a convolution (HLO or cuDNN/MIOpen custom call) 2·|out|·C·R·S from its
dimension numbers; an elementwise op one FLOP per output element; a reduce one per input
element. Bytes are the operands read plus the result written, once each (a GEMM's scratch
workspace, the trailing s8/u8 buffer of its result tuple, is not traffic).
"""

from __future__ import annotations

from math import prod

from xdiag.cost.custom_calls import (
    CONV_TARGETS, attention_flops, call_result, custom_kernel_cost, gemm_flops, is_gemm_call,
)
from xdiag.cost.library_kernels import library_kernel_cost
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


_WORKSPACE_TYPES = {"s8", "u8"}
"""A GEMM custom call's scratch workspace: the trailing s8/u8 buffer of its result tuple, never traffic."""


def conv_flops(ins: HloInstruction, computation: HloComputation) -> float | None:
    """2·|output|·C·R·S… of a convolution or conv custom call: each output element of the forward convolution
    sums kernel-input-features × kernel-window products. None where the dimension numbers are missing.

    The forward output and kernel are, per direction: forward (result, operand 1); backward input (operand 0,
    the output's gradient; operand 1); backward filter (operand 1, the output's gradient; the result)."""
    direction = "forward" if ins.opcode == "convolution" else CONV_TARGETS.get(ins.custom_call_target)
    if direction is None or not ins.conv_kernel_dims:
        return None
    operands = [computation.by_name.get(o) for o in ins.operands[:2]]
    if len(operands) < 2 or None in operands:
        return None
    _, result = call_result(ins)
    output, kernel = {
        "forward": (result, operands[1].dims),
        "backward_input": (operands[0].dims, operands[1].dims),
        "backward_filter": (operands[1].dims, result),
    }[direction]
    if max(ins.conv_kernel_dims) >= len(kernel):
        return None
    return 2.0 * prod(output) * prod(kernel[d] for d in ins.conv_kernel_dims)


def _flops(ins: HloInstruction, computation: HloComputation, module: HloModule) -> float:
    if is_gemm_call(ins):
        return gemm_flops(ins, computation) or 0.0
    if ins.attention_scores:
        return attention_flops(ins, computation) or 0.0
    if ins.opcode == "convolution" or ins.custom_call_target in CONV_TARGETS:
        return conv_flops(ins, computation) or 0.0
    custom = custom_kernel_cost(ins, computation)
    if custom is not None:
        return custom[0]
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


def _loop(loop: HloInstruction | None) -> dict:
    """The innermost loop an op runs in: the `while` (loop) and its trip count read from the loop (loop_trip_count,
    where the loop states it: hlo_module.known_trip_count)."""
    if loop is None:
        return {}
    return {"loop": loop.name, **({"loop_trip_count": loop.trip_count} if loop.trip_count else {})}


def instruction_cost(module: HloModule, name: str) -> dict | None:
    """{flops, bytes, shape, operand_shapes} of instruction `name`, or None if it is not in the module."""
    found = module.find(name)
    if found is None:
        return None
    computation, ins = found
    operands = [computation.by_name[o] for o in ins.operands if o in computation.by_name]
    read = sum(shape_bytes(o) for o in operands)
    written = shape_bytes(ins)
    if ins.opcode == "custom-call" and ins.dtype == "tuple":
        written = sum(prod(d) * BYTES_PER_ELEMENT.get(t, 4) for t, d in ins.tuple_shapes if t not in _WORKSPACE_TYPES)
    fused = module.fused_opcodes.get(ins.name, [])
    precision = _matmul_precision(ins, module)
    gemm_known = is_gemm_call(ins) and gemm_flops(ins, computation) is not None
    conv_known = ins.custom_call_target in CONV_TARGETS and conv_flops(ins, computation) is not None
    attention_known = bool(ins.attention_scores) and attention_flops(ins, computation) is not None
    custom = custom_kernel_cost(ins, computation)
    if custom is not None and custom[1]:
        read, written = custom[1], 0.0  # the author's bytes accessed: reads and writes together
    source = ("HLO shapes (GEMM custom call: 2·B·M·N·K from its operands)" if gemm_known else
              "HLO shapes (convolution custom call: 2·|output|·C·R·S from its dimension numbers)" if conv_known else
              "HLO shapes (fused attention custom call: its QKᵀ and PV products from the score matrix its backend "
              "config names" + (", halved for the causal mask)" if ins.attention_causal else ")") if attention_known else
              f"custom kernel: {custom[2]}" if custom is not None else "HLO shapes")
    return {
        "library_kernel": custom is not None and library_kernel_cost(ins, computation) is not None,
        "flops_known": gemm_known or conv_known or attention_known or custom is not None
        or (ins.opcode != "custom-call" and "custom-call" not in fused),
        "cost_source": source,
        "flops": _flops(ins, computation, module),
        "bytes": read + written,
        "shape": ins.shape_text,
        "operand_shapes": [o.shape_text for o in operands],
        "opcode": ins.opcode,
        "fusion_kind": ins.fusion_kind,
        "op_name": ins.op_name,
        "source": ins.source,
        "program_memory_passes": memory_passes(module),
        **_handed_on_cost(handed_on(ins, operands, computation)),
        "hbm_share": hbm_share(ins, operands),
        "result_memory_space": ins.memory_space if ins.dtype != "tuple" else 0,
        "result_bytes": shape_bytes(ins) if ins.dtype != "tuple" else 0.0,
        "in_loop_body": computation.name in module.loop_bodies,
        **_loop(module.enclosing_loop.get(computation.name)),
        **({"matmul_precision": precision} if precision else {}),
    }


ON_CHIP_MEMORY_SPACE = 1
"""A TPU's VMEM (`S(1)` in HLO text, XLA's docs/shapes.md); 0 is the device's HBM."""


def _arrays(ins: HloInstruction) -> list[tuple[float, int]]:
    """(bytes, memory space) of the instruction's result, or of each tuple element; the space 0 (HBM) where the
    HLO does not say."""
    if ins.dtype != "tuple":
        return [(shape_bytes(ins), ins.memory_space)]
    spaces = ins.tuple_memory_spaces
    if len(spaces) != len(ins.tuple_shapes):
        spaces = (0,) * len(ins.tuple_shapes)
    return [(prod(d) * BYTES_PER_ELEMENT.get(t, 4), space) for (t, d), space in zip(ins.tuple_shapes, spaces)]


def hbm_share(ins: HloInstruction, operands: list[HloInstruction]) -> float | None:
    """The share of the op's operand and result bytes that live in the device's main memory (memory space 0),
    where some live elsewhere: on a TPU in VMEM (S(1)), whose bytes never cross the HBM bus, so the HBM roofline
    counts only this share (0: the op's data is all on chip). None where everything is in HBM (GPU, CPU)."""
    if any(t == "tuple" for i in (ins, *operands) for t, _ in i.tuple_shapes):
        return None  # a nested tuple's arrays are not listed (an async op's operand): its sizes are not known
    arrays = [a for i in (ins, *operands) for a in _arrays(i)]
    total = sum(size for size, _ in arrays)
    in_hbm = sum(size for size, space in arrays if space == 0)
    return round(in_hbm / total, 4) if total and in_hbm < total else None


PRECISIONS = {1: "HIGH", 2: "HIGHEST"}
"""XLA's PrecisionConfig values above DEFAULT: f32 matmuls the TPU's bf16 MXU runs in 3 (HIGH) or 6 (HIGHEST) passes."""


def _matmul_precision(ins: HloInstruction, module: HloModule) -> str | None:
    """HIGH or HIGHEST where the op (or a dot or convolution it fuses) asks for more than the default precision."""
    inner = [ins]
    if ins.opcode == "fusion" and ins.called and ins.called[0] in module.computations:
        inner = module.computations[ins.called[0]].instructions
    levels = [max(i.operand_precision) for i in inner if i.opcode in ("dot", "convolution") and i.operand_precision]
    return PRECISIONS.get(max(levels)) if levels else None


_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id"}


def _handed_on(producer: HloInstruction, computation: HloComputation) -> bool:
    """An array one kernel writes to the device's memory only for one other kernel to read back: not a parameter,
    not what the program returns, not kept for a later use (a training step's activations, read again by the
    backward pass), and not already on chip."""
    users = computation.users.get(producer.name, [])
    return (producer.opcode not in _NOT_KERNELS and producer.dtype != "tuple" and producer.memory_space == 0
            and producer is not computation.instructions[-1] and len(users) == 1
            and users[0].opcode not in _NOT_KERNELS)


def _handed_on_cost(arrays: list[HloInstruction]) -> dict:
    """handed_on_bytes, and handed_on_array ("bf16[64,2048,2048] (fusion name)", the largest) where there are any."""
    if not arrays:
        return {}
    largest = max(arrays, key=shape_bytes)
    return {"handed_on_bytes": sum(shape_bytes(a) for a in arrays),
            "handed_on_array": f"{largest.shape_text.split('{')[0]} ({largest.opcode} {largest.name})"}


def handed_on(ins: HloInstruction, operands: list[HloInstruction], computation: HloComputation) -> list[HloInstruction]:
    """The op's result and operands that pass from one kernel straight to one other through the device's memory
    (_handed_on): a kernel doing both would keep them on chip, as a fused attention keeps its scores."""
    if ins.opcode in _NOT_KERNELS:
        return []
    arrays = [ins] + list({o.name: o for o in operands}.values())
    return [a for a in arrays if _handed_on(a, computation)]


def memory_passes(module: HloModule) -> float | None:
    """How many times one execution of the program moves its own data: the bytes its top-level ops read and
    write, over the bytes it must (its parameters read once, its result written once). 1.0 is one pass; several
    kernels re-reading one array, or intermediates written and read back, raise it. None when nothing moves, or
    the program runs a loop."""
    entry = module.computations.get(module.entry)
    ratio = None
    # A loop re-reads its state every trip, as it must: the entry's bytes do not count a looping program's passes.
    if entry is not None and entry.instructions and not any(i.opcode == "while" for i in entry.instructions):
        moved = 0.0
        for ins in entry.instructions:
            if ins.opcode in _NOT_KERNELS:
                continue
            moved += shape_bytes(ins) + sum(shape_bytes(entry.by_name[o]) for o in ins.operands if o in entry.by_name)
        needed = sum(shape_bytes(i) for i in entry.instructions if i.opcode == "parameter")
        needed += shape_bytes(entry.instructions[-1])  # the root: what the program returns
        ratio = round(moved / needed, 2) if needed and moved else None
    return ratio
