"""The tables every tool builds first, stored with the prepared session so that each tool's process maps them.

In the cloud each tool runs in its own instance, on the prepared session (`xdiag.profile.compact`), and every one of
them would first build the same tables from the columns: the op table, the steps, and the per-step and per-device
rows. That is 0.08 s of each instance on a 20 MiB capture, 0.75 s on a 200 MiB one and 5-10 s on 2 GiB, which a
tool that then takes 0.1 ms pays in full. The stage that prepares the session (register during the quiet period,
else collect) builds them once (`export`) and stores them beside the columns; `adopt` puts them in a loaded
session's cache.

An op table is stored as its codes, times and distinct keys: its object columns (name, module, program id,
category, device) are functions of the op and device codes (`OpTable`), rebuilt by one gather each. Tables another
version of the analysis code stored are left out (their `code` digest differs), and the tools build their own.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from xdiag.analysis import breakdown, timeline
from xdiag.analysis.breakdown import DeviceRow, StepRow
from xdiag.analysis.timeline import OpTable, Step, StepSet
from xdiag.profile.space import Session

log = logging.getLogger(__name__)

FORMAT = 1
_STORED_COLUMNS = ("op", "device_code", "start_ps", "end_ps", "event_end_ps")
_SCALAR_KEY = "__numpy__"  # a key no row, device or category is named


@functools.cache
def code_digest() -> str:
    """A digest of the code the tables come from (this package and the profile package it reads through)."""
    digest = hashlib.sha256(str(FORMAT).encode())
    package = Path(__file__).resolve().parents[1]
    for path in sorted([*(package / "analysis").rglob("*.py"), *(package / "profile").rglob("*.py")]):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _typed(value: Any) -> Any:
    """A tree of the rows' values with each NumPy scalar marked by its type: a row's float64 is rounded as NumPy
    rounds, a float as Python does, and the tools' answers must not change with the tables' origin."""
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


def export(session: Session) -> dict[str, Any]:
    """The shared tables of the session (built here where not built yet), as `compact.save_session` stores them."""
    ops = timeline.op_table(session)
    steps = timeline.step_set(session)
    return {
        "code": code_digest(),
        "op_table": {
            "columns": {name: getattr(ops, name) for name in _STORED_COLUMNS},
            "op_keys": [list(key) for key in ops.op_keys],
            "op_categories": list(ops.op_categories),
            "device_labels": list(ops.device_labels),
        },
        "step_set": _typed({**dataclasses.asdict(steps), "steps": [dataclasses.astuple(step) for step in steps.steps]}),
        "step_rows": _typed([dataclasses.asdict(row) for row in breakdown.step_rows(session)]),
        "device_rows": _typed([dataclasses.asdict(row) for row in breakdown.device_rows(session)]),
    }


def _op_table(stored: dict[str, Any]) -> OpTable:
    columns = stored["columns"]
    keys = [tuple(key) for key in stored["op_keys"]]
    op, device_code = columns["op"], columns["device_code"]

    def per_op(values: list, dtype=object) -> np.ndarray:
        return np.array(values, dtype=dtype)[op] if values else np.empty(0, dtype)

    return OpTable(
        name=per_op([key[2] for key in keys]),
        module=per_op([key[0] for key in keys]),
        program_id=per_op([key[1] for key in keys], np.int64),
        category=per_op(stored["op_categories"]),
        device=np.array(stored["device_labels"], dtype=object)[device_code] if stored["device_labels"] else
        np.empty(0, object),
        **columns,
        op_keys=tuple(keys),
        op_categories=tuple(stored["op_categories"]),
        device_labels=tuple(stored["device_labels"]),
    )


def adopt(session: Session) -> bool:
    """Puts the tables a prepared file carried in the session's cache; False (and nothing put) where it carried
    none, tables of other code, or tables that do not decode (the tools then build their own)."""
    stored, session.stored_tables = session.stored_tables, {}
    if not stored or stored.get("code") != code_digest():
        return False
    try:
        step_set = _untyped(stored["step_set"])
        tables = {
            "op_table": _op_table(stored["op_table"]),
            "step_set": StepSet(**{**step_set, "steps": [Step(*step) for step in step_set["steps"]]}),
            "step_rows": [StepRow(**row) for row in _untyped(stored["step_rows"])],
            "device_rows": [DeviceRow(**row) for row in _untyped(stored["device_rows"])],
        }
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.warning("the prepared session of %s carries tables that do not decode (%s: %s); the tools build them",
                    session.name, type(exc).__name__, exc)
        return False
    for key, table in tables.items():
        session.cache.setdefault(key, table)
    return True
