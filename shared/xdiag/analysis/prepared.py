"""The tables every tool builds first, stored with the prepared session so that each tool's process maps them.

In the cloud each tool runs in its own instance, on the prepared session (`xdiag.profile.compact`), and every one of
them would first build the same tables from the columns: the op table, the steps, and the per-step and per-device
rows. That is 0.08 s of each instance on a 20 MiB capture, 0.4-0.7 s on a 200 MiB one and 5-9 s on 2 GiB, which a
tool that then takes 0.1 ms pays in full. The stage that prepares the session (register during the quiet period,
else collect) builds them once (`export`) and stores them beside the columns; `adopt` puts them in a loaded
session's cache.

An op table is stored as it is held, its codes, times and distinct keys (its names, categories and devices are
gathered from the codes where a tool reads them: `OpTable`). Tables another version of the analysis code stored
are left out (their `code` digest differs), and the tools build their own.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from xdiag.analysis import breakdown
from xdiag.analysis.breakdown import StepRow
from xdiag.analysis.device_time import DeviceRow
from xdiag.analysis.op_table import OpTable, op_table
from xdiag.analysis.steps import Step, StepSet, step_set
from xdiag.profile.space import Session

log = logging.getLogger(__name__)

FORMAT = 1
_SCALAR_KEY = "__numpy__"  # a key no row, device or category is named


@functools.cache
def code_digest() -> str:
    """A digest of the code the tables come from (this package, the cost models it calls and the profile package it
    reads through)."""
    digest = hashlib.sha256(str(FORMAT).encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted([*(package / "analysis").rglob("*.py"), *(package / "cost").rglob("*.py"),
                        *(package / "profile").rglob("*.py")]):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _typed(value: Any) -> Any:
    """A tree with each NumPy scalar marked by its type: a row's float64 is rounded as NumPy rounds, a float as
    Python does, and the tools' answers must not change with the tables' origin."""
    if isinstance(value, np.generic):
        return {_SCALAR_KEY: value.dtype.str, "value": value.item()}
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_typed(item) for item in value]
    return value


def _untyped(value: Any) -> Any:
    if isinstance(value, dict):
        if _SCALAR_KEY in value:
            return np.dtype(value[_SCALAR_KEY]).type(value["value"])
        return {key: _untyped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_untyped(item) for item in value]
    return value


def _leaves(row: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in row.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _as_columns(rows: list[Any]) -> dict[str, Any]:
    """Dataclass rows as one column per field (per key of a dict field), each column's NumPy type said once: tens of
    thousands of steps decode in a few gathers, not a walk over every value. Rows of differing shapes are stored
    value by value."""
    leaves = [dict(_leaves(dataclasses.asdict(row))) for row in rows]
    paths = list(leaves[0]) if leaves else []
    if any(list(row) != paths for row in leaves):
        return {"rows": _typed([dataclasses.asdict(row) for row in rows])}
    columns = []
    for path in paths:
        values = [row[path] for row in leaves]
        kinds = {value.dtype.str if isinstance(value, np.generic) else "" for value in values}
        kind = kinds.pop() if len(kinds) == 1 else None
        columns.append({"kind": kind, "values": [value.item() for value in values] if kind else
                        values if kind == "" else _typed(values)})
    return {"paths": [list(path) for path in paths], "columns": columns}


def _from_columns(stored: dict[str, Any]) -> list[dict[str, Any]]:
    if "rows" in stored:
        return _untyped(stored["rows"])
    columns = []
    for column in stored["columns"]:
        kind, values = column["kind"], column["values"]
        columns.append(list(np.array(values, dtype=kind)) if kind else values if kind == "" else _untyped(values))
    return list(_nested_rows(stored["paths"], columns))


def _nested_rows(paths: list[list[str]], columns: list[list[Any]]) -> Iterator[dict[str, Any]]:
    """Rows (dicts, a dict field's keys nested under it) from one list of values per path, one row at a time."""
    for values in zip(*columns):
        row: dict[str, Any] = {}
        for path, value in zip(paths, values):
            target = row
            for key in path[:-1]:
                target = target.setdefault(key, {})
            target[path[-1]] = value
        yield row


def export(session: Session) -> dict[str, Any]:
    """The shared tables of the session (built here where not built yet), as `compact.save_session` stores them."""
    ops = op_table(session)
    steps = step_set(session)
    return {
        "code": code_digest(),
        # The events' ends are stored only where they differ from the ops' real ends (XLA:CPU's async ops).
        **{f"op_table.{name}": getattr(ops, name) for name in OpTable.STORED
           if not (name == "event_end_ps" and ops.ends_are_events_ends)},
        "op_table": {
            "op_keys": [list(key) for key in ops.op_keys],
            "op_categories": list(ops.op_categories),
            "device_labels": list(ops.device_labels),
        },
        "step_set": _typed({field.name: getattr(steps, field.name) for field in dataclasses.fields(steps)
                            if field.name != "steps"}),
        "steps": _as_columns(steps.steps),
        "step_rows": _as_columns(breakdown.step_rows(session)),
        "device_rows": _as_columns(breakdown.device_rows(session)),
    }


def _op_table(stored: dict[str, Any]) -> OpTable:
    keys = stored["op_table"]
    columns = {name: stored[f"op_table.{name}"] for name in OpTable.STORED if f"op_table.{name}" in stored}
    columns.setdefault("event_end_ps", columns["end_ps"])
    return OpTable(**columns,
                   op_keys=tuple(tuple(key) for key in keys["op_keys"]), op_categories=tuple(keys["op_categories"]),
                   device_labels=tuple(keys["device_labels"]))


def adopt(session: Session) -> bool:
    """Puts the tables a prepared file carried in the session's cache; False (and nothing put) where it carried
    none, tables of other code, or tables that do not decode (the tools then build their own)."""
    stored, session.stored_tables = session.stored_tables, {}
    if not stored or stored.get("code") != code_digest():
        return False
    try:
        steps = [Step(**row) for row in _from_columns(stored["steps"])]
        tables = {
            "op_table": _op_table(stored),
            "step_set": StepSet(**_untyped(stored["step_set"]), steps=steps),
            "step_rows": [StepRow(**row) for row in _from_columns(stored["step_rows"])],
            "device_rows": [DeviceRow(**row) for row in _from_columns(stored["device_rows"])],
        }
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.warning("the prepared session of %s carries tables that do not decode (%s: %s); the tools build them",
                    session.name, type(exc).__name__, exc)
        return False
    for key, table in tables.items():
        session.cache.setdefault(key, table)
    return True
