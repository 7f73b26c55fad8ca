"""Values and tables for the report: every number in a human unit and precision, checked before it is shown.

A field's unit comes from its name (`step_time_ms_mean`, `peak_hbm_gib`, `achieved_gib_per_s`, `…_percent`), the
convention every tool follows; the few device fields XProf names without a unit are listed in `BARE_UNITS`. One
function (`measure`) turns a (key, value) into text, so a number shown in several places reads the same in each.
A value outside its physical range (a share or efficiency above 100%, a rate above the device's peak) is shown
flagged, never as a measurement.

Everything here returns plain text; the template escapes it. Nothing is marked safe.
"""

from __future__ import annotations

import functools
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from markupsafe import escape

MISSING = "n/a"
MAX_ROWS = 30
MAX_CELL_CHARS = 80
SIGNIFICANT_DIGITS = 3
_BREAK_AFTER = re.compile(r"(?<=[,/_])|(?<=::)")
_LONG_WORD = 14  # characters: a shorter name never needs a break of its own
_LONG_WORD_IN_PROSE = 24  # in a sentence, words up to this wrap whole with the line ("(cuBLAS/hipBLASLt)")

_TOKENS = {
    "percent": "%", "ms": "ms", "us": "µs", "ns": "ns", "gib": "GiB", "mib": "MiB", "kib": "KiB", "gb": "GB",
    "gflops": "GFLOP", "tflops": "TFLOP", "flops": "FLOP", "teraflops": "TFLOP", "gibs": "GiB/s",
    "hlo": "HLO", "xla": "XLA", "id": "id", "cv": "CV", "oom": "OOM", "cpu": "CPU", "gpu": "GPU", "tpu": "TPU",
    "hbm": "HBM", "bw": "bandwidth", "llo": "LLO", "kpi": "KPI", "xprof": "XProf", "mxu": "MXU",
}

# Unit suffixes of field names, longest first: the label drops them (the value carries its unit).
_UNIT_SUFFIXES = (
    ("_flops_per_byte", "intensity"), ("_flop_per_byte", "intensity"),
    ("_gigabytes_per_second", "GB/s"), ("_gib_per_s", "GiB/s"), ("_gb_per_s", "GB/s"), ("_gibs", "GiB/s"),
    ("_teraflops_per_second", "TFLOP/s"), ("_gflops_per_s", "GFLOP/s"), ("_gflop_per_s", "GFLOP/s"),
    ("_tflops_per_s", "TFLOP/s"),
    ("_gflops", "GFLOP/s"), ("_tflops", "TFLOP/s"),
    ("_flops_per_run", "FLOP"), ("_flops", "FLOP"),
    ("_bytes_per_run", "B"), ("_bytes", "B"), ("_gib", "GiB"), ("_mib", "MiB"), ("_kib", "KiB"),
    ("_ms", "ms"), ("_us", "µs"), ("_ns", "ns"), ("_ps", "ps"),
    ("_percent", "%"), ("_pct", "%"),
)
BARE_UNITS = {
    # XProf's device fields carry no unit in their names: bytes/s, kHz, bytes.
    "memory_bandwidth": "B/s", "clock_rate": "kHz", "memory_size": "B", "bytes": "B", "size_bytes": "B",
    "flops_per_run": "FLOP", "bytes_per_run": "B", "ms": "ms", "shmem_bytes": "B", "mib": "MiB", "gib": "GiB",
}
# Fields named only by their unit: labelled by what they measure, since each value is shown in its own unit.
_QUANTITY_OF_UNIT = {"mib": "size", "gib": "size", "kib": "size", "bytes": "size", "b": "size", "ms": "time",
                     "us": "time", "µs": "time", "ns": "time", "gflop/s": "FLOP rate", "tflop/s": "FLOP rate",
                     "gb/s": "bandwidth", "gib/s": "bandwidth", "b/s": "bandwidth"}
# Percentages that are not shares of a whole may exceed 100 (how much slower the slowest host is, the spread).
_UNBOUNDED_PERCENT = ("spread", "cv", "growth", "increase", "skew", "slower", "change", "overhead_vs")
_IDENTIFIER_KEYS = ("id", "step", "rank", "pid", "tid")


def humanize_key(key: str) -> str:
    """`share_of_op_time_percent` -> `share of op time %`, `achieved_gib_per_s` -> `achieved GiB/s`."""
    words = [_TOKENS.get(w.lower(), w) for w in str(key).split("_") if w]
    text = " ".join(words)
    return re.sub(r" per (\S+)", r"/\1", text)


