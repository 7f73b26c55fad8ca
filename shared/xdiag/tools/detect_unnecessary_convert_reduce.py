"""detect_unnecessary_convert_reduce: are low-precision arrays widened just to be reduced?"""

from __future__ import annotations

from xdiag.analysis.executed_ops import ExecutedInstruction
from xdiag.cost.hlo import shape_bytes
from xdiag.profile.space import HloComputation, HloInstruction, HloModule, Session
from xdiag.tools.hlo_checks import detect
from xdiag.tools.registry import ToolOutput, tool

NARROW = {"bf16", "f16", "f8e5m2", "f8e4m3fn", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e3m4"}
WIDE = {"f32", "f64"}


def _reduces(instruction: HloInstruction, module: HloModule) -> bool:
    if instruction.opcode in ("reduce", "reduce-window"):
        return True
    return instruction.opcode == "fusion" and bool(
        {"reduce", "reduce-window"} & set(module.fused_opcodes.get(instruction.name, []))
    )


def _widening_converts(
    computation: HloComputation, module: HloModule, as_convert: HloInstruction | None = None
) -> list[tuple[HloInstruction, HloInstruction, str]]:
    """(convert, its source, what consumes it) for converts narrow->wide that feed a reduction
    (a reduce, or a fusion holding one), directly or through one elementwise op."""
    users: dict[str, list[HloInstruction]] = {}
    for ins in computation.instructions:
        for operand in ins.operands:
            users.setdefault(operand, []).append(ins)
    out = []
    for ins in computation.instructions:
        is_convert = ins.opcode == "convert" or ins is as_convert
        if not is_convert or ins.dtype not in WIDE or not ins.operands:
            continue
        source = computation.by_name.get(ins.operands[0])
        if source is None or source.dtype not in NARROW:
            continue
        consumers = users.get(ins.name, [])
        # Follow elementwise users one level: convert -> multiply -> reduce is the same pattern.
        reach = consumers + [u for c in consumers if not _reduces(c, module) for u in users.get(c.name, [])]
        reducers = [u for u in reach if _reduces(u, module)]
        if reducers:
            out.append((ins, source, reducers[0].name))
    return out


@tool(
    "detect_unnecessary_convert_reduce",
    "Convert ops that widen low-precision data (bf16/f16/f8 to f32/f64) and write the widened copy to memory "
    "for a reduction to read back, with the shapes, the extra bytes the widening costs and the time of the ops "
    "that hold them (converts fused into the reduction write nothing extra and are not listed).",
)
def detect_unnecessary_convert_reduce(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, ops_with_hlo, op_time_with_hlo_percent (the ops the HLO
    names, and their share of op time), top_op, widening, top_op_shape. detail: ops (top 20), each with the widening,
    the shapes, the reduction it feeds, read_by (every op that reads what it writes) and the extra bytes per run."""
    return detect(session, materialised_widening, lambda top: {"widening": top["widening"], "top_op_shape": top["converted_shape"]})


def materialised_widening(e: ExecutedInstruction, total_ps: int) -> dict | None:
    """A widened copy this op writes to memory that a reduction then reads. A convert fused into the reduction
    itself (XLA's usual bf16->f32 reduce fusion) widens in registers and writes nothing extra: not counted."""
    ins = e.instruction
    if ins.opcode == "convert" or e.fused_opcodes() == {"convert"}:
        # The op itself is the widening; its users in the enclosing computation do the reducing.
        hits = [h for h in _widening_converts(e.computation, e.module, as_convert=ins) if h[0].name == ins.name]
    elif ins.opcode == "fusion" and ins.called and ins.called[0] in e.module.computations:
        hits = _widened_outputs(e)
    else:
        hits = []
    if not hits:
        return None
    convert, source, reducer = hits[0]
    return e.row(
        total_ps, opcode=ins.opcode, widening=f"{source.dtype}->{convert.dtype}", converted_shape=convert.shape_text,
        source_shape=source.shape_text, feeds=reducer,
        read_by=[u.name for u in _readers(e.computation, ins.name)],
        extra_bytes_per_run=shape_bytes(convert) - shape_bytes(source), framework_op=convert.op_name or ins.op_name,
    )


_ELEMENTWISE_PASS_THROUGH = {"bitcast", "reshape", "copy", "transpose", "negate", "abs", "multiply", "add", "subtract"}


def _widened_outputs(e: ExecutedInstruction) -> list[tuple[HloInstruction, HloInstruction, str]]:
    """(convert, its narrow source, the reducer reading it) for each narrow->wide convert whose widened array
    is an output of the fusion (written to memory) and is read by a reduction outside it."""
    called = e.module.computations[e.instruction.called[0]]
    if not called.instructions:
        return []
    root = called.instructions[-1]
    outputs = [called.by_name[o] for o in root.operands if o in called.by_name] if root.opcode == "tuple" else [root]
    reducers = [u.name for u in _readers(e.computation, e.instruction.name) if _reduces(u, e.module)]
    if not reducers:
        return []
    out = []
    for output in outputs:
        node = output
        # Walk back through same-size elementwise ops to the convert that produced the widened array.
        while node is not None and node.opcode in _ELEMENTWISE_PASS_THROUGH and node.operands:
            node = called.by_name.get(node.operands[0])
        if node is None or node.opcode != "convert" or node.dtype not in WIDE or not node.operands:
            continue
        source = called.by_name.get(node.operands[0])
        if source is not None and source.dtype in NARROW and output.dims == node.dims:
            out.append((node, source, reducers[0]))
    return out


def _readers(computation: HloComputation, name: str) -> list[HloInstruction]:
    """The instructions that read the output of `name`, directly or through a get-tuple-element of it, in the
    computation's order: from its index of users, not a test of every instruction per op (65,758 tests, 0.1 s, on
    the 87.6 MiB TPU v5e capture)."""
    users = computation.users
    found = {id(user): user for user in users.get(name, ())}
    for reader in users.get(name, ()):
        if reader.opcode != "get-tuple-element":
            continue
        producer = computation.by_name.get(reader.name)  # what its readers name by it
        if producer is not None and producer.opcode == "get-tuple-element" and name in producer.operands:
            found.update((id(user), user) for user in users.get(reader.name, ()))
    position = computation.position
    return sorted(found.values(), key=lambda user: position[id(user)])
