"""get_line_view: which lines and functions of the user's program hold the device time, and how fast do they run?"""

from __future__ import annotations

import os

from xdiag.analysis.line_view import NO_LINE, capture_paths_note, line_record, line_view, stale_files
from xdiag.analysis.source_code import SOURCE_ROOT_ENV, SourceReader
from xdiag.analysis.source_lines import source_lines_missing
from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, host_plane_source, percent
from xdiag.tools.registry import ToolOutput, tool

ORDERS = ("self", "total", "host")


@tool(
    "get_line_view",
    "The user's source lines and functions ranked by device time (self: ops whose innermost user frame is the line; "
    "total: ops anywhere below it in the stack, callees included), with each line's op kinds, achieved FLOP rate "
    "and HBM bandwidth against the roof of its precision, host time the Python tracer recorded, and the code.",
    parameters={
        "top_n": {"type": "integer", "description": "how many lines and functions to list (1-200, default 20)",
                  "minimum": 1, "maximum": 200},
        "order": {"type": "string", "description": "rank by self (default), total (callees included) or host time",
                  "enum": list(ORDERS)},
        "source_root": {"type": "string", "max_length": 1000,
                        "description": "a checkout on this machine holding the profiled files: each recorded path is "
                                       "read at its longest suffix that is a file under it, and only there (default: "
                                       "`xdiag analyze --source-root`'s, else the recorded path)"},
    },
)
def get_line_view(session: Session, top_n: int = 20, order: str = "self", source_root: str | None = None,
                  ) -> ToolOutput:
    """summary: op_time_ms, lines (how many the stacks name), functions, self_sum_ms (the lines' self times
    summed: the op time), top_line, top_line_function, top_line_self_percent, top_line_total_percent,
    top_function, top_function_total_percent, unattributed_percent (op time no stack names), host_traced (the
    Python tracer's frames are in the profile), host_ms (their time in the user's frames), source_root, paths_are
    (where some of the files named cannot be read here: the paths are the capture machine's, and source_root reads
    them),
    source_lines_not_available (why, and how to record them). detail: lines [top_n rows by `order`] and functions
    [top_n rows by total, or by host time with order=host, each: line (`folder/file.py:LINE`, a function's
    `folder/file.py: function`, a library's frame, or `(no source line)`), function, library (no user frame: the
    library's), self_ms, total_ms, self_percent, total_percent (of op time), kinds {op kind: ms}, top_ops,
    achieved_tflops_per_s, precision (of the compute roof its time is mostly under: 16-bit, f32, int8, fp8),
    precisions (where its ops run at several), flops_percent_of_roof (FLOPs over those its ops' roofs would allow in
    their time), achieved_gb_per_s, hbm_percent_of_roof (its ops' own HBM bytes), fed_by_async_copies_percent (of its
    time, in ops working on what a streaming program's async copies brought into on-chip memory, or waiting for
    those copies) with program_hbm_gb_per_s and program_hbm_efficiency_percent (that program's HBM rate, the copies'
    bytes included, which bounds them), roofline_efficiency_percent (time-weighted over its ops),
    bound, measured_percent (of its time the rates speak for; ops whose rates are no measurement are left out),
    rates_are_upper_bounds (some costs assume full pages: each rate is at most that), data_on_chip (its costed ops
    move no HBM bytes: no HBM rate), callees [{line, ms}: the next
    user frame inward and the time under this one through it], modules [{module, ms}: PyTorch's innermost
    nn.Module calls around its kernels' launches], host_ms, host_kinds {sync, dispatch, compile, transfer, python
    (the rest: its own Python, input preparation): ms}, file (the file read), code (the line), context [[number,
    text]], code_not_available (why: not readable, or not the version the profile ran: a line of it blank, past its
    end or outside the frame's function)], source_versions {recorded path: the file read for it here and its
    version, "" where none: a kept answer is given again only while these hold}."""
    source_root = source_root or os.environ.get(SOURCE_ROOT_ENV) or None
    view = line_view(session)
    if not view.op_ps and not view.host_traced:
        raise NotAvailable("the profile holds no op executions and no Python tracer frames to rank lines by")
    lines = view.ranked(order)
    functions = view.ranked("host" if order == "host" else "total", functions=True)  # pprof's top -cum
    reader = SourceReader(source_root)
    stale = stale_files(view, reader)
    summary: dict = {"op_time_ms": round(view.op_ps / 1e9, 4), "lines": len(view.lines),
                     "functions": len(view.functions),
                     "self_sum_ms": round(sum(t.self_ps for t in view.lines.values()) / 1e9, 4)}
    named = [t for t in view.ranked("self") if t.key != NO_LINE and t.self_ps]
    if named:
        top = named[0]
        summary.update(top_line=top.key, top_line_function=top.function,
                       top_line_self_percent=percent(top.self_ps, view.op_ps),
                       top_line_total_percent=percent(top.total_ps, view.op_ps))
    busiest = [t for t in view.ranked("total", functions=True) if t.key != NO_LINE and t.total_ps]
    if busiest:
        summary.update(top_function=busiest[0].key, top_function_total_percent=percent(busiest[0].total_ps,
                                                                                       view.op_ps))
    unattributed = view.lines.get(NO_LINE)
    if unattributed is not None:
        summary["unattributed_percent"] = percent(unattributed.self_ps, view.op_ps)
    summary["host_traced"] = view.host_traced
    if view.host_traced:
        summary["host_ms"] = round(sum(t.host_ps for t in view.lines.values()) / 1e9, 4)
    if source_root:
        summary["source_root"] = source_root
    if note := capture_paths_note(view, reader):
        summary["paths_are"] = note
    missing = source_lines_missing(session) if not view.stacks_recorded else None
    if missing:
        summary["source_lines_not_available"] = missing
    detail = {
        "lines": [line_record(t, view.op_ps, reader, stale=stale) for t in lines[:top_n]],
        "functions": [line_record(t, view.op_ps) for t in functions[:top_n]],
        "note": ("self: the ops whose innermost user frame is the line; total: the ops with the line anywhere on "
                 "their stack, each counted once; a line's total is its self time plus its callees' time under it"),
        "source_versions": reader.versions(),
    }
    source = host_plane_source(session) if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    return ToolOutput(summary, detail, source)