def label_of(key: str) -> str:
    """A field's label without its unit (the value says it): `step_time_ms_mean` -> `step time mean`,
    `achieved_gib_per_s` -> `achieved`, `share_of_op_time_percent` -> `share of op time`."""
    k = str(key)
    if k.lower() in _QUANTITY_OF_UNIT:
        return _QUANTITY_OF_UNIT[k.lower()]  # a column named by its unit holds values in any unit: '10 GiB' under MiB
    if not unit_of(k) or k.lower() in BARE_UNITS:
        return humanize_key(k)
    for suffix, _ in _UNIT_SUFFIXES:
        if k.endswith(suffix) and len(k) > len(suffix):
            return humanize_key(k[: -len(suffix)])
        inner = suffix + "_"
        if inner in k:
            head, tail = k.split(inner, 1)
            return humanize_key(f"{head}_{tail}") if head else humanize_key(tail)
    return humanize_key(k)


@functools.lru_cache(maxsize=4096)  # a report asks for the same few dozen keys once per table cell: thousands
def unit_of(key: str) -> str:
    """The unit a field's name declares ('' when none): '%', 'ms', 'µs', 'GiB', 'GiB/s', 'GFLOP/s', 'FLOP', …"""
    k = str(key).lower()
    if k in BARE_UNITS:
        return BARE_UNITS[k]
    if k.endswith(("_fraction", "_count", "_provenance")):
        return ""  # a ratio, a count or a word about FLOPs, not FLOPs
    for suffix, unit in _UNIT_SUFFIXES:
        if k.endswith(suffix) or suffix + "_" in k:
            return unit
    return ""


def _significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> str:
    """`value` to `digits` significant digits, no trailing zeros, thousands separators from 1,000 up."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10 ** digits:
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_number(value: float) -> str:
    """Ints with thousands separators; floats to 3 significant digits (whole numbers from 1,000 up)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value) or math.isinf(value):
        return MISSING
    magnitude = abs(value)
    if 0 < magnitude < 1e-3 or magnitude >= 1e15:
        return f"{value:.2e}"
    return _significant(value)


def _scaled(value: float, steps: Sequence[tuple[float, str]]) -> str:
    """`value` in the largest unit of `steps` (factor, name) it reaches, 3 significant digits."""
    for factor, name in steps:
        if abs(value) >= factor:
            return f"{_significant(value / factor)} {name}"
    factor, name = steps[-1]
    return f"{_significant(value / factor)} {name}"


_SECONDS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"), (1e-12, "ps"))
_BYTES = ((2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"), (1.0, "B"))
_BYTES_PER_S = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s"))
_FLOP_PER_S = ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s"), (1.0, "FLOP/s"))
_FLOP = ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1.0, "FLOP"))
_HERTZ = ((1e9, "GHz"), (1e6, "MHz"), (1e3, "kHz"), (1.0, "Hz"))
# Everything in one base unit per kind: seconds, bytes, bytes/s, FLOP/s, FLOP, Hz.
_TO_BASE = {
    "ms": (1e-3, _SECONDS), "µs": (1e-6, _SECONDS), "ns": (1e-9, _SECONDS), "ps": (1e-12, _SECONDS),
    "s": (1.0, _SECONDS),
    "B": (1.0, _BYTES), "KiB": (2.0**10, _BYTES), "MiB": (2.0**20, _BYTES), "GiB": (2.0**30, _BYTES),
    "B/s": (1.0, _BYTES_PER_S), "GiB/s": (2.0**30, _BYTES_PER_S), "GB/s": (1e9, _BYTES_PER_S),
    "FLOP/s": (1.0, _FLOP_PER_S), "GFLOP/s": (1e9, _FLOP_PER_S), "TFLOP/s": (1e12, _FLOP_PER_S), "FLOP": (1.0, _FLOP),
    "kHz": (1e3, _HERTZ),
}


def format_measure(value: Any, unit: str) -> str:
    """A number in a human unit: 219894.6 µs -> '220 ms', 1.31e3 ms -> '1.31 s', 2479.6 GiB/s -> '2.66 TB/s',
    918000 GFLOP/s -> '918 TFLOP/s', 21492671104 B -> '20 GiB', 96.55 % -> '96.5%', 34.3 FLOP/byte -> '34.3 FLOP/B'."""
    if value is None:
        return MISSING
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return format_value(value)
    if math.isnan(value) or math.isinf(value):
        return MISSING
    if unit == "%":
        return f"{_significant(value)}%"
    if unit == "intensity":
        return f"{_significant(value)} FLOP/B"
    if unit in _TO_BASE:
        factor, steps = _TO_BASE[unit]
        base = value * factor
        if base == 0:
            return "0"
        return _scaled(base, steps)
    return format_number(value)


