"""Protobuf message classes for the XSpace profile format and the HLO it carries.

Neither jaxlib nor xprof ships Python bindings for `tsl/profiler/protobuf/xplane.proto`
or `xla/service/hlo.proto`, so the schemas are declared here with descriptor_pb2 and
built into message classes at import time. Parsing still runs in protobuf's C backend.
Only the HLO fields xdiag reads are declared; protobuf skips the rest of the wire data.
Field numbers follow the upstream .proto files.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_INT64, _UINT64, _DOUBLE = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_DOUBLE
_STRING, _BYTES, _MESSAGE, _INT32, _BOOL = (
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_MESSAGE,
    _F.TYPE_INT32,
    _F.TYPE_BOOL,
)


def text(value: str | bytes) -> str:
    """A string field's value as text: protobuf hands over a string field of these (proto2) messages that is not valid
    UTF-8 as bytes (a corrupt or mangled file); those are decoded with replacement characters."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _message(file: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple]) -> descriptor_pb2.DescriptorProto:
    msg = file.message_type.add(name=name)
    for spec in fields:
        field_name, number, ftype, label = spec[:4]
        field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
        if ftype == _MESSAGE:
            field.type_name = f".{file.package}.{spec[4]}"
        if len(spec) > 5 and spec[5] is not None:
            field.oneof_index = spec[5]
    return msg


def _map_entry(file, parent: descriptor_pb2.DescriptorProto, entry_name: str, value_type: str):
    entry = parent.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_INT64, label=_OPTIONAL)
    entry.field.add(name="value", number=2, type=_MESSAGE, label=_OPTIONAL, type_name=f".{file.package}.{value_type}")
    return f".{file.package}.{parent.name}.{entry_name}"


def _build_xplane_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="xdiag/xplane.proto", package="xdiag.xplane", syntax="proto2")
    xstat = _message(
        f,
        "XStat",
        [
            ("metadata_id", 1, _INT64, _OPTIONAL),
            ("double_value", 2, _DOUBLE, _OPTIONAL, None, 0),
            ("uint64_value", 3, _UINT64, _OPTIONAL, None, 0),
            ("int64_value", 4, _INT64, _OPTIONAL, None, 0),
            ("str_value", 5, _STRING, _OPTIONAL, None, 0),
            ("bytes_value", 6, _BYTES, _OPTIONAL, None, 0),
            ("ref_value", 7, _UINT64, _OPTIONAL, None, 0),
        ],
    )
    xstat.oneof_decl.add(name="value")
    xevent = _message(
        f,
        "XEvent",
        [
            ("metadata_id", 1, _INT64, _OPTIONAL),
            ("offset_ps", 2, _INT64, _OPTIONAL, None, 0),
            ("num_occurrences", 5, _INT64, _OPTIONAL, None, 0),
            ("duration_ps", 3, _INT64, _OPTIONAL),
            ("stats", 4, _MESSAGE, _REPEATED, "XStat"),
        ],
    )
    xevent.oneof_decl.add(name="data")
    _message(
        f,
        "XLine",
        [
            ("id", 1, _INT64, _OPTIONAL),
            ("display_id", 10, _INT64, _OPTIONAL),
            ("name", 2, _STRING, _OPTIONAL),
            ("display_name", 11, _STRING, _OPTIONAL),
            ("timestamp_ns", 3, _INT64, _OPTIONAL),
            ("duration_ps", 9, _INT64, _OPTIONAL),
            ("events", 4, _MESSAGE, _REPEATED, "XEvent"),
        ],
    )
    _message(
        f,
        "XEventMetadata",
        [
            ("id", 1, _INT64, _OPTIONAL),
            ("name", 2, _STRING, _OPTIONAL),
            ("display_name", 4, _STRING, _OPTIONAL),
            ("metadata", 3, _BYTES, _OPTIONAL),
            ("stats", 5, _MESSAGE, _REPEATED, "XStat"),
            ("child_id", 6, _INT64, _REPEATED),
        ],
    )
    _message(
        f,
        "XStatMetadata",
        [("id", 1, _INT64, _OPTIONAL), ("name", 2, _STRING, _OPTIONAL), ("description", 3, _STRING, _OPTIONAL)],
    )
    plane = _message(
        f,
        "XPlane",
        [
            ("id", 1, _INT64, _OPTIONAL),
            ("name", 2, _STRING, _OPTIONAL),
            ("lines", 3, _MESSAGE, _REPEATED, "XLine"),
            ("stats", 6, _MESSAGE, _REPEATED, "XStat"),
        ],
    )
    for name, number, value in (("event_metadata", 4, "XEventMetadata"), ("stat_metadata", 5, "XStatMetadata")):
        entry_type = _map_entry(f, plane, f"{name.title().replace('_', '')}Entry", value)
        plane.field.add(name=name, number=number, type=_MESSAGE, label=_REPEATED, type_name=entry_type)
    _message(
        f,
        "XSpace",
        [
            ("planes", 1, _MESSAGE, _REPEATED, "XPlane"),
            ("errors", 2, _STRING, _REPEATED),
            ("warnings", 3, _STRING, _REPEATED),
            ("hostnames", 4, _STRING, _REPEATED),
        ],
    )
    return f


