"""The read-once session as one file: written after the first read, memory-mapped by every later reader.

In the cloud, `collect` reads a session's xplane files once and stores this file next to them;
the 15 parallel `run_tool` invocations then map it instead of re-parsing the profile (for a 2 GiB
profile: seconds instead of half a minute each, and the columns are shared page cache, not copies).

Layout: an 8-byte magic, the header's length (8 bytes, little endian), a JSON header describing
every plane, line and HLO module, then the raw column arrays, each 64-byte aligned. Arrays are
described by dtype, shape and offset, and come back as read-only `np.memmap` views; a line's times
are stored packed, as read (`TimeColumn`: values, scale and base). The header also carries the tables
derived from the session that its writer gave (`xdiag.analysis.prepared`: the op table and the steps every
tool builds first), their arrays in the same data section.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from xdiag.errors import ProfileError
from xdiag.fresh_files import replacing
from xdiag.profile.space import (
    NO_VALUE,
    HloComputation,
    HloInstruction,
    HloModule,
    HostProfile,
    Line,
    Plane,
    Session,
    StatColumns,
    TimeColumn,
)

MAGIC = b"XDIAGS05"
"""Its last two digits: the version of the layout and of what the reader stores (02: a Kineto trace's CPU ops carry
their recorded inputs, costed by the analysis, not their FLOPs; 03: an HLO module's donated parameters; 04: its
Python stack frames; 05: parameter numbers, tuple indices, comparisons, dimensions and each computation's root, which
the idiom recognisers read); a file of another version is refused."""
FILE_SUFFIX = f".s{MAGIC[-2:].decode()}.xdiag"
"""A stored session's file name ends with its version, so that files of an earlier version, left in a bucket by a
deploy before, are never looked for (they are decoded again, not refused)."""
ALIGN = 64
ARRAY_KEY = "__array__"  # a stored table that is an array: where it is in the data section


class _Layout:
    """Assigns each array an aligned offset in the data section; the arrays are written after the header."""

    def __init__(self):
        self.arrays: list[tuple[int, np.ndarray]] = []
        self._offset = 0

    def array(self, values: np.ndarray) -> dict[str, Any]:
        values = np.ascontiguousarray(values)
        self._offset += -self._offset % ALIGN
        ref = {"dtype": values.dtype.str, "shape": list(values.shape), "offset": self._offset}
        self.arrays.append((self._offset, values))
        self._offset += values.nbytes
        return ref


def _plain(value: Any) -> Any:
    """Stat values as JSON can hold them (bytes are dropped: the analyses never read them)."""
    if isinstance(value, (bytes, bytearray)):
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value


def _columns(layout: _Layout, columns: StatColumns) -> dict[str, Any]:
    out = {}
    for name in columns.keys():
        index, values = columns.sparse(name)
        out[name] = {"index": layout.array(index), "values": layout.array(values)}
    return out


def module_from_record(record: dict[str, Any]) -> HloModule:
    """The HLO module of a `module_record`."""
    return HloModule(
        name=record["name"], program_id=record["program_id"], entry=record["entry"], host=record["host"],
        computations={n: HloComputation(n, [_instruction(r) for r in rows], record.get("roots", {}).get(n, ""))
                      for n, rows in record["computations"].items()},
        donated_parameters=frozenset(record["donated_parameters"]),
        stack_frames=tuple(tuple(f) for f in record["stack_frames"]),
    )


def module_record(module: HloModule) -> dict[str, Any]:
    """An HLO module as JSON holds it (module_from_record reads it back)."""
    return {
        "name": module.name, "program_id": module.program_id, "entry": module.entry, "host": module.host,
        "donated_parameters": sorted(module.donated_parameters),
        "computations": {
            name: [
                [i.name, i.opcode, i.dtype, list(i.dims), list(i.layout), list(i.operands), i.fusion_kind, i.op_name,
                 i.source, list(i.called), [[t, list(d)] for t, d in i.tuple_shapes], i.custom_call_target,
                 list(i.lhs_contracting), list(i.lhs_batch), list(i.conv_kernel_dims), i.fusion_backend_kind,
                 i.memory_space,
                 list(i.kernel_cost_estimate), list(i.tuple_memory_spaces), i.is_host_transfer, list(i.operand_precision),
                 list(i.attention_scores), i.attention_causal, i.conv_is_matrix_product, i.kernel_position_mask,
                 i.stack_frame_id, i.trip_count, i.parameter_number, i.tuple_index, i.comparison,
                 list(i.dimensions), i.indices_are_sorted, i.integer_value]
                for i in computation.instructions
            ]
            for name, computation in module.computations.items()
        },
        "roots": {name: computation.root for name, computation in module.computations.items()},
        "stack_frames": [list(f) for f in module.stack_frames],
    }


def _stored(tables: dict[str, Any], layout: _Layout) -> dict[str, Any]:
    """Each table that is a numeric array goes to the data section, replaced by its reference; the others stay as
    they are (JSON)."""
    out = {}
    for key, value in tables.items():
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise TypeError(f"table {key}: object arrays cannot be stored; store codes and the values they index")
            value = {ARRAY_KEY: layout.array(value)}
        out[key] = value
    return out


def _loaded(tables: dict[str, Any], mapped: np.memmap) -> dict[str, Any]:
    return {key: _array(mapped, value[ARRAY_KEY]) if isinstance(value, dict) and ARRAY_KEY in value else value
            for key, value in tables.items()}


def _text_of_bytes(value: Any) -> str:
    """A string of the profile that was not valid UTF-8 (protobuf hands those over as bytes: an HLO name in a corrupt
    file), stored decoded with replacement characters; anything else JSON cannot hold is a TypeError."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} cannot be stored in a session's header")