def format_duration_ms(ms: Any) -> str:
    return format_measure(ms, "ms")


def format_percent(p: Any) -> str:
    return format_measure(p, "%")


def format_bytes(size: Any) -> str:
    return format_measure(size, "B")


VALUE_WORDS = {"at_bandwidth_roof": "near the HBM bandwidth roof", "below_bandwidth_roof": "far below the HBM bandwidth roof",
               "host_other": "other host work", "host_sync": "host sync"}
"""Values the tools write as keys, as the page says them (the tool's JSON keeps the key)."""


def metric_label(metric: str) -> str:
    """An evidence metric as a reader reads it: its last word, a field name, by its label (`paged_attention.4
    achieved_gb_per_s` -> `paged_attention.4 achieved`, `memory_passes` -> `memory passes`); its value says the unit."""
    head, _, last = str(metric).rpartition(" ")
    if "_" not in last or any(c in last for c in ".()[]/:"):
        return str(metric)
    return f"{head} {label_of(last)}" if head else label_of(last)


def format_value(value: Any) -> str:
    """Any JSON-ish value as one line of text; None is MISSING."""
    if value is None:
        return MISSING
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (bool, int, float)):
        return format_number(value)
    if isinstance(value, str):
        return VALUE_WORDS.get(value, value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) if value else "–"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(format_value(v) for v in value) if value else "–"
    return str(value)


def plain_text(text: str) -> str:
    """Text some converters hand over HTML-escaped (XProf's source locations: `&lt;embedded module …&gt;`),
    as plain text; the template escapes it once."""
    return html.unescape(text) if "&" in text else text


_PROSE_NUMBER = re.compile(
    r"(?<![\w.\[,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([+-]?\d+))?\s?(ms|µs|us|ns|s|%|GiB|MiB|GB/s|GiB/s|TFLOP/s|GFLOP/s)(?![\w/])"
)
_PROSE_UNITS = {"us": "µs"}
# A bare decimal with more digits than anyone reads ("20.017 of 31.2 GiB"); versions, addresses and times
# (2.24.2, 34.83.195.179, 03:12:34.522) are left alone by the look-arounds.
_PROSE_LONG_DECIMAL = re.compile(r"(?<![\w.:/-])\d+\.\d+(?![\w.])")


def humanize_numbers(text: str) -> str:
    """Numbers with a unit inside prose (finding texts, notes) in human precision and unit:
    '10462.4908 ms in total, mean 528714.873 µs' -> '10.5 s in total, mean 529 ms'; '41.87% …' -> '41.9% …'."""

    def repl(match: re.Match) -> str:
        whole, fraction, exponent, unit = match.groups()
        value = float(whole.replace(",", "") + (fraction or "") + (f"e{exponent}" if exponent else ""))
        return format_measure(value, _PROSE_UNITS.get(unit, unit))

    def shorten(match: re.Match) -> str:
        digits = match.group(0).replace(".", "").lstrip("0")
        return _significant(float(match.group(0))) if len(digits) > 4 else match.group(0)

    return _PROSE_LONG_DECIMAL.sub(shorten, _PROSE_NUMBER.sub(repl, text)) if text else text


_LAYOUT = re.compile(r"\{[^{}]*\}")


def short_shape(shape: Any) -> str:
    """An HLO shape without its layouts: `f32[5,1024,1024,256]{3,2,1,0}` -> `f32[5,1024,1024,256]`."""
    return _LAYOUT.sub("", shape) if isinstance(shape, str) else format_value(shape)


_QUALIFIER = re.compile(r"\b(?:\w+::)+")


