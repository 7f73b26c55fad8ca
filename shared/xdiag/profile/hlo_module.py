"""An HLO module as the profile's HloProto holds it, decoded into HloModule: each instruction's shape, operands and
metadata, and what its backend config records that the cost models read (a GEMM call's dot dimensions, a custom
fusion's emitter, a Pallas kernel's cost estimate and positional mask, a fused attention call's score matrix). The
reader records these facts; xdiag.cost counts from them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json

from google.protobuf.message import DecodeError

from xdiag.profile import schema
from xdiag.profile.space import HloComputation, HloInstruction, HloModule


def _contraction(ins) -> dict[str, tuple[int, ...]]:
    """lhs contracting and batch dimensions of a dot, or of a GEMM custom call (cuBLAS, hipBLASLt), whose
    backend config carries the dot dimension numbers as JSON."""
    numbers = ins.dot_dimension_numbers
    if ins.opcode == "custom-call" and b"dot_dimension_numbers" in ins.backend_config:
        try:
            config = json.loads(ins.backend_config)
        except ValueError:
            return {}
        found = next((v["dot_dimension_numbers"] for v in config.values()
                      if isinstance(v, dict) and isinstance(v.get("dot_dimension_numbers"), dict)), {})
        return {
            "lhs_contracting": tuple(int(d) for d in found.get("lhs_contracting_dimensions", [])),
            "lhs_batch": tuple(int(d) for d in found.get("lhs_batch_dimensions", [])),
        }
    return {
        "lhs_contracting": tuple(numbers.lhs_contracting_dimensions),
        "lhs_batch": tuple(numbers.lhs_batch_dimensions),
    }


def _conv_kernel_dims(ins) -> tuple[int, ...]:
    """A convolution's (or conv custom call's) kernel input-feature dimension, then its spatial dimensions."""
    if not ins.HasField("convolution_dimension_numbers"):
        return ()
    numbers = ins.convolution_dimension_numbers
    return (numbers.kernel_input_feature_dimension, *numbers.kernel_spatial_dimensions)


def _conv_output_spatial(ins) -> tuple[int, ...]:
    """A convolution's output positions along each of its spatial dimensions (its window's slides); () for others."""
    if ins.opcode != "convolution" or not ins.HasField("convolution_dimension_numbers"):
        return ()
    dims = ins.shape.dimensions
    spatial = ins.convolution_dimension_numbers.output_spatial_dimensions
    return tuple(int(dims[d]) for d in spatial) if all(d < len(dims) for d in spatial) else ()


def _conv_is_matrix_product(ins, by_id: dict) -> bool:
    """A convolution whose windows never slide: each spatial dimension contracted whole (the kernel as large as
    the input, one output position), pointwise (a kernel of 1, every position kept), or a batch (a window as large
    as the input, over the input base-dilated so that each output position sees one input position). XLA:TPU writes the
    matrix products it fuses this way (a GPT's weight gradients: bf16[16,1024,16384] "convolved" with
    [16,1024,1024] over its batch of 16; an attention's Q·Kᵀ over its heads, `convolution-base-dilated`)."""
    if ins.opcode != "convolution" or not ins.HasField("convolution_dimension_numbers") or len(ins.operand_ids) < 2:
        return False
    numbers = ins.convolution_dimension_numbers
    lhs, rhs = by_id.get(ins.operand_ids[0]), by_id.get(ins.operand_ids[1])
    spatial = list(zip(numbers.input_spatial_dimensions, numbers.kernel_spatial_dimensions,
                       numbers.output_spatial_dimensions))
    if lhs is None or rhs is None or len(spatial) != len(numbers.kernel_spatial_dimensions):
        return False
    windows = list(ins.window.dimensions) if ins.HasField("window") else []
    try:
        sizes = [(lhs.shape.dimensions[i], rhs.shape.dimensions[k], ins.shape.dimensions[o],
                  windows[n].base_dilation if n < len(windows) else 1) for n, (i, k, o) in enumerate(spatial)]
    except IndexError:
        return False
    return all((window == size and out == 1) or (window == 1 and out == size)
               or (window == size == out and dilation > 1) for size, window, out, dilation in sizes)


def _fusion_backend_kind(ins) -> str:
    """What emits a custom fusion (`__triton`, `__triton_nested_gemm_fusion`, `__ynn_fusion`, …): the `kind` its
    backend config names; "" for other instructions or where the config does not say."""
    if ins.opcode != "fusion" or ins.fusion_kind != "kCustom" or b'"kind"' not in ins.backend_config:
        return ""
    try:
        config = json.loads(ins.backend_config)
    except ValueError:
        return ""
    if not isinstance(config, dict):
        return ""
    # XLA:GPU keeps it under fusion_backend_config, XLA:CPU under fusion_config.
    fusion = config.get("fusion_backend_config") or config.get("fusion_config")
    return str(fusion.get("kind", "")) if isinstance(fusion, dict) else ""


def _kernel_cost_estimate(ins) -> tuple[float, ...]:
    """(FLOPs, bytes accessed) a custom kernel's author gave it (Pallas `cost_estimate=`, carried in the custom
    call's backend config as `cost_estimate`); () where it has none."""
    if ins.opcode != "custom-call" or b'"cost_estimate"' not in ins.backend_config:
        return ()
    try:
        config = json.loads(ins.backend_config)
    except ValueError:
        return ()
    places = [config, config.get("custom_call_config")] if isinstance(config, dict) else []
    estimate = next((p["cost_estimate"] for p in places if isinstance(p, dict) and isinstance(p.get("cost_estimate"), dict)), {})
    try:
        return (float(estimate["flops"]), float(estimate.get("bytes_accessed", 0)))
    except (KeyError, TypeError, ValueError):
        return ()


MOSAIC_TARGET = "tpu_custom_call"
"""A Pallas TPU kernel: its backend config carries the kernel's Mosaic module (MLIR bytecode, base64) as `body`."""


def _kernel_position_mask(ins) -> bool:
    """Whether a Mosaic kernel's body builds index iotas (`tpu.iota`, named in the bytecode's op table): the
    positional mask of a causal attention kernel (JAX's flash kernels build none without it)."""
    if ins.opcode != "custom-call" or ins.custom_call_target != MOSAIC_TARGET or b'"body"' not in ins.backend_config:
        return False
    try:
        body = json.loads(ins.backend_config)["custom_call_config"]["body"]
        return b"tpu.iota" in base64.b64decode(body)
    except (ValueError, KeyError, TypeError, binascii.Error):
        return False


ATTENTION_TARGET_PREFIX = "__cudnn$fmha"
"""XLA:GPU's fused attention custom calls (cuDNN flash attention: `__cudnn$fmhaSoftmax`, `…ScaleBiasSoftmax`,
`…Dropout`, and their `…Backward`), whose backend config names the score matrix they never write."""


def attention_config(ins) -> dict:
    """A fused attention call's score dims [B,H,Sq,Sk] (`intermediate_tensor_shape`) and causal mask, from its
    backend config; {} for any other instruction or a config without them."""
    if ins.opcode != "custom-call" or not ins.custom_call_target.startswith(ATTENTION_TARGET_PREFIX):
        return {}
    try:
        config = json.loads(ins.backend_config).get("cudnn_fmha_backend_config") or {}
        scores = tuple(int(d) for d in config["intermediate_tensor_shape"]["dimensions"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    causal = "CAUSAL" in str(config.get("mask_type", "")).upper() or config.get("is_causal_mask") is True
    return {"attention_scores": scores, "attention_causal": causal}


def _scheduled(computation, sequence) -> list:
    """The computation's instructions in the order the device runs them (the module's schedule), where the
    schedule covers them all; else in the proto's order. Kernels that carry no instruction name of their own
    (those of a CUDA graph) are matched to their instructions by this order."""
    if sequence is None or len(sequence.instruction_ids) != len(computation.instructions):
        return list(computation.instructions)
    by_id = {ins.id: ins for ins in computation.instructions}
    ordered = [by_id.get(i) for i in sequence.instruction_ids]
    return ordered if None not in ordered else list(computation.instructions)


_LOOKED_THROUGH = ("copy", "bitcast", "convert", "reshape")
"""Ops that pass a scalar on unchanged in value: XLA puts copies between a loop's counter and its tuple."""


def _integer(ins, by_id: dict) -> int | None:
    """The value of a scalar integer constant (looked for through copies); None for anything else."""
    seen = 0
    while ins is not None and ins.opcode in _LOOKED_THROUGH and len(ins.operand_ids) == 1 and seen < 8:
        ins, seen = by_id.get(ins.operand_ids[0]), seen + 1
    if ins is None or ins.opcode != "constant" or list(ins.shape.dimensions):
        return None
    values = [*ins.literal.s32s, *ins.literal.s64s, *ins.literal.u32s, *ins.literal.u64s]
    return int(values[0]) if len(values) == 1 else None


def _element(ins, by_id: dict, parameter_index: int | None = None) -> int | None:
    """The tuple index a get-tuple-element of the computation's parameter reads (through copies); None otherwise."""
    seen = 0
    while ins is not None and ins.opcode in _LOOKED_THROUGH and len(ins.operand_ids) == 1 and seen < 8:
        ins, seen = by_id.get(ins.operand_ids[0]), seen + 1
    if ins is None or ins.opcode != "get-tuple-element" or len(ins.operand_ids) != 1:
        return None
    source = by_id.get(ins.operand_ids[0])
    return int(ins.tuple_index) if source is not None and source.opcode == "parameter" else None


_TRIPS = {"LT": lambda start, bound, step: -(-(bound - start) // step),
          "LE": lambda start, bound, step: -(-(bound - start + 1) // step),
          "GT": lambda start, bound, step: -(-(start - bound) // -step),
          "GE": lambda start, bound, step: -(-(start - bound + 1) // -step),
          "NE": lambda start, bound, step: (bound - start) // step if (bound - start) % step == 0 else None}


def known_trip_count(ins, computations: dict, by_id: dict) -> int:
    """How many times a `while` runs its body, from the loop itself: the trip count XLA's backend config records
    (`known_trip_count`), else the counter the condition compares with a constant bound, its start (the constant
    the loop's initial tuple holds) and its step (the constant the body adds to it), as `lax.scan` and
    `lax.fori_loop` write them. 0 where the loop is not of that form (a data-dependent `while_loop`)."""
    if b"known_trip_count" in ins.backend_config:
        try:
            return max(int(json.loads(ins.backend_config)["known_trip_count"]["n"]), 0)
        except (ValueError, KeyError, TypeError):
            pass
    if len(ins.called_computation_ids) != 2 or len(ins.operand_ids) != 1:
        return 0
    body, condition = (computations.get(i) for i in ins.called_computation_ids)
    if body is None or condition is None:
        return 0
    in_condition = {i.id: i for i in condition.instructions}
    compare = in_condition.get(condition.root_id)
    if compare is None or compare.opcode != "compare" or len(compare.operand_ids) != 2:
        return 0
    left, right = (in_condition.get(i) for i in compare.operand_ids)
    direction = compare.comparison_direction
    counter, bound = _element(left, in_condition), _integer(right, in_condition)
    if counter is None or bound is None:  # `bound > i` is `i < bound`
        counter, bound = _element(right, in_condition), _integer(left, in_condition)
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    initial = by_id.get(ins.operand_ids[0])
    in_body = {i.id: i for i in body.instructions}
    result = in_body.get(body.root_id)
    if (counter is None or bound is None or direction not in _TRIPS or initial is None or initial.opcode != "tuple"
            or result is None or result.opcode != "tuple" or counter >= min(len(initial.operand_ids),
                                                                             len(result.operand_ids))):
        return 0
    start, step = _integer(by_id.get(initial.operand_ids[counter]), by_id), None
    update = in_body.get(result.operand_ids[counter])
    if update is not None and update.opcode in ("add", "subtract") and len(update.operand_ids) == 2:
        a, b = (in_body.get(i) for i in update.operand_ids)
        if _element(a, in_body) == counter and _integer(b, in_body) is not None:
            step = _integer(b, in_body) * (1 if update.opcode == "add" else -1)
        elif update.opcode == "add" and _element(b, in_body) == counter and _integer(a, in_body) is not None:
            step = _integer(a, in_body)
    if start is None or not step:
        return 0
    trips = _TRIPS[direction](start, bound, step)
    return max(int(trips), 0) if trips is not None else 0


MAX_MESSAGE_DEPTH = 90
"""The deepest nesting of messages kept from an HloProto: protobuf refuses a whole message nested past 100 (a 5,000-deep
tuple shape dropped its module, and the profile then read as carrying no HLO modules); fields deeper than this are
left out instead, and the module kept."""
MAX_CALL_DEPTH = 64
"""The deepest chain of computations calling computations (fusions, loops, calls) xdiag follows: XLA's own nest a few
levels; the tools walk the chain recursively."""


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DecodeError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _pruned(data: bytes, descriptor, depth_left: int, dropped: list[int]) -> bytes:
    """`data` (a message of `descriptor`) with its declared message fields nested deeper than `depth_left` left out
    (each counted in `dropped`); walked with an explicit bound, never past `depth_left` levels of Python frames."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        key_pos = pos
        key, pos = _varint_at(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint_at(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            key_end = pos
            length, start = _varint_at(data, pos)
            end = start + length
            if end > len(data):
                raise DecodeError("a length past the message's end")
            field = descriptor.fields_by_number.get(key >> 3)
            if field is not None and field.message_type is not None:
                if depth_left <= 1:
                    dropped[0] += 1
                    pos = end
                    continue
                value = _pruned(data[start:end], field.message_type, depth_left - 1, dropped)
                out += _key_and_length(data[key_pos:key_end], len(value)) + value
                pos = end
                continue
            pos = end
        else:
            raise DecodeError(f"wire type {wire}")
        if pos > len(data):
            raise DecodeError("a field past the message's end")
        out += data[key_pos:pos]
    return bytes(out)


def _key_and_length(key: bytes, length: int) -> bytes:
    """A field's key bytes followed by `length` as a varint."""
    out = bytearray(key)
    while True:
        byte = length & 0x7F
        length >>= 7
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def _parsed(proto_bytes: bytes, notes: list[str]) -> object | None:
    """The HloProto's module, with fields nested past MAX_MESSAGE_DEPTH left out (said in `notes`); None, said in
    `notes`, where it cannot be decoded at all."""
    try:
        return schema.HloProto.FromString(proto_bytes).hlo_module
    except DecodeError as error:
        first_error = error
    dropped = [0]
    try:
        module = schema.HloProto.FromString(
            _pruned(proto_bytes, schema.HloProto.DESCRIPTOR, MAX_MESSAGE_DEPTH, dropped)).hlo_module
    except DecodeError:
        notes.append(f"an HLO module ({len(proto_bytes):,} bytes) cannot be decoded ({first_error}): left out")
        return None
    if dropped[0]:
        notes.append(f"HLO module {module.name}: {dropped[0]:,} field(s) nested more than {MAX_MESSAGE_DEPTH} messages "
                     f"deep left out (protobuf decodes 100 at most); the rest of the module kept")
    return module


def _calls_cut(computations: dict[str, list[HloInstruction]], entry: str, module_name: str,
               notes: list[str]) -> None:
    """The calls that close a cycle (a computation calling one it is called from) or go deeper than MAX_CALL_DEPTH
    removed from `computations` in place, walked without recursion; each kind said once in `notes`."""
    cycles: list[str] = []
    too_deep = 0
    done: set[str] = set()
    for root in [entry, *computations]:
        if root not in computations or root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [(root, 0)]  # (computation, index of the next instruction to look at)
        while stack:
            name, index = stack[-1]
            instructions = computations[name]
            if index >= len(instructions):
                stack.pop()
                on_path.discard(path.pop())
                done.add(name)
                continue
            stack[-1] = (name, index + 1)
            ins = instructions[index]
            kept = []
            for called in ins.called:
                if called in on_path:
                    cycles.append(f"{ins.name} calls {called}")
                elif called in computations and called not in done and len(path) >= MAX_CALL_DEPTH:
                    too_deep += 1
                else:
                    kept.append(called)
            if len(kept) != len(ins.called):
                instructions[index] = ins = dataclasses.replace(ins, called=tuple(kept))
            for called in ins.called:
                if called in computations and called not in done and called not in on_path:
                    path.append(called)
                    on_path.add(called)
                    stack.append((called, 0))
                    break  # one child at a time: the rest are visited when the walk comes back to this instruction
            else:
                continue
            stack[-2] = (name, index)  # come back to this instruction for its other called computations
    if cycles:
        notes.append(f"HLO module {module_name}: {len(cycles)} call(s) back into a computation they are called from "
                     f"(a cycle: {cycles[0]}) left out; the rest of the module kept")
    if too_deep:
        notes.append(f"HLO module {module_name}: {too_deep} call(s) nested more than {MAX_CALL_DEPTH} computations "
                     f"deep left out; the rest of the module kept")


MAX_OPERANDS = 2**16
"""The most operands of one instruction kept (a tuple of a large model's parameters has thousands): an instruction of
50M operand ids (200 MB) made 50M names, 5 GiB at the peak."""


MAX_ELEMENTS = 2**48
"""The most elements a shape is read with: 2^48 bf16 elements are 512 TiB, past any device's memory. A shape of
dimensions 2^62 made a 'memory_passes' of 1.6e30; a negative dimension, negative bytes and bandwidths."""


def _dims(dimensions, name: str, bad: list[str]) -> tuple[int, ...]:
    """A shape's dimensions; () (a scalar), noted in `bad`, where one is negative or they hold more than MAX_ELEMENTS
    (protobuf's int64, each: their product is checked as it grows)."""
    dims = tuple(dimensions)
    elements = 1
    for dim in dims:
        elements *= dim
        if dim < 0 or elements > MAX_ELEMENTS:
            bad.append(f"{name}: {list(dims)}")
            return ()
    return dims


def _operands(ins, id_to_name: dict, cut: list[str]) -> tuple[str, ...]:
    """The names of the instruction's operands (an id no instruction has, as itself), the first MAX_OPERANDS."""
    ids = ins.operand_ids
    if len(ids) > MAX_OPERANDS:
        cut.append(f"{ins.name}: {len(ids):,}")
        ids = ids[:MAX_OPERANDS]
    return tuple(id_to_name[i] if i in id_to_name else str(i) for i in ids)


def hlo_module(proto_bytes: bytes, host: str, fallback_id: int, notes: list[str] | None = None) -> HloModule | None:
    """The module of an HloProto's bytes, or None where it cannot be decoded; what was left out of it, and why, is
    appended to `notes` (one line each)."""
    notes = [] if notes is None else notes
    module = _parsed(proto_bytes, notes)
    if module is None:
        return None
    computations: dict = {}
    roots: dict[str, str] = {}
    cut: list[str] = []  # instructions whose operands were cut to MAX_OPERANDS
    bad_shapes: list[str] = []  # instructions with a shape no device holds (`_dims`)
    by_computation_id = {c.id: c for c in module.computations}
    id_to_computation = {c.id: c.name for c in module.computations}
    for computation in module.computations:
        id_to_name = {i.id: i.name for i in computation.instructions}
        by_id = {i.id: i for i in computation.instructions}
        instructions = []
        for ins in _scheduled(computation, module.schedule.sequences.get(computation.id)):
            shape = ins.shape
            dtype = schema.PRIMITIVE_TYPES.get(shape.element_type, f"type{shape.element_type}")
            instructions.append(
                HloInstruction(
                    name=ins.name,
                    opcode=ins.opcode,
                    dtype=dtype,
                    dims=_dims(shape.dimensions, ins.name, bad_shapes),
                    layout=tuple(shape.layout.minor_to_major),
                    operands=_operands(ins, id_to_name, cut),
                    fusion_kind=ins.fusion_kind,
                    op_name=ins.metadata.op_name,
                    source=f"{ins.metadata.source_file}:{ins.metadata.source_line}" if ins.metadata.source_file else "",
                    called=tuple(id_to_computation.get(i, str(i)) for i in ins.called_computation_ids),
                    tuple_shapes=tuple(
                        (schema.PRIMITIVE_TYPES.get(t.element_type, "?"), _dims(t.dimensions, ins.name, bad_shapes))
                        for t in shape.tuple_shapes
                    ),
                    custom_call_target=ins.custom_call_target,
                    conv_kernel_dims=_conv_kernel_dims(ins),
                    conv_is_matrix_product=_conv_is_matrix_product(ins, by_id),
                    conv_output_spatial=_conv_output_spatial(ins),
                    fusion_backend_kind=_fusion_backend_kind(ins),
                    memory_space=shape.layout.memory_space,
                    kernel_cost_estimate=_kernel_cost_estimate(ins),
                    operand_precision=tuple(ins.precision_config.operand_precision),
                    **_contraction(ins),
                    tuple_memory_spaces=tuple(t.layout.memory_space for t in shape.tuple_shapes),
                    is_host_transfer=ins.is_host_transfer,
                    **attention_config(ins),
                    kernel_position_mask=_kernel_position_mask(ins),
                    stack_frame_id=ins.metadata.stack_frame_id,
                    trip_count=known_trip_count(ins, by_computation_id, by_id) if ins.opcode == "while" else 0,
                    parameter_number=int(ins.parameter_number) if ins.opcode == "parameter" else -1,
                    tuple_index=int(ins.tuple_index) if ins.opcode == "get-tuple-element" else -1,
                    comparison=ins.comparison_direction if ins.opcode == "compare" else "",
                    dimensions=tuple(int(d) for d in ins.dimensions),
                    indices_are_sorted=bool(ins.indices_are_sorted),
                    integer_value=_integer(ins, by_id) if ins.opcode == "constant" else None,
                )
            )
        computations[computation.name] = instructions
        roots[computation.name] = id_to_name.get(computation.root_id, "")
    entry = module.entry_computation_name or id_to_computation.get(module.entry_computation_id, "")
    if entry not in computations and computations:
        entry = list(computations)[-1]
    if bad_shapes:
        notes.append(f"HLO module {module.name}: {len(bad_shapes)} shape(s) with a negative dimension or more than "
                     f"2^{MAX_ELEMENTS.bit_length() - 1} elements ({bad_shapes[0]}) read as scalars")
    if cut:
        notes.append(f"HLO module {module.name}: {len(cut)} instruction(s) with more than {MAX_OPERANDS:,} operands "
                     f"({cut[0]}) kept their first {MAX_OPERANDS:,}")
    _calls_cut(computations, entry, module.name, notes)
    computations = {name: HloComputation(name, instructions, roots.get(name, ""))
                    for name, instructions in computations.items()}
    return HloModule(
        name=module.name, program_id=module.id or fallback_id, entry=entry, computations=computations, host=host,
        donated_parameters=_donated_parameters(module, entry),
        stack_frames=_stack_frames(module.stack_frame_index),
    )


def _donated_parameters(module, entry: str) -> frozenset[str]:
    """The entry parameters an output aliases (input_output_alias: the arguments jax.jit donates), by name."""
    aliased = {e.parameter_number for e in module.input_output_alias.entries}
    if not aliased:
        return frozenset()
    computation = next((c for c in module.computations if c.name == entry), None)
    return frozenset(i.name for i in (computation.instructions if computation else ())
                     if i.opcode == "parameter" and i.parameter_number in aliased)


def _stack_frames(index) -> tuple[tuple[str, int, str, int], ...]:
    """The module's stack frame index as one flat table: each frame (file, line, function, caller's frame id), ids
    1-based (0: none) as the proto's; a reference outside its array reads as empty, never as another entry."""
    files, functions, locations = index.file_names, index.function_names, index.file_locations

    def at(items, position: int, empty):
        return items[position - 1] if 0 < position <= len(items) else empty

    frames = []
    for frame in index.stack_frames:
        location = at(locations, frame.file_location_id, None)
        if location is None:
            frames.append(("", 0, "", frame.parent_frame_id))
            continue
        frames.append((at(files, location.file_name_id, ""), location.line,
                       at(functions, location.function_name_id, ""), frame.parent_frame_id))
    return tuple(frames)