def _build_hlo_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="xdiag/hlo_subset.proto", package="xdiag.hlo", syntax="proto2")
    _message(f, "LayoutProto", [("minor_to_major", 1, _INT64, _REPEATED), ("memory_space", 8, _INT64, _OPTIONAL)])
    # operand_precision: DEFAULT 0, HIGH 1, HIGHEST 2 per operand of a dot or convolution (xla_data.proto).
    _message(f, "PrecisionConfig", [("operand_precision", 1, _INT32, _REPEATED)])
    _message(f, "WindowDimension", [("size", 1, _INT64, _OPTIONAL), ("stride", 2, _INT64, _OPTIONAL),
                                    ("base_dilation", 6, _INT64, _OPTIONAL)])
    _message(f, "Window", [("dimensions", 1, _MESSAGE, _REPEATED, "WindowDimension")])
    _message(
        f,
        "DotDimensionNumbers",
        [
            ("lhs_contracting_dimensions", 1, _INT64, _REPEATED),
            ("rhs_contracting_dimensions", 2, _INT64, _REPEATED),
            ("lhs_batch_dimensions", 3, _INT64, _REPEATED),
            ("rhs_batch_dimensions", 4, _INT64, _REPEATED),
        ],
    )
    _message(
        f,
        "ConvolutionDimensionNumbers",
        [("kernel_input_feature_dimension", 3, _INT64, _OPTIONAL), ("kernel_spatial_dimensions", 6, _INT64, _REPEATED),
         ("input_spatial_dimensions", 11, _INT64, _REPEATED), ("output_spatial_dimensions", 12, _INT64, _REPEATED)],
    )
    _message(f, "InstructionSequence", [("instruction_ids", 1, _INT64, _REPEATED)])
    schedule = _message(f, "HloScheduleProto", [])
    schedule.field.add(name="sequences", number=1, type=_MESSAGE, label=_REPEATED,
                       type_name=_map_entry(f, schedule, "SequencesEntry", "InstructionSequence"))
    _message(
        f,
        "ShapeProto",
        [
            ("element_type", 2, _INT32, _OPTIONAL),
            ("dimensions", 3, _INT64, _REPEATED),
            ("tuple_shapes", 4, _MESSAGE, _REPEATED, "ShapeProto"),
            ("layout", 5, _MESSAGE, _OPTIONAL, "LayoutProto"),
        ],
    )
    # A constant's value (xla_data.proto LiteralProto): the integers a while loop's bound and step are read from.
    _message(f, "LiteralProto", [("shape", 1, _MESSAGE, _OPTIONAL, "ShapeProto"), ("s32s", 4, _INT32, _REPEATED),
                                 ("s64s", 5, _INT64, _REPEATED), ("u32s", 6, _INT64, _REPEATED),
                                 ("u64s", 7, _INT64, _REPEATED)])
    _message(
        f,
        "OpMetadata",
        [
            ("op_type", 1, _STRING, _OPTIONAL),
            ("op_name", 2, _STRING, _OPTIONAL),
            ("source_file", 3, _STRING, _OPTIONAL),
            ("source_line", 4, _INT32, _OPTIONAL),
            ("stack_frame_id", 15, _INT32, _OPTIONAL),
        ],
    )
    _message(
        f,
        "HloInstructionProto",
        [
            ("name", 1, _STRING, _OPTIONAL),
            ("opcode", 2, _STRING, _OPTIONAL),
            ("shape", 3, _MESSAGE, _OPTIONAL, "ShapeProto"),
            ("metadata", 7, _MESSAGE, _OPTIONAL, "OpMetadata"),
            ("literal", 8, _MESSAGE, _OPTIONAL, "LiteralProto"),
            ("parameter_number", 9, _INT64, _OPTIONAL),
            ("fusion_kind", 11, _STRING, _OPTIONAL),
            ("tuple_index", 13, _INT64, _OPTIONAL),
            ("dimensions", 14, _INT64, _REPEATED),
            ("window", 15, _MESSAGE, _OPTIONAL, "Window"),
            ("convolution_dimension_numbers", 16, _MESSAGE, _OPTIONAL, "ConvolutionDimensionNumbers"),
            ("custom_call_target", 28, _STRING, _OPTIONAL),
            ("dot_dimension_numbers", 30, _MESSAGE, _OPTIONAL, "DotDimensionNumbers"),
            ("id", 35, _INT64, _OPTIONAL),
            ("operand_ids", 36, _INT64, _REPEATED),
            ("called_computation_ids", 38, _INT64, _REPEATED),
            ("backend_config", 43, _BYTES, _OPTIONAL),
            ("is_host_transfer", 47, _BOOL, _OPTIONAL),
            ("precision_config", 51, _MESSAGE, _OPTIONAL, "PrecisionConfig"),
            ("comparison_direction", 63, _STRING, _OPTIONAL),
            # a scatter's or gather's promise that its indices are sorted (jax's indices_are_sorted=True)
            ("indices_are_sorted", 67, _BOOL, _OPTIONAL),
        ],
    )
    _message(
        f,
        "HloComputationProto",
        [
            ("name", 1, _STRING, _OPTIONAL),
            ("instructions", 2, _MESSAGE, _REPEATED, "HloInstructionProto"),
            ("id", 5, _INT64, _OPTIONAL),
            ("root_id", 6, _INT64, _OPTIONAL),
        ],
    )
    # input_output_alias: which of the entry's parameters (donated arguments) share a buffer with an output.
    _message(f, "AliasEntryProto", [("output_shape_index", 1, _INT64, _REPEATED), ("parameter_number", 2, _INT64, _OPTIONAL),
                                    ("parameter_shape_index", 3, _INT64, _REPEATED), ("kind", 4, _INT32, _OPTIONAL)])
    _message(f, "HloInputOutputAliasProto", [("entries", 1, _MESSAGE, _REPEATED, "AliasEntryProto")])
    # The module's Python stacks (hlo.proto StackFrameIndexProto): four flat arrays whose ids are 1-based positions,
    # 0 meaning none; an op's OpMetadata.stack_frame_id is its innermost frame, each frame names its caller's.
    _message(f, "FileLocation", [("file_name_id", 1, _INT32, _OPTIONAL), ("function_name_id", 2, _INT32, _OPTIONAL),
                                 ("line", 3, _INT32, _OPTIONAL), ("column", 4, _INT32, _OPTIONAL)])
    _message(f, "StackFrame", [("file_location_id", 1, _INT32, _OPTIONAL), ("parent_frame_id", 2, _INT32, _OPTIONAL)])
    _message(
        f,
        "StackFrameIndexProto",
        [
            ("file_names", 1, _STRING, _REPEATED),
            ("function_names", 2, _STRING, _REPEATED),
            ("file_locations", 3, _MESSAGE, _REPEATED, "FileLocation"),
            ("stack_frames", 4, _MESSAGE, _REPEATED, "StackFrame"),
        ],
    )
    _message(
        f,
        "HloModuleProto",
        [
            ("name", 1, _STRING, _OPTIONAL),
            ("entry_computation_name", 2, _STRING, _OPTIONAL),
            ("computations", 3, _MESSAGE, _REPEATED, "HloComputationProto"),
            ("id", 5, _INT64, _OPTIONAL),
            ("entry_computation_id", 6, _INT64, _OPTIONAL),
            ("schedule", 7, _MESSAGE, _OPTIONAL, "HloScheduleProto"),
            ("input_output_alias", 8, _MESSAGE, _OPTIONAL, "HloInputOutputAliasProto"),
            ("stack_frame_index", 17, _MESSAGE, _OPTIONAL, "StackFrameIndexProto"),
        ],
    )
    _message(f, "HloProto", [("hlo_module", 1, _MESSAGE, _OPTIONAL, "HloModuleProto")])
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_xplane_file())
_POOL.Add(_build_hlo_file())


