"""Stored rows (xdiag.analysis.prepared's columns) held as arrays: what a session assembled from many hosts keeps of
their per-step tables.

A session of 128 hosts has ~30,000 step rows of ~20 values each. As JSON lists, or as the row objects the tools
read, they are 20-30 MiB that grow with every host; as one array per column they are ~5 MiB, and the row objects are
made once, where the tools ask for them. A column keeps what its values were: NumPy scalars (`kind` is their
dtype) come back as NumPy scalars and Python numbers as Python numbers, since a float64 rounds as NumPy rounds and the
tools' answers must not change with where the rows came from; text (and None) is held once per distinct value.

`pack` takes stored columns (`_as_columns`), `joined` puts several hosts' one after another, `rows` makes the row
objects, and `encode`/`decode` write a packed table as JSON (arrays compressed, in base64).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from xdiag.analysis.prepared import _as_columns, _nested_rows, _typed, _untyped

_PYTHON_NUMBERS = {int: "<i8", float: "<f8"}


def _packed_column(column: dict[str, Any]) -> dict[str, Any]:
    kind, values = column["kind"], column["values"]
    if kind and np.dtype(kind).kind in "biuf":  # NumPy numbers of one type
        return {"kind": kind, "array": np.asarray(values, dtype=kind)}
    if kind == "":
        types = {type(value) for value in values}
        if len(types) == 1 and (number := _PYTHON_NUMBERS.get(types.pop())):
            if number == "<f8" or all(abs(value) < 2**63 for value in values):
                return {"kind": "", "array": np.asarray(values, dtype=number)}
        elif all(value is None or isinstance(value, str) for value in values):
            categories = list(dict.fromkeys(values))
            index = {value: k for k, value in enumerate(categories)}
            return {"kind": "", "categories": categories,
                    "codes": np.fromiter((index[value] for value in values), np.int32, len(values))}
    return {"kind": kind, "values": values}


def pack(stored: dict[str, Any]) -> dict[str, Any]:
    """Stored columns (`_as_columns`, JSON-typed) with each column of numbers or text as an array; stored rows
    (rows of differing shapes) as they are."""
    if "rows" in stored:
        return {"rows": stored["rows"]}
    return {"paths": stored["paths"], "columns": [_packed_column(column) for column in stored["columns"]]}


def _values(column: dict[str, Any]) -> list:
    if "array" in column:  # one object per distinct value (by its bits: -0.0 stays -0.0): they are immutable
        array = column["array"]
        bits, inverse = np.unique(array.view(f"<u{array.dtype.itemsize}"), return_inverse=True)
        distinct = bits.view(array.dtype)
        objects = list(distinct) if column["kind"] else distinct.tolist()
        return [objects[k] for k in inverse.tolist()]
    if "codes" in column:
        categories = column["categories"]
        return [categories[code] for code in column["codes"].tolist()]
    kind, values = column["kind"], column["values"]
    return _untyped(values) if kind is None else list(np.array(values, dtype=kind)) if kind else values


def size(packed: dict[str, Any]) -> int:
    """How many rows a packed table has."""
    if "rows" in packed:
        return len(packed["rows"])
    if not packed["columns"]:
        return 0
    column = packed["columns"][0]
    return len(column["array"] if "array" in column else column["codes"] if "codes" in column else column["values"])


def rename(packed: dict[str, Any], rename_text) -> dict[str, Any]:
    """The table with each text value (and each text in a row stored whole) passed through `rename_text`."""
    if "rows" in packed:
        return {"rows": _renamed_tree(packed["rows"], rename_text)}
    columns = []
    for column in packed["columns"]:
        if "categories" in column:
            column = {**column, "categories": [rename_text(v) if isinstance(v, str) else v
                                               for v in column["categories"]]}
        elif "values" in column:
            column = {**column, "values": _renamed_tree(column["values"], rename_text)}
        columns.append(column)
    return {"paths": packed["paths"], "columns": columns}


def _renamed_tree(value: Any, rename_text) -> Any:
    if isinstance(value, str):
        return rename_text(value)
    if isinstance(value, list):
        return [_renamed_tree(item, rename_text) for item in value]
    if isinstance(value, dict):
        return {key: _renamed_tree(item, rename_text) for key, item in value.items()}
    return value


def _shape(packed: dict[str, Any]) -> tuple | None:
    if "rows" in packed:
        return None
    return tuple(tuple(path) for path in packed["paths"]), tuple(
        (column["kind"], "array" in column and column["array"].dtype.str, "codes" in column)
        for column in packed["columns"])


def joined(parts: list[dict[str, Any]], shifts: list[int] | None = None) -> dict[str, Any]:
    """Several hosts' packed tables, one host after another, each host's start_ps and end_ps moved by its shift:
    array by array where the hosts' columns agree, else row by row."""
    shifts = shifts or [0] * len(parts)
    kept = [(part, shift) for part, shift in zip(parts, shifts) if size(part)]
    if not kept:
        return pack(_as_columns([]))
    shape = _shape(kept[0][0])
    if shape is not None and all(_shape(part) == shape for part, _ in kept):
        paths = kept[0][0]["paths"]
        columns = []
        for index, path in enumerate(paths):
            moved = path in (["start_ps"], ["end_ps"])
            first = kept[0][0]["columns"][index]
            if "array" in first:
                arrays = [part["columns"][index]["array"] + (shift if moved else 0) for part, shift in kept]
                columns.append({"kind": first["kind"], "array": np.concatenate(arrays)})
            elif "codes" in first:
                categories: dict[Any, int] = {}
                codes = []
                for part, _ in kept:
                    column = part["columns"][index]
                    remap = np.array([categories.setdefault(v, len(categories)) for v in column["categories"]],
                                     np.int32)
                    codes.append(remap[column["codes"]] if len(remap) else column["codes"])
                columns.append({"kind": first["kind"], "categories": list(categories),
                                "codes": np.concatenate(codes)})
            elif moved:
                break  # times to move that are neither numbers nor text: row by row, below
            else:
                columns.append({"kind": first["kind"],
                                "values": [v for part, _ in kept for v in part["columns"][index]["values"]]})
        else:
            return {"paths": paths, "columns": columns}
    rows = []
    for part, shift in kept:
        rows += [{**row, **{key: row[key] + shift for key in ("start_ps", "end_ps") if key in row}}
                 for row in _dict_rows(part)]
    return {"rows": _typed(rows)}


