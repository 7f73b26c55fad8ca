"""What every XProf view shares: the xprof modules, loaded on first use, and the coercion of XProf's values
(strings, -1, "N/A", NaN) into numbers or None."""

from __future__ import annotations

import functools
import math
import os
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from xdiag.text_numbers import whole_number

DEFAULT_TOP_N = 20
"""Rows kept in each `detail` list when a view takes no top_n."""
GIB = 1024**3
MIB = 1024**2
XPLANE_SUFFIX = ".xplane.pb"
CUSTOM_CALL_REASON = "XProf reports the custom-call share only when custom calls take 10% of device time or more"


class ViewSource(Protocol):
    """What a view's `build` reads from the views it is built for: `views.XprofViews` (a protocol here, so that the
    view modules, which views.py imports, import nothing back)."""

    files: list[Path]

    def tool(self, name: str, function: Callable[..., Any], **kwargs: Any) -> Any: ...
    def page(self, tool_name: str, **params: Any) -> Any: ...
    def extract_hlo_protos(self) -> None: ...
    def require_readable(self) -> None: ...
    def may_have_counter_samples(self) -> bool: ...
    def may_have_command_buffers(self) -> bool: ...
    def may_have_suggestions(self) -> bool: ...
    def has_metadata_plane(self) -> bool: ...
    def overview_tool(self) -> dict: ...
    def roofline_tool(self) -> dict: ...
    def roofline_gap(self) -> str | None: ...
    def device_type(self) -> str | None: ...
    def no_steps_reason(self) -> str: ...
    def overview(self) -> dict: ...
    def memory_profile(self) -> dict: ...
    def roofline(self) -> dict: ...


@functools.cache
def xprof_api() -> types.SimpleNamespace:
    """XProf's modules, imported on first use so that importing xdiag stays cheap."""
    import xprof
    from xprof.cli.internal import xprof_data
    from xprof.cli.internal.oss import xprof_client
    from xprof.cli.tools import (
        get_memory_profile_tool,
        get_overview_tool,
        get_peak_allocations_tool,
        get_roofline_model_tool,
        get_step_trace_tool,
        get_top_hlo_ops_tool,
        get_utilization_viewer_tool,
    )
    from xprof.convert import raw_to_tool_data

    return types.SimpleNamespace(
        package_dir=os.path.dirname(os.path.abspath(xprof.__file__)) + os.sep,
        client=xprof_client,
        data=xprof_data,
        overview=get_overview_tool.get_overview,
        step_trace=get_step_trace_tool.get_step_trace,
        roofline=get_roofline_model_tool.get_roofline_model,
        device_information=xprof_data.get_device_information,
        hlo_op_profile=xprof_data.get_hlo_op_profile,
        top_hlo_ops=get_top_hlo_ops_tool.get_top_hlo_ops,
        memory_profile=get_memory_profile_tool.get_memory_profile,
        peak_allocations=get_peak_allocations_tool.get_peak_allocations,
        utilization=get_utilization_viewer_tool.get_utilization_viewer,
        tool_names=raw_to_tool_data.xspace_to_tool_names,
    )


@functools.cache
def xprof_version() -> str | None:
    """The installed xprof's version (None without it): what the names and rules read for one version key on. From
    XProf's own version module: `importlib.metadata` would scan every installed distribution first (30 ms)."""
    try:
        from xprof.version import __version__
    except ImportError:
        import importlib.metadata  # here: 20 ms of imports (email's) that a cached `xdiag tool` answer never needs

        try:
            return importlib.metadata.version("xprof")
        except importlib.metadata.PackageNotFoundError:
            return None
    return __version__


