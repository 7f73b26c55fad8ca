"""Which lines of the user's program hold a finding's time: the ops its evidence cites, looked up in the op profile's
rows, each row's source line (xdiag.analysis.source_lines) summed by line. Runs on every investigator's diagnosis
(rules or a model's), so each finding names the 1-3 lines to change whoever wrote it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from xdiag.analysis.source_lines import python_frame
from xdiag.model import Diagnosis, Finding, SourceLine, ToolResult

MAX_LINES = 3
OP_PROFILE = "get_hlo_op_profile"
LINE_VIEW = "get_line_view"


def _op_rows(results: dict[str, ToolResult]) -> dict[str, dict]:
    """Op name -> its row, for the rows that carry a source: the op profile's first, then any other tool's op table
    (the detectors' rows, a follow-up's)."""
    rows: dict[str, dict] = {}
    for tool in sorted(results, key=lambda t: t != OP_PROFILE):
        result = results[tool]
        if not result.ok:
            continue
        for table in result.detail.values():
            for row in table if isinstance(table, list) else ():
                if isinstance(row, dict) and isinstance(row.get("source"), dict) and isinstance(row.get("op"), str):
                    rows.setdefault(row["op"], row)
    return rows


def _texts(finding: Finding) -> Iterable[str]:
    yield finding.title
    yield finding.whats_happening
    for e in finding.evidence:
        yield e.metric
        yield e.note
        yield str(e.value)


def cited_ops(finding: Finding, names: Iterable[str]) -> list[str]:
    """The op names the finding's title, text or evidence mention as whole names (`fusion.3` is not `fusion.37`)."""
    text = "\n".join(_texts(finding))
    return [name for name in names if name in finding._staked_ops
            or re.search(rf"(?<![\w.\-]){re.escape(name)}(?![\w\-]|\.\d)", text)]


def _line_key(row: dict) -> str:
    return row["source"].get("line") or row["source"].get("library") or ""


def finding_source_lines(finding: Finding, rows: dict[str, dict], by_line: dict[str, float] | None = None
                         ) -> list[SourceLine]:
    """The lines of the ops the finding cites, each with the share of all op time every op at that line holds (a
    line that calls a kernel four times holds the four calls' time): the op profile's op_time_by_line, the same
    figure it gives for that line (`by_line`), else the listed ops' at that line; busiest first; lines under 0.01%
    left out. Summing only the listed ops gave a line 6.8% in a finding and 13.5% in the op profile."""
    held: dict[str, float] = {}
    for row in rows.values():
        held[_line_key(row)] = held.get(_line_key(row), 0.0) + float(row.get("share_of_op_time_percent") or 0.0)
    held.update(by_line or {})
    lines: dict[str, SourceLine] = {}
    for name in cited_ops(finding, rows):
        row = rows[name]
        key, source = _line_key(row), row["source"]
        if not key or round(held[key], 2) <= 0:
            continue
        found = lines.get(key)
        if found is None:
            own = bool(source.get("line"))
            found = lines[key] = SourceLine(line=key, function=source.get("function", "") if own else "",
                                            library=source.get("library", "") if own else "",
                                            share_percent=round(held[key], 2))
        found.ops.append(name)
        busiest = rows[found.ops[0]]
        if float(row.get("share_of_op_time_percent") or 0.0) > float(busiest.get("share_of_op_time_percent") or 0.0):
            found.ops.insert(0, found.ops.pop())
        found.computes = op_computes(rows[found.ops[0]])
        found.fused_lines += [f for f in source.get("fused_lines") or [] if f not in found.fused_lines and f != key]
    for found in lines.values():
        found.fused_lines = found.fused_lines[:MAX_LINES]
    return sorted(lines.values(), key=lambda s: -s.share_percent)[:MAX_LINES]


_LAYOUT = re.compile(r"\{[^{}]*\}")


def op_computes(row: dict) -> str:
    """What an op profile row computes, in its own facts: the framework op its HLO names (the last part of its
    path, `jit(step)/gather` → gather) and its operands' and result's shapes, layouts left out; "" without shapes."""
    shape = _LAYOUT.sub("", str(row.get("shape") or ""))
    if not shape:
        return ""
    kind = str(row.get("framework_op") or "").rsplit("/", 1)[-1] or str(row.get("opcode") or "")
    operands = ", ".join(_LAYOUT.sub("", str(s)) for s in (row.get("operand_shapes") or [])[:3])
    return (f"{kind}: " if kind else "") + (f"{operands} → " if operands else "") + shape


def where_to_change(lines: list[SourceLine]) -> str:
    """The sentence a fix gains: which line to change (the library's kernel beside it), and what its busiest op
    computes there."""
    named = [f"{s.line}" + (f" ({s.function})" if s.function else "") + (f", in {s.library}" if s.library else "")
             + f": {s.share_percent:g}% of op time" + (f" ({s.computes})" if s.computes else "")
             + (f", fusing {', '.join(s.fused_lines)}" if s.fused_lines else "")
             for s in lines]
    return "Where: " + "; ".join(named) + "."