def save_session(session: Session, path: Path, tables: dict[str, Any] | None = None) -> int:
    """Writes the session to `path` (atomically); returns its size in bytes. `tables` (derived from the session, by
    name: numeric arrays, or anything JSON holds) travel with it and come back as the loaded session's
    `stored_tables`, the arrays memory-mapped like the columns."""
    layout = _Layout()
    hosts = []
    last_array = []  # per host, how many arrays the layout holds once its columns are in
    for host in session.hosts:
        planes = []
        for plane in host.planes:
            lines = [
                {
                    "id": line.id, "name": line.name, "display_name": line.display_name,
                    "timestamp_ns": line.timestamp_ns,
                    "metadata_id": layout.array(line.metadata_id),
                    "start_ps": layout.array(line.starts.values),
                    "start_scale": line.starts.scale, "start_base": line.starts.base,
                    "duration_ps": layout.array(line.durations.values),
                    "duration_scale": line.durations.scale, "duration_base": line.durations.base,
                    "numeric": _columns(layout, line.numeric),
                    "strings": _columns(layout, line.strings),
                }
                for line in plane.lines
            ]
            planes.append({
                "id": plane.id, "name": plane.name, "host": plane.host,
                "event_names": {str(k): v for k, v in plane.event_names.items()},
                "event_display_names": {str(k): v for k, v in plane.event_display_names.items()},
                "event_metadata_stats": {
                    str(k): {sk: _plain(sv) for sk, sv in stats.items()} for k, stats in plane.event_metadata_stats.items()
                },
                "stats": {k: _plain(v) for k, v in plane.stats.items()},
                "strings": plane.strings,
                "lines": lines,
            })
        hosts.append({
            "hostname": host.hostname, "path": str(host.path), "size_bytes": host.size_bytes,
            "errors": host.errors, "warnings": host.warnings, "planes": planes,
        })
        last_array.append(len(layout.arrays))
    header = {
        "name": session.name, "origin_ns": session.origin_ns, "hosts": hosts,
        "hlo_modules": [module_record(m) for m in session.hlo_modules],
        "tables": _stored(tables or {}, layout),
    }
    encoded = json.dumps(header, separators=(",", ":"), default=_text_of_bytes).encode()
    encoded += b" " * (-(len(MAGIC) + 8 + len(encoded)) % ALIGN)  # the data section starts aligned
    with replacing(path, mode=0o600) as handle:  # the decoded profile (HLO text included) is its user's alone
        handle.write(MAGIC + struct.pack("<Q", len(encoded)) + encoded)
        written, host = 0, 0
        for index, (offset, values) in enumerate(layout.arrays):
            while host < len(last_array) and index >= last_array[host]:  # a mapped host's columns are all written:
                session.hosts[host].release_pages()  # its pages go back (a many-host session is written host by host)
                host += 1
            handle.write(b"\0" * (offset - written))
            handle.write(memoryview(values).cast("B"))
            written = offset + values.nbytes
    return path.stat().st_size