def _dict_rows(packed: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The rows one at a time (as dicts of the fields): whoever makes objects of them never holds both."""
    if "rows" in packed:
        yield from _untyped(packed["rows"])
        return
    yield from _nested_rows(packed["paths"], [_values(column) for column in packed["columns"]])


def rows(packed: dict[str, Any], kind: type) -> list:
    """The table's rows as `kind` objects (a dataclass of the table's fields)."""
    return [kind(**row) for row in _dict_rows(packed)]


def encode(packed: dict[str, Any]) -> dict[str, Any]:
    """A packed table as JSON: each array as its dtype and its bytes, compressed, in base64 (the assembled session is
    held whole by whoever reads it; times and counts of steps compress several-fold)."""
    if "rows" in packed:
        return packed
    columns = []
    for column in packed["columns"]:
        out = {key: value for key, value in column.items() if key not in ("array", "codes")}
        for key in ("array", "codes"):
            if key in column:
                array = np.ascontiguousarray(column[key])
                out[key] = {"dtype": array.dtype.str,
                            "zlib_b64": base64.b64encode(zlib.compress(array.tobytes(), 1)).decode()}
        columns.append(out)
    return {"paths": packed["paths"], "columns": columns}


def decode(stored: dict[str, Any]) -> dict[str, Any]:
    """A packed table from its JSON (`encode`)."""
    if "rows" in stored:
        return stored
    columns = []
    for column in stored["columns"]:
        column = dict(column)
        for key in ("array", "codes"):
            if key in column:
                column[key] = np.frombuffer(zlib.decompress(base64.b64decode(column[key]["zlib_b64"])),
                                            dtype=column[key]["dtype"])
        columns.append(column)
    return {"paths": stored["paths"], "columns": columns}