def _cls(full_name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


XSpace = _cls("xdiag.xplane.XSpace")
XPlane = _cls("xdiag.xplane.XPlane")
XLine = _cls("xdiag.xplane.XLine")
XEvent = _cls("xdiag.xplane.XEvent")
XStat = _cls("xdiag.xplane.XStat")
HloProto = _cls("xdiag.hlo.HloProto")

# xla::PrimitiveType values (xla_data.proto) to the names HLO text uses.
PRIMITIVE_TYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16",
    17: "token", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2", 28: "f8e4m3",
    29: "f8e3m4", 30: "f4e2m1fn", 31: "f8e8m0fnu", 32: "s1", 33: "u1",
}
BYTES_PER_ELEMENT = {
    "pred": 1, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u8": 1, "u16": 2, "u32": 4, "u64": 8,
    "f16": 2, "f32": 4, "f64": 8, "c64": 8, "bf16": 2, "c128": 16, "f8e5m2": 1, "f8e4m3fn": 1,
    "s4": 0.5, "u4": 0.5, "f8e4m3b11fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "s2": 0.25,
    "u2": 0.25, "f8e4m3": 1, "f8e3m4": 1, "f4e2m1fn": 0.5, "f8e8m0fnu": 1, "s1": 0.125, "u1": 0.125,
}