def _array(mapped: np.memmap, ref: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(ref["dtype"])
    count = int(np.prod(ref["shape"])) if ref["shape"] else 1
    return mapped[ref["offset"] : ref["offset"] + count * dtype.itemsize].view(dtype).reshape(ref["shape"])


def _stat_columns(mapped, spec: dict[str, Any], size: int, fill: int, dtype) -> StatColumns:
    columns = StatColumns(size, fill, dtype)
    for name, ref in spec.items():
        columns.put(name, _array(mapped, ref["index"]), _array(mapped, ref["values"]))
    return columns


def _times(mapped, line: dict[str, Any], column: str) -> TimeColumn:
    # Files written before times were packed hold int64 ps and no scale or base.
    return TimeColumn(_array(mapped, line[f"{column}_ps"]), line.get(f"{column}_scale", 1), line.get(f"{column}_base", 0))


def _instruction(row: list) -> HloInstruction:
    (name, opcode, dtype, dims, layout, operands, fusion_kind, op_name, source, called, tuple_shapes, target, lhs) = row[:13]
    lhs_batch = row[13] if len(row) > 13 else []  # files written before batch dimensions were kept
    conv_kernel_dims = row[14] if len(row) > 14 else []  # files written before convolutions were costed
    fusion_backend_kind = row[15] if len(row) > 15 else ""
    memory_space = row[16] if len(row) > 16 else 0  # files written before memory spaces were kept
    kernel_cost_estimate = row[17] if len(row) > 17 else []
    tuple_memory_spaces, is_host_transfer = row[18:20] if len(row) > 19 else ([], False)  # before they were kept
    precision = row[20] if len(row) > 20 else []  # before operand precision was kept
    attention_scores, attention_causal = row[21:23] if len(row) > 22 else ([], False)  # before attention was costed
    conv_is_matrix_product = row[23] if len(row) > 23 else False  # before matmul convolutions were told apart
    kernel_position_mask = row[24] if len(row) > 24 else False  # before Pallas kernels' masks were read
    stack_frame_id = row[25] if len(row) > 25 else 0  # before stacks were kept
    trip_count = row[26] if len(row) > 26 else 0  # before loops' trip counts were read
    parameter_number, tuple_index, comparison, dimensions = row[27:31] if len(row) > 30 else (-1, -1, "", [])
    indices_are_sorted = row[31] if len(row) > 31 else False  # before scatters' sorted indices were read
    integer_value = row[32] if len(row) > 32 else None  # before integer constants' values were read
    return HloInstruction(
        name=name, opcode=opcode, dtype=dtype, dims=tuple(dims), layout=tuple(layout), operands=tuple(operands),
        fusion_kind=fusion_kind, op_name=op_name, source=source, called=tuple(called),
        tuple_shapes=tuple((t, tuple(d)) for t, d in tuple_shapes), custom_call_target=target, lhs_contracting=tuple(lhs),
        lhs_batch=tuple(lhs_batch), conv_kernel_dims=tuple(conv_kernel_dims),
        fusion_backend_kind=fusion_backend_kind, memory_space=memory_space,
        kernel_cost_estimate=tuple(kernel_cost_estimate),
        tuple_memory_spaces=tuple(tuple_memory_spaces), is_host_transfer=bool(is_host_transfer),
        operand_precision=tuple(precision), attention_scores=tuple(attention_scores),
        attention_causal=bool(attention_causal), conv_is_matrix_product=bool(conv_is_matrix_product),
        kernel_position_mask=bool(kernel_position_mask), stack_frame_id=int(stack_frame_id),
        trip_count=int(trip_count), parameter_number=int(parameter_number), tuple_index=int(tuple_index),
        comparison=str(comparison), dimensions=tuple(dimensions), indices_are_sorted=bool(indices_are_sorted),
        integer_value=None if integer_value is None else int(integer_value),
    )


def load_session(path: Path) -> Session:
    """Maps a file written by save_session; raises ProfileError if it is not one."""
    with path.open("rb") as handle:
        head = handle.read(len(MAGIC) + 8)
        if len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] != MAGIC:
            raise ProfileError(f"{path.name}: not an xdiag session file")
        (length,) = struct.unpack("<Q", head[len(MAGIC) :])
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise ProfileError(f"{path.name}: corrupt session header ({exc})") from None
    data_start = len(MAGIC) + 8 + length
    mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start) if path.stat().st_size > data_start else np.empty(0, np.uint8)
    hosts = []
    for h in header["hosts"]:
        planes = []
        for p in h["planes"]:
            lines = []
            for ln in p["lines"]:
                metadata_id = _array(mapped, ln["metadata_id"])
                size = len(metadata_id)
                lines.append(Line(
                    id=ln["id"], name=ln["name"], display_name=ln["display_name"], timestamp_ns=ln["timestamp_ns"],
                    metadata_id=metadata_id,
                    starts=_times(mapped, ln, "start"),
                    durations=_times(mapped, ln, "duration"),
                    numeric=_stat_columns(mapped, ln["numeric"], size, NO_VALUE, np.int64),
                    strings=_stat_columns(mapped, ln["strings"], size, -1, np.int32),
                ))
            planes.append(Plane(
                id=p["id"], name=p["name"], host=p["host"],
                event_names={int(k): v for k, v in p["event_names"].items()},
                event_display_names={int(k): v for k, v in p["event_display_names"].items()},
                event_metadata_stats={int(k): v for k, v in p["event_metadata_stats"].items()},
                stats=p["stats"], strings=p["strings"], lines=lines,
            ))
        hosts.append(HostProfile(
            hostname=h["hostname"], path=Path(h["path"]), size_bytes=h["size_bytes"], planes=planes,
            errors=h["errors"], warnings=h["warnings"], pages=mapped,
        ))
    modules = [module_from_record(m) for m in header["hlo_modules"]]
    return Session(name=header["name"], hosts=hosts, hlo_modules=modules, origin_ns=header["origin_ns"],
                   stored_tables=_loaded(header.get("tables", {}), mapped))