def short_kernel_name(name: str, limit: int = 140) -> str:
    """A C++ kernel name as a reader tells kernels apart: no return type, no parameter list, no namespaces
    inside the template arguments (`void ns::Kernel<ns::A<half>, 16>(int, float*)` -> `ns::Kernel<A<half>, 16>`),
    cut at `limit`. Names that are not C++ (HLO op names) come back as they are."""
    text = name.removeprefix("void ").strip()
    if "<" not in text and "(" not in text:
        return text if len(text) <= limit else text[: limit - 1] + "…"
    head, angle, rest = text.partition("<")
    params = head.find("(")
    if params > 0:  # no template: `ns::kernel(args)` -> `ns::kernel(…)`
        head, angle, rest = head[:params], "", "(…)"
    elif angle:
        depth, end = 1, len(rest)
        for i, ch in enumerate(rest):
            depth += (ch == "<") - (ch == ">")
            if depth == 0:
                end = i
                break
        rest = _QUALIFIER.sub("", rest[:end]) + ">"
    short = head + angle + rest
    return short if len(short) <= limit else short[: limit - 1] + "…"


@dataclass(frozen=True)
class Limits:
    """The device's peaks, to check rates against (None: unknown, nothing checked). peak_flops_per_s is the 16-bit
    matrix peak; eight_bit_peaks the datasheet's int8 / fp8 matrix peaks, by name, where it gives them: a rate of
    8-bit work above the 16-bit peak is within its own."""

    peak_flops_per_s: float | None = None
    peak_bytes_per_s: float | None = None
    eight_bit_peaks: tuple[tuple[str, float], ...] = ()

    def highest_rate(self) -> tuple[str, float | None]:
        """The precision with the highest matrix peak and that peak: no FLOP rate of any precision exceeds it."""
        named = [("16-bit", self.peak_flops_per_s)] if self.peak_flops_per_s else []
        named += [(name, rate) for name, rate in self.eight_bit_peaks if rate]
        return max(named, key=lambda pair: pair[1]) if named else ("", None)


NO_LIMITS = Limits()


def out_of_range(key: str, value: Any, limits: Limits = NO_LIMITS) -> str:
    """Why `value` cannot be a measurement of `key` ('' when it can): a share or efficiency outside 0–100%,
    a negative duration or size, a rate above the device's peak."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return ""
    unit = unit_of(key)
    k = str(key).lower()
    if unit == "%":
        if any(word in k for word in _UNBOUNDED_PERCENT):
            return ""
        if value > 100.5 or value < -0.5:
            return f"{format_number(float(value))}% is outside 0–100%: not a physical value"
        return ""
    if unit in ("ms", "µs", "ns", "ps", "B", "GiB", "MiB", "KiB") and value < 0:
        return f"a negative {('duration' if 's' in unit else 'size')} ({format_number(value)} {unit})"
    if unit in _TO_BASE and "peak" not in k:
        factor, steps = _TO_BASE[unit]
        base = value * factor
        if steps is _BYTES_PER_S and limits.peak_bytes_per_s and base > limits.peak_bytes_per_s * 1.001:
            return (f"{format_measure(value, unit)} is above the device's peak bandwidth "
                    f"({format_measure(limits.peak_bytes_per_s, 'B/s')}): not a physical value")
        precision, highest = limits.highest_rate()
        if steps is _FLOP_PER_S and highest and base > highest * 1.001:
            return (f"{format_measure(value, unit)} is above the device's highest matrix peak, its {precision} rate "
                    f"({format_measure(highest, 'FLOP/s')}): not a physical value")
    return ""


def above_sixteen_bit_note(key: str, value: Any, limits: Limits) -> str:
    """Where a FLOP rate is above the 16-bit peak but within an 8-bit one: which peak it is read against ('' else)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or unit_of(key) not in _TO_BASE:
        return ""
    factor, steps = _TO_BASE[unit_of(key)]
    base = value * factor
    if steps is not _FLOP_PER_S or not limits.peak_flops_per_s or base <= limits.peak_flops_per_s * 1.001:
        return ""
    within = [(name, rate) for name, rate in limits.eight_bit_peaks if rate and base <= rate * 1.001]
    if not within:
        return ""
    name, rate = within[0]
    return (f"{name} work at {format_measure(100 * base / rate, '%')} of its {format_measure(rate, 'FLOP/s')} peak "
            f"(the 16-bit peak is {format_measure(limits.peak_flops_per_s, 'FLOP/s')})")


