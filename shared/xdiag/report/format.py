"""Values and tables for the report: numbers formatted for reading, any list of dicts as a bounded table.

Everything here returns plain text; the template escapes it. Nothing is marked safe.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

MISSING = "n/a"
MAX_ROWS = 30
MAX_CELL_CHARS = 80
_BREAK_AFTER = re.compile(r"(?<=[,/_])")

_TOKENS = {
    "percent": "%", "ms": "ms", "us": "µs", "ns": "ns", "gib": "GiB", "mib": "MiB", "kib": "KiB", "gb": "GB",
    "gflops": "GFLOP", "tflops": "TFLOP", "flops": "FLOP", "teraflops": "TFLOP", "gibs": "GiB/s",
    "hlo": "HLO", "xla": "XLA", "id": "id", "cv": "CV", "oom": "OOM", "cpu": "CPU", "gpu": "GPU", "tpu": "TPU",
    "hbm": "HBM", "bw": "bandwidth", "llo": "LLO", "kpi": "KPI", "xprof": "XProf", "mxu": "MXU",
}


def humanize_key(key: str) -> str:
    """`share_of_op_time_percent` -> `share of op time %`, `achieved_gib_per_s` -> `achieved GiB/s`."""
    words = [_TOKENS.get(w.lower(), w) for w in str(key).split("_") if w]
    text = " ".join(words)
    return re.sub(r" per (\S+)", r"/\1", text)


def format_number(value: float) -> str:
    """Ints with thousands separators; floats to at most 4 significant digits (whole numbers from 1,000 up)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e15:
        return f"{value:.4g}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 1e-4:
        text = f"{value:.4g}"
        return text
    return f"{value:.3g}"


def format_value(value: Any) -> str:
    """Any JSON-ish value as one line of text; None is MISSING."""
    if value is None:
        return MISSING
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (bool, int, float)):
        return format_number(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) if value else "–"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(format_value(v) for v in value) if value else "–"
    return str(value)


@dataclass
class Cell:
    text: str  # what is shown (possibly truncated)
    full: str | None = None  # the whole text, for the title attribute, when `text` was cut
    numeric: bool = False
    missing: bool = False
    tone: str = ""  # ok / warn / bad: a status word the template colours
    wrap: bool = True  # False: never break inside (tool names in the evidence table)

    @property
    def segments(self) -> list[str]:
        """`text` cut after , / _ where it has no spaces: the template puts a <wbr> between segments, so
        shapes and op names can wrap in a narrow column instead of widening the table."""
        if not self.wrap or self.numeric or " " in self.text or len(self.text) <= 14:
            return [self.text]
        return [s for s in _BREAK_AFTER.split(self.text) if s]

    @property
    def long(self) -> bool:
        return self.text.count(" ") >= 3 and len(self.text) > 30  # prose, not a short list


STATUS_TONES = {
    "ok": "ok", "optimal": "ok", "low": "ok",
    "not_available": "warn", "needs_attention": "warn", "medium": "warn",
    "failed": "bad", "high": "bad",
}


def tone_of(value: Any) -> str:
    text = value.value if isinstance(value, Enum) else value
    return STATUS_TONES.get(text.lower(), "") if isinstance(text, str) else ""


def cell(value: Any, max_chars: int = MAX_CELL_CHARS, tone: str = "") -> Cell:
    text = format_value(value)
    full = None
    if len(text) > max_chars:
        full, text = text, text[: max_chars - 1] + "…"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return Cell(text=text, full=full, numeric=numeric, missing=value is None, tone=tone)


def format_bytes(size: Any) -> str:
    if not isinstance(size, (int, float)) or isinstance(size, bool):
        return format_value(size)
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{format_number(size / factor)} {unit} ({format_number(int(size))} bytes)"
    return f"{format_number(int(size))} bytes"


_TONED_KEYS = {"status", "oom_risk"}
_UNBROKEN_KEYS = {"tool"}  # tool names stay whole: they are what a reader searches for


def _is_identifier(key: str) -> bool:
    """Numbers that name something (program ids, step numbers) read as written: 4642, not 4,642."""
    k = str(key).lower()
    return k in ("id", "step", "rank", "pid", "tid") or k.endswith(("_id", "_ordinal", "_num"))


def _table_cell(key: str, value: Any) -> Cell:
    if _is_identifier(key) and isinstance(value, int) and not isinstance(value, bool):
        return Cell(text=str(value), numeric=True)
    c = cell(value, tone=tone_of(value) if key in _TONED_KEYS else "")
    c.wrap = key not in _UNBROKEN_KEYS
    return c


@dataclass
class Column:
    key: str
    label: str


@dataclass
class Table:
    columns: list[Column]
    rows: list[list[Cell]]
    total: int  # rows in the data; `rows` holds at most MAX_ROWS of them
    caption: str = ""

    @property
    def truncated(self) -> bool:
        return self.total > len(self.rows)


def table(
    rows: Iterable[Any] | None,
    preferred: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    limit: int = MAX_ROWS,
    caption: str = "",
    skip: Sequence[str] = (),
    only: Sequence[str] | None = None,
) -> Table | None:
    """Any list of flat dicts (or of scalars) as a table: the `preferred` keys first, then every other key
    in the order first seen, so fields a tool adds later appear without template changes
    (`only`: just the preferred keys; `skip`: keys left out)."""
    items = list(rows or [])
    if not items:
        return None
    labels = labels or {}
    if not all(isinstance(r, Mapping) for r in items):
        items = [r if isinstance(r, Mapping) else {"value": r} for r in items]
    keys: list[str] = [k for k in preferred if any(k in r for r in items)]
    if only is None:
        for r in items:
            keys.extend(k for k in r if k not in keys and k not in skip)
    columns = [Column(key=k, label=labels.get(k, humanize_key(k))) for k in keys]
    body = [
        [_table_cell(k, r[k]) if k in r else Cell(text="", missing=True) for k in keys]
        for r in items[:limit]
    ]
    return Table(columns=columns, rows=body, total=len(items), caption=caption)


@dataclass
class KeyValue:
    label: str
    key: str
    value: Cell

    @property
    def wide(self) -> bool:
        return len(self.value.text) > 36


def key_values(data: Mapping[str, Any] | None, skip: Sequence[str] = (), max_chars: int = 160) -> list[KeyValue]:
    """A summary dict as label/value rows (nested dicts and lists on one line)."""
    rows = []
    for k, v in (data or {}).items():
        if k not in skip:
            value = _table_cell(k, v) if _is_identifier(k) else cell(v, max_chars)
            rows.append(KeyValue(label=humanize_key(k), key=str(k), value=value))
    return rows


@dataclass
class Block:
    """One piece of a report section, rendered by kind: kv, table, chart, text."""

    kind: str
    title: str = ""
    kv: list[KeyValue] = field(default_factory=list)
    table: Table | None = None
    svg: Any = None  # markupsafe.Markup built from escaped parts only (see charts)
    legend: list[tuple[str, str, str]] = field(default_factory=list)  # (label, color, value text)
    text: str = ""
    muted: bool = False