HOST_EVENT_FINDINGS = {"host_sync": "user_callers", "dispatch_overhead": "user_callers",
                       "recompilation": "user_callers", "input_bound": "user_frames",
                       "python_loop_of_calls": "user_callers", "eager_ops": "user_callers",
                       "recompile_per_shape": "user_callers", "callback_in_step": "user_callers",
                       "static_argument_per_value": "user_callers", "boolean_mask_in_loop": "user_callers",
                       "eager_loop_reads_each_trip": "user_callers"}
"""Host-side findings whose rule reads the host's events (aggregate_xplane_events), and the frames that hold their
time: the user's innermost frame around each wait, dispatch or compile; for host-bound input, the user's innermost
frames themselves (the Python that runs while the device idles)."""
NO_HOST_LINE = (
    "The profile records no line of the user's program for this host-side time: it is not in the HLO, whose stacks "
    "name the device ops' lines, and {why}. To record the line, start the trace before the function that runs the "
    "loop is called (jax.profiler.start_trace(log_dir), or `with jax.profiler.trace(log_dir):` around that call), "
    "with the Python tracer on (options = jax.profiler.ProfileOptions(); options.python_tracer_level = 1; "
    "profiler_options=options): the tracer records only the frames entered after the trace starts."
)
NO_TORCH_HOST_LINE = (
    "The trace records no Python frame of the user's program around this host-side time: profile with "
    "torch.profiler.profile(..., with_stack=True, with_modules=True), started before the loop's function is called, "
    "to record it."
)
BEGAN_BEFORE = ("the frame that waits or dispatches began before the trace did, and the tracer records only frames "
                "entered after it starts")
TRACED_ELSEWHERE = (
    "JAX's Python tracer recorded the user's frames ({named}), but none around this host-side time: " + BEGAN_BEFORE
    + ". To record the line, start the trace before the function that runs the loop is called "
    "(jax.profiler.start_trace(log_dir), or `with jax.profiler.trace(log_dir):` around that call)."
)
"""Where the line view ties host time to the user's lines, but none of the finding's kind: what it does record."""
HOST_KIND_OF = {"host_sync": "sync", "dispatch_overhead": "dispatch", "recompilation": "compile",
                "input_bound": "python"}
"""The line view's name (its host_kinds: xdiag.analysis.line_view.HOST_KINDS, and python for a frame's own Python)
for the host time of each host finding."""
WAITED_ON_KIND = "host transfers"
"""The line view's op kind of the device's host callbacks and copies to the host: what a host sync waits for."""
MIN_WAITED_ON_PERCENT = 1.0
"""Of all op time: a line whose host callbacks or copies hold less is not what the host waits on."""
NO_TRACER_WHY = "the capture holds no Python tracer events (the Python tracer was off)"
NOT_ENCLOSED_WHY = "JAX's Python tracer recorded no frame of the user's code around these events: " + BEGAN_BEFORE


def host_source_lines(key: str, result: ToolResult, profiled_ms: float, traced: bool, framework: str | None = None,
                      line_view: ToolResult | None = None) -> tuple[list[SourceLine], str]:
    """A host finding's user lines from its follow-up's events (aggregate_xplane_events' user_callers, or
    user_frames for host-bound input), each with the host time it holds and that time's share of the profiled steps;
    where none, the lines the line view (`line_view`: get_line_view's answer) ties that kind of host time to, or for
    a host sync the lines whose device ops the host waits on (callbacks, copies to the host); where none, why the
    profile names none (NO_HOST_LINE), or what the Python tracer did record (TRACED_ELSEWHERE)."""
    frames = result.detail.get(HOST_EVENT_FINDINGS[key], []) if result.ok else []
    lines = []
    for entry in frames[:MAX_LINES]:
        frame = python_frame(entry["name"])
        if frame is None or entry["total_ms"] <= 0:
            continue
        lines.append(SourceLine(line=f"{frame.file}:{frame.line}", function=frame.function,
                                share_percent=_share(entry["total_ms"], profiled_ms), host_ms=entry["total_ms"]))
    if lines:
        return lines, ""
    rows = _line_rows(line_view)
    lines = line_view_host_lines(key, rows, profiled_ms)
    if lines:
        return lines, ""
    if framework and framework.startswith("PyTorch"):
        return [], NO_TORCH_HOST_LINE
    recorded = [row for row in rows if _number(row.get("host_ms")) > 0 and not row.get("library")]
    if recorded:
        named = "; ".join(f"{row['line']}" + (f" in {row['function']}" if row.get("function") else "")
                          + f": {_number(row['host_ms']):.3g} ms of host time" for row in recorded[:MAX_LINES])
        return [], TRACED_ELSEWHERE.format(named=named)
    return [], NO_HOST_LINE.format(why=NOT_ENCLOSED_WHY if traced else NO_TRACER_WHY)