@dataclass
class Cell:
    text: str  # what is shown (possibly truncated)
    full: str | None = None  # the whole text, for the title attribute, when `text` was cut (or a flag's reason)
    numeric: bool = False
    missing: bool = False
    tone: str = ""  # ok / warn / bad: a status word the template colours
    wrap: bool = True  # False: never break inside (tool names in the evidence table)
    sub: str = ""  # a second, muted line (an op's source line and framework op)
    flagged: bool = False  # a value that cannot be a measurement: shown as such, the value in the title

    @property
    def segments(self) -> list[str]:
        """`text` with its long unspaced words (shapes, op and kernel names) cut after , / _ and `::`: the
        template puts a <wbr> between segments, so they can wrap in a narrow column instead of widening the
        table or being broken letter by letter."""
        if not self.wrap or self.numeric or len(self.text) <= _LONG_WORD:
            return [self.text]
        longest = _LONG_WORD if " " not in self.text else _LONG_WORD_IN_PROSE
        out = [""]
        for word in re.split(r"(\s+)", self.text):
            pieces = [p for p in _BREAK_AFTER.split(word) if p] if len(word) > longest else [word]
            out[-1] += pieces[0] if pieces else ""
            out += pieces[1:]
        return out

    @property
    def long(self) -> bool:
        return self.text.count(" ") >= 3 and len(self.text) > 30  # prose, not a short list

    def __html__(self) -> str:
        """The cell as the report's <td>, escaped as the template escapes (`{{ row | join }}`): its class, the whole
        text as the title where `text` was cut, a status word as a coloured pill, else the segments with <wbr>
        between them, then the muted second line. Built here, not by a template macro per cell: a step table of
        hundreds of rows is thousands of cells (a third of the report's rendering as a macro)."""
        kind = ' class="num"' if self.numeric else ' class="na"' if self.missing else ' class="long"' if self.long else ""
        title = f' title="{escape(self.full)}"' if self.full else ""
        if self.tone:
            body = f'<span class="pill {escape(self.tone)}">{escape(self.text)}</span>'
        else:
            body = "<wbr>".join(escape(segment) for segment in self.segments)
        sub = f'<span class="sub">{escape(self.sub)}</span>' if self.sub else ""
        return f"<td{kind}{title}>{body}{sub}</td>"


STATUS_TONES = {
    "ok": "ok", "optimal": "ok", "low": "ok",
    "not_available": "warn", "needs_attention": "warn", "medium": "warn",
    "failed": "bad", "high": "bad",
}


def tone_of(value: Any) -> str:
    text = value.value if isinstance(value, Enum) else value
    return STATUS_TONES.get(text.lower(), "") if isinstance(text, str) else ""


def cell(value: Any, max_chars: int = MAX_CELL_CHARS, tone: str = "") -> Cell:
    text = plain_text(format_value(value))
    if isinstance(value, str):
        text = humanize_numbers(text)
    full = None
    if len(text) > max_chars:
        full, text = text, text[: max_chars - 1] + "…"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return Cell(text=text, full=full, numeric=numeric, missing=value is None, tone=tone)


def flagged_cell(reason: str) -> Cell:
    return Cell(text="out of range", full=reason, tone="warn", flagged=True)


def measured_cell(key: str, value: Any, limits: Limits = NO_LIMITS, max_chars: int = MAX_CELL_CHARS) -> Cell:
    """`value` of field `key` in its unit, or flagged when it cannot be a measurement."""
    reason = out_of_range(key, value, limits)
    if reason:
        return flagged_cell(reason)
    if _is_identifier(key) and isinstance(value, int) and not isinstance(value, bool):
        return Cell(text=str(value), numeric=True)
    unit = unit_of(key)
    if unit and isinstance(value, (int, float)) and not isinstance(value, bool):
        return Cell(text=format_measure(value, unit), numeric=True)
    return cell(value, max_chars, tone=tone_of(value) if key in _TONED_KEYS else "")


_TONED_KEYS = {"status", "oom_risk"}
_UNBROKEN_KEYS = {"tool"}  # tool names stay whole: they are what a reader searches for


@functools.lru_cache(maxsize=4096)
def _is_identifier(key: str) -> bool:
    """Numbers that name something (program ids, step numbers) read as written: 4642, not 4,642."""
    k = str(key).lower()
    return k in _IDENTIFIER_KEYS or k.endswith(("_id", "_ordinal", "_num"))


def _table_cell(key: str, value: Any, limits: Limits = NO_LIMITS) -> Cell:
    c = measured_cell(key, value, limits)
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
    total: int  # rows in the data; `rows` holds at most `limit` of them
    caption: str = ""
    shown: int = 10  # rows visible before the rest is folded into <details>
    group_rows: dict[int, str] = field(default_factory=dict)  # row index -> a group heading shown above it

    @property
    def truncated(self) -> bool:
        return self.total > len(self.rows)

    @property
    def head(self) -> list[list[Cell]]:
        return self.rows[: self.shown]

    @property
    def rest(self) -> list[list[Cell]]:
        return self.rows[self.shown:]