def as_number(value: Any) -> float | int | None:
    """'86.5%' -> 86.5, '21.3' -> 21.3, 7 -> 7; 'N/A', '-nan', '', -inf, bools and the rest -> None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().removesuffix("%").strip()
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)  # int64 fields arrive as strings; float() would round them
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def as_positive(value: Any) -> float | int | None:
    """A number that means "unknown" when XProf reports it as 0 or below (-1.0 is its N/A)."""
    number = as_number(value)
    return number if number is not None and number > 0 else None


def as_non_negative(value: Any) -> float | int | None:
    number = as_number(value)
    return number if number is not None and number >= 0 else None


def as_int(value: Any) -> int | None:
    number = as_number(value)
    return int(number) if number is not None else None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    number = as_number(value)
    return bool(number) if number is not None else None


def rounded(value: float | int | None, digits: int = 3) -> float | int | None:
    return round(value, digits) if isinstance(value, float) else value


def to_gib(byte_count: Any) -> float | None:
    number = as_non_negative(byte_count)
    return round(number / GIB, 3) if number is not None else None


def scaled(value: Any, factor: float, digits: int) -> float | None:
    number = as_non_negative(value)
    return round(number * factor, digits) if number is not None else None


def percent_of(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 2)


def clean_values(value: Any) -> Any:
    """Makes nested tool output xdiag-shaped: percent/number strings become numbers, "N/A" and
    NaN disappear, keys keep their names."""
    if isinstance(value, dict):
        cleaned = {str(key): item if str(key).endswith("_id") else clean_values(item) for key, item in value.items()}
        return {key: item for key, item in cleaned.items() if item not in (None, "")}
    if isinstance(value, (list, tuple)):
        return [clean_values(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return as_number(value)
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.upper() in ("N/A", "NA", "NAN", "-NAN", "UNKNOWN", ""):
            return None
        if stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?%?", stripped):
            return as_number(stripped)
        return value
    return str(value)


def datatable_rows(table: Any) -> list[dict[str, Any]]:
    """Rows of one Google DataTable (`{"cols": [...], "rows": [...]}`) keyed by column id."""
    if isinstance(table, list):
        table = table[0] if table else {}
    if not isinstance(table, dict):
        return []
    ids = [column.get("id") or column.get("label") or f"col_{i}" for i, column in enumerate(table.get("cols", []))]
    rows = []
    for row in table.get("rows", []):
        cells = row.get("c", []) if isinstance(row, dict) else []
        values = [cell.get("v") if isinstance(cell, dict) else cell for cell in cells]
        rows.append(dict(zip(ids, values)))
    return rows


def table_with(tables: Any, column: str) -> dict | None:
    """The first table of a multi-table converter output (a list) that has a column with this id."""
    for table in tables if isinstance(tables, list) else []:
        if isinstance(table, dict) and any(c.get("id") == column for c in table.get("cols", [])):
            return table
    return None


def table_properties(tables: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for table in tables if isinstance(tables, list) else []:
        if isinstance(table, dict):
            merged.update(table.get("p", {}))
    return merged


def with_reasons(result: dict[str, Any], reasons: dict[str, str]) -> dict[str, Any]:
    """Adds `unavailable` (key -> why it is None) for top-level keys that came out as None."""
    default = "XProf has no value for it on this profile"
    missing = {key: reasons.get(key, default) for key, value in result.items() if value is None}
    if missing:
        result["unavailable"] = missing
    return result


def natural_order(name: str) -> tuple:
    """Sort key that puts GPU_2_bfc before GPU_10_bfc."""
    return tuple((1, 0, part) if (number := whole_number(part)) is None else (0, number, "")
                 for part in re.split(r"(\d+)", name))


XPROF_TOOLS_ADVICE = re.compile(r"[;,.]?\s*[Uu]se (`[A-Za-z_]+`(?:,? or |, )?)+ to [^.]*\.")
"""XProf's text pointing at tools of XProf's own agent (`get_kernel_utilization`, …), which xdiag does not have."""


def own_tools_named(text: str | None) -> str | None:
    """XProf's text with its pointers to its own agent's tools replaced by the xdiag tools that answer instead."""
    if not text:
        return text
    return XPROF_TOOLS_ADVICE.sub(". xdiag's get_custom_kernels gives each custom kernel's time, FLOPs and bytes where "
                                  "known, and llo_query a TPU capture's LLO lines where it carries them.", text)