def _share(ms: float, profiled_ms: float) -> float:
    return round(min(100.0, 100 * ms / profiled_ms), 2) if profiled_ms else 0.0


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _line_rows(line_view: ToolResult | None) -> list[dict]:
    """The line view's rows (get_line_view's detail.lines), those that name a line."""
    rows = line_view.detail.get("lines") if line_view is not None and line_view.ok else None
    return [row for row in rows if isinstance(row, dict) and isinstance(row.get("line"), str)] \
        if isinstance(rows, list) else []


def line_view_host_lines(key: str, rows: list[dict], profiled_ms: float) -> list[SourceLine]:
    """The user's lines the line view ties a host finding's time to: the frames holding host time of its kind
    (HOST_KIND_OF), busiest first; for a host sync with none, the lines holding the device ops the host waits on
    (WAITED_ON_KIND: a host callback's line), by op time."""
    kind, lines = HOST_KIND_OF[key], []
    for row in rows:
        host_kinds = row.get("host_kinds") if isinstance(row.get("host_kinds"), dict) else {}
        ms = _number(host_kinds.get(kind)) or (_number(row.get("host_ms")) if kind == "python" and not host_kinds
                                              else 0.0)
        if ms > 0 and not row.get("library"):
            lines.append(SourceLine(line=row["line"], function=str(row.get("function") or ""),
                                    share_percent=_share(ms, profiled_ms), host_ms=round(ms, 4)))
    if not lines and key == "host_sync":
        for row in rows:
            kinds = row.get("kinds") if isinstance(row.get("kinds"), dict) else {}
            waited_on = _number(kinds.get(WAITED_ON_KIND)) / _number(row.get("self_ms")) * _number(
                row.get("self_percent")) if _number(row.get("self_ms")) else 0.0
            if waited_on >= MIN_WAITED_ON_PERCENT and not row.get("library"):
                lines.append(SourceLine(line=row["line"], function=str(row.get("function") or ""),
                                        share_percent=_number(row["self_percent"]),
                                        ops=[op["op"] for op in row.get("top_ops") or [] if isinstance(op, dict)]))
        return sorted(lines, key=lambda s: -s.share_percent)[:MAX_LINES]
    return sorted(lines, key=lambda s: -(s.host_ms or 0.0))[:MAX_LINES]


def where_on_the_host(lines: list[SourceLine]) -> str:
    """The sentence a host finding's fix gains: the user's functions its host time runs in (the profiler's Python
    frames name a function by the line it begins on), or the lines whose device ops it waits on."""
    if any(s.host_ms is None for s in lines):
        return where_to_change(lines)
    named = [f"{s.function} ({s.line}): " + (f"{s.host_ms:,.0f}" if s.host_ms >= 100 else f"{s.host_ms:.3g}")
             + " ms of host time in the capture" + (f", {s.share_percent:g}% of the profiled steps"
                                                    if s.share_percent else "") for s in lines]
    return "Where: " + "; ".join(named) + " (a profiler's Python frames name a function by the line it begins on)."


def line_code(results: dict[str, ToolResult]) -> dict[str, str]:
    """Line key -> its code, as the analysis' line view quoted it (get_line_view: the file read at the source root
    the analysis was given, where it is the version the profile ran): the lines it lists."""
    return {row["line"]: row["code"] for row in _line_rows(results.get(LINE_VIEW)) if isinstance(row.get("code"), str)}


def code_of(line: str, code: dict[str, str]) -> str:
    """A finding's line's code from line_code's answer; a Python tracer's frame names its file alone (`train.py:33`):
    the one line of that file name and number, where only one is."""
    if line in code:
        return code[line]
    named = [text for key, text in code.items() if key.rsplit("/", 1)[-1] == line] if "/" not in line else []
    return named[0] if len(named) == 1 else ""


def with_source_lines(diagnosis: Diagnosis, results: dict[str, ToolResult]) -> Diagnosis:
    """Each finding with the source lines of the ops it cites, and its fix with where to change them; a host
    finding without one, the user's Python frames its host time runs in, or why the profile names none. Each line
    with its code where the analysis' line view quoted it (line_code)."""
    rows = _op_rows(results)
    profile = results.get(OP_PROFILE)
    by_line = {line.get("line") or line.get("library") or "": float(line["share_percent"])
               for line in ((profile.summary.get("op_time_by_line") or []) if profile is not None and profile.ok else [])
               if isinstance(line, dict) and line.get("share_percent") is not None}
    for finding in diagnosis.findings:
        if finding.source_lines:
            continue
        finding.source_lines = finding_source_lines(finding, rows, by_line) if rows else []
        if finding.source_lines:
            finding.fix = f"{finding.fix.rstrip()} {where_to_change(finding.source_lines)}"
        elif finding._host_lines:
            finding.source_lines = finding._host_lines
            finding.fix = f"{finding.fix.rstrip()} {where_on_the_host(finding.source_lines)}"
        elif finding._no_host_line:
            finding.fix = f"{finding.fix.rstrip()} {finding._no_host_line}"
    code = line_code(results)
    for finding in diagnosis.findings:
        for line in finding.source_lines:
            line.code = line.code or code_of(line.line, code)
    return diagnosis