def table(
    rows: Iterable[Any] | None,
    preferred: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    limit: int = MAX_ROWS,
    caption: str = "",
    skip: Sequence[str] = (),
    only: Sequence[str] | None = None,
    limits: Limits = NO_LIMITS,
    shown: int = 10,
) -> Table | None:
    """Any list of flat dicts (or of scalars) as a table: the `preferred` keys first, then every other key
    in the order first seen, so fields a tool adds later appear without template changes
    (`only`: just the preferred keys; `skip`: keys left out). The first `shown` rows are visible, the rest
    (up to `limit`) folded."""
    items = list(rows or [])
    if not items:
        return None
    labels = labels or {}
    if not all(isinstance(r, Mapping) for r in items):
        items = [r if isinstance(r, Mapping) else {"value": r} for r in items]
    keys: list[str] = [k for k in preferred if any(k in r for r in items)]
    if only is None:
        for r in items:
            keys.extend(k for k in r if k not in keys and k not in skip and not _is_nested_value(r[k]))
    columns = [Column(key=k, label=labels.get(k, label_of(k))) for k in keys]
    body = [
        [_table_cell(k, r[k], limits) if k in r else Cell(text="", missing=True) for k in keys]
        for r in items[:limit]
    ]
    return Table(columns=columns, rows=body, total=len(items), caption=caption, shown=shown)


def _is_nested_value(value: Any) -> bool:
    """A value too deep for one cell (a list of records, a record of records): its own table shows it."""
    if isinstance(value, Mapping):
        return any(isinstance(v, (Mapping, list)) for v in value.values())
    return isinstance(value, list) and any(isinstance(v, Mapping) for v in value)


@dataclass
class KeyValue:
    label: str
    key: str
    value: Cell

    @property
    def wide(self) -> bool:
        return len(self.value.text) > 36


def key_values(data: Mapping[str, Any] | None, skip: Sequence[str] = (), max_chars: int = 160,
               limits: Limits = NO_LIMITS) -> list[KeyValue]:
    """A summary dict as label/value rows, each value in its unit (nested dicts and lists on one line)."""
    rows = []
    for k, v in (data or {}).items():
        if k in skip or _is_nested_value(v):
            continue
        rows.append(KeyValue(label=label_of(k), key=str(k), value=measured_cell(k, v, limits, max_chars)))
    # A name and its measure read alike once the unit is dropped (`largest_buffer`, `largest_buffer_mib`): the
    # measure says what it is.
    labels = [row.label for row in rows]
    for row in rows:
        quantity = _QUANTITY_OF_UNIT.get(unit_of(row.key).lower(), "")
        if labels.count(row.label) > 1 and quantity and unit_of(row.key):
            row.label = f"{row.label} {quantity}"
    return rows


@dataclass
class Block:
    """One piece of a report section, rendered by kind: kv, table, chart, bars, lines, text."""

    kind: str
    title: str = ""
    kv: list[KeyValue] = field(default_factory=list)
    table: Table | None = None
    svg: Any = None  # markupsafe.Markup built from escaped parts only (see charts)
    legend: list[tuple[str, str, str]] = field(default_factory=list)  # (label, color, value text)
    text: str = ""
    muted: bool = False
    bars: list[tuple[str, Any]] = field(default_factory=list)  # (label, Markup svg): one small bar per row
    folded: str = ""  # where set, the block sits folded under this line (<details>): detail a reader opens
    lines: Any = None  # kind "lines": a sections.lines.LineTable, sorted and opened by the page's script

    def __post_init__(self) -> None:
        self.text = humanize_numbers(plain_text(self.text))  # tools' reasons quote raw numbers ("623.196 ms")


def source_text(source: Mapping[str, Any]) -> str:
    """An op's or a finding's source as one line: `train.py:33 (train_step), in kernel.py:628`."""
    line = str(source.get("line") or "")
    text = line + (f" ({source['function']})" if line and source.get("function") else "")
    library = str(source.get("library") or "")
    if library:
        text += (", in " if text else "") + library
    fused = [str(f) for f in source.get("fused_lines") or []]
    if fused:
        text += f" (fusing {', '.join(fused)})"
    return text
