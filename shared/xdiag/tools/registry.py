"""The tool registry: one tool, one question, a typed result.

A tool is a function `(session, **args) -> ToolOutput`. It raises `NotAvailable` when the
profile or platform lacks its data; any other exception is a failure the stage records. Its docstring says what its
summary and detail hold (`summary: <fields>. detail: <what>.`): `xdiag.tools.describe` reads it for `--help`, `xdiag
tools --json` and the MCP schemas.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xdiag.errors import NotAvailable, UnknownTool
from xdiag.model import ToolResult, ToolStatus
from xdiag.profile.space import Session


@dataclass
class ToolOutput:
    summary: dict[str, Any]
    detail: dict[str, Any] = field(default_factory=dict)
    source: str = "xdiag"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    question: str  # the one question the tool answers; also its description for an LLM
    func: Callable[..., ToolOutput]
    # arg -> {"type": string | integer | number | boolean, "description", "required", and where they apply
    # "minimum"/"maximum", "enum", "format": "re2", "max_length"}; the default is the function's (tools.describe)
    parameters: dict[str, dict[str, Any]]
    broad: bool
    follow_up: bool


REGISTRY: dict[str, ToolSpec] = {}

BROAD_TOOLS = (
    "get_xprof_overview",
    "get_step_trace",
    "get_kpi_metrics",
    "get_device_information",
    "get_hosts",
    "get_utilization_viewer",
    "get_smart_suggestions",
    "get_roofline_model",
    "get_hlo_op_profile",
    "get_line_view",
    "detect_layout_mismatch_copies",
    "detect_unfused_reshapes",
    "detect_unnecessary_convert_reduce",
    "list_hlo_modules",
    "get_memory_profile",
    "get_peak_allocations",
    "get_kernel_stats",
    "get_custom_kernels",
    "get_program_anatomy",
)
"""The broad collection every session gets, in the order the report lists them: the managed service's 15, the line
view, then kernel statistics (GPU) and custom kernels, which the report needs on every profile (each says why where
the platform has none), and the program's anatomy, which the investigators choose their levers against."""

XPROF_RECORD_TOOLS = frozenset({
    "get_xprof_overview", "get_step_trace", "get_kpi_metrics", "get_device_information", "get_utilization_viewer",
    "get_smart_suggestions", "get_roofline_model", "get_hlo_op_profile", "get_kernel_stats",
})
"""The broad tools that read XProf's converted views, which a large device session's analysis takes from the
detached converter's record (xdiag.analysis.xprof.background; memory_profile and peak_allocations, which it answers
in line from the host planes, are not among them). An analysis runs them after the others, so that where the report
waits for the converter (`xdiag analyze --xprof-wait`) xdiag's own tools run beside it, not after it."""

FOLLOW_UP_TOOLS = (
    "get_hosts",
    "get_roofline_model",
    "get_hlo_op_profile",
    "get_hlo_neighborhood",
    "aggregate_xplane_events",
    "get_kernel_stats",
    "llo_load",
    "llo_query",
)
"""What an investigator may call after the broad collection."""


def tool(name: str, question: str, parameters: dict[str, dict[str, Any]] | None = None):
    """Registers a tool function under `name`."""

    def register(func: Callable[..., ToolOutput]) -> Callable[..., ToolOutput]:
        REGISTRY[name] = ToolSpec(
            name=name,
            question=question,
            func=func,
            parameters=parameters or {},
            broad=name in BROAD_TOOLS,
            follow_up=name in FOLLOW_UP_TOOLS,
        )
        return func

    return register


def validate_args(spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any]:
    """Checks names, types, ranges (`minimum`/`maximum`), choices (`enum`) and regular expressions (`format: re2`)
    of arguments; raises ValueError with the reason. A model's call is checked here before it is charged to the
    budget, and so are `xdiag tool --arg` and an MCP client's call."""
    unknown = set(args) - set(spec.parameters)
    if unknown:
        raise ValueError(f"{spec.name} takes no argument(s) {sorted(unknown)}; it takes {sorted(spec.parameters)}")
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    for arg, param in spec.parameters.items():
        if arg not in args:
            if param.get("required"):
                raise ValueError(f"{spec.name} needs argument {arg!r} ({param.get('description', '')})")
            continue
        value = args[arg]
        kinds = param.get("type", "string")
        kinds = kinds if isinstance(kinds, list) else [kinds]  # a JSON Schema type, or a list of them
        expected = tuple(t for kind in kinds for t in _flat(types.get(kind, object)))
        if not isinstance(value, expected) or (bool not in expected and isinstance(value, bool)):
            article = "an" if kinds[0][0] in "aeiou" else "a"
            raise ValueError(f"{spec.name}: argument {arg!r} must be {article} {' or '.join(kinds)}, got {value!r}")
        low, high = param.get("minimum"), param.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{spec.name}: argument {arg!r} must be from {low} to {high}, got {value!r}")
        if isinstance(value, str) and len(value) > param.get("max_length", 1000):
            raise ValueError(f"{spec.name}: argument {arg!r} is longer than {param.get('max_length', 1000)} characters")
        if "enum" in param and value not in param["enum"]:
            raise ValueError(f"{spec.name}: argument {arg!r} must be one of {param['enum']}, got {value!r}")
        if param.get("format") == "re2":
            compile_pattern(value)
    return args


def _flat(kind: type | tuple) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def compile_pattern(pattern: str) -> Any:
    """A regular expression from untrusted input (a model's tool call), compiled by RE2: matching takes time linear
    in the text whatever the pattern (no backtracking, so no ReDoS); ValueError for what RE2 cannot compile
    (backreferences, lookaround) or a pattern over its memory budget."""
    import re2

    options = re2.Options()
    options.log_errors = False
    options.max_mem = 8 << 20
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"pattern {pattern!r} is not a regular expression RE2 accepts: {reason}") from None


def run_tool(session: Session, name: str, args: dict[str, Any] | None = None) -> ToolResult:
    """Runs one tool and records what happened; never raises for a tool's own failure."""
    from xdiag import tools as _  # noqa: F401  (importing the package registers every tool)

    spec = REGISTRY.get(name)
    if spec is None:
        raise UnknownTool(f"unknown tool {name!r}; known tools: {', '.join(sorted(REGISTRY))}")
    args = dict(args or {})
    try:
        validate_args(spec, args)
    except ValueError as exc:  # only the arguments' checks: a ValueError inside a tool is its own failure, below
        return ToolResult(
            tool=name, status=ToolStatus.FAILED, reason=f"bad arguments: {exc}", args=args, duration_ms=0.0
        )
    started = time.perf_counter()
    try:
        output = spec.func(session, **args)
    except NotAvailable as exc:
        return ToolResult(
            tool=name,
            status=ToolStatus.NOT_AVAILABLE,
            reason=str(exc),
            args=args,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
    except Exception as exc:  # a tool's bug must not stop the pipeline: record it precisely
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return ToolResult(
            tool=name,
            status=ToolStatus.FAILED,
            reason=f"{type(exc).__name__}: {exc} (at {where.filename.rsplit('/', 1)[-1]}:{where.lineno})",
            args=args,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
    return ToolResult(
        tool=name,
        status=ToolStatus.OK,
        summary=output.summary,
        detail=output.detail,
        source=output.source,
        args=args,
        duration_ms=(time.perf_counter() - started) * 1000,
    )
