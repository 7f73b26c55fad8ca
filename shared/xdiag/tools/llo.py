"""llo_load / llo_query: TPU low-level (LLO) instruction traces, where the capture has them."""

from __future__ import annotations

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.aggregate_xplane_events import aggregate_xplane_events, is_counter_line
from xdiag.tools.registry import ToolOutput, tool

LLO_LINES = frozenset({
    "Pallas Primitives", "Source Lines", "Source code", "LLO Instructions", "SALU Instructions",
    "VALU Instructions", "EUP Instructions", "XLU Instructions", "VLD Instructions", "VST Instructions",
})


COUNTER_HINTS = ("_counters_", "counter", "tensor core", "tensorcore")
"""Kernel-profiling TPU captures add counter and Tensor Core lines beside the LLO ones."""


def _llo_lines(session: Session) -> list[tuple[str, str, int]]:
    return [(p.name, ln.name, len(ln)) for p in session.device_planes() for ln in p.lines if ln.name in LLO_LINES and len(ln)]


def low_level_lines(session: Session) -> list[dict]:
    """The LLO and Tensor Core lines of a TPU capture, with their event counts (counter lines are `counter_lines`:
    samples, not time)."""
    return [
        {"plane": p.name, "line": ln.name, "events": len(ln)}
        for p in session.device_planes()
        for ln in p.lines
        if len(ln) and (ln.name in LLO_LINES or any(h in ln.name.lower() for h in COUNTER_HINTS))
        and not is_counter_line(ln.name)
    ]


def counter_lines(session: Session) -> list[dict]:
    """The device lines of counter samples (`_counters_`: a value such as a throttle percentage at an instant, no
    span of time), with their sample counts: from the lines' names and sizes, which a session assembled from its
    hosts' summaries holds too."""
    return [{"plane": p.name, "line": ln.name, "samples": len(ln), "is": "counter samples (values at instants), not time"}
            for p in session.device_planes() for ln in p.lines if len(ln) and is_counter_line(ln.name)]


def low_level_gap(session: Session) -> str:
    """Why a session has no LLO or Tensor Core lines that take time ('' when it has some)."""
    if session.platform != "TPU":
        return f"LLO traces and TPU counters exist only in TPU captures; this is a {session.platform} profile"
    if low_level_lines(session):
        return ""
    names = sorted({ln.name for p in session.device_planes() for ln in p.lines if len(ln)})
    return ("this TPU capture carries no LLO or Tensor Core lines (its device lines: " + ", ".join(names)
            + "; counter lines hold samples, not time); capture with LLO tracing / kernel profiling enabled to get "
            "them")


def _require_llo(session: Session) -> list[tuple[str, str, int]]:
    if session.platform != "TPU":
        raise NotAvailable(f"LLO traces exist only in TPU captures; this is a {session.platform} profile")
    lines = _llo_lines(session)
    if not lines:
        raise NotAvailable("this TPU capture has no LLO lines (capture with LLO tracing enabled to get them)")
    return lines


@tool("llo_load", "Whether the TPU capture carries LLO-level lines, and how many events each holds.")
def llo_load(session: Session) -> ToolOutput:
    """summary: llo_lines, events. detail: per plane/line counts."""
    lines = _require_llo(session)
    return ToolOutput(
        {"llo_lines": len(lines), "events": sum(n for _, _, n in lines)},
        {"lines": [{"plane": p, "line": ln, "events": n} for p, ln, n in lines]},
        "TPU device planes",
    )


@tool(
    "llo_query",
    "LLO events matching a regular expression on the TPU's LLO lines: count, time and gaps.",
    parameters={"pattern": {"type": "string", "description": "regular expression over LLO event names", "required": True}},
)
def llo_query(session: Session, pattern: str) -> ToolOutput:
    """summary/detail: as aggregate_xplane_events, restricted to LLO lines."""
    results = []
    for _, line_name, _ in _require_llo(session):
        try:
            results.append(aggregate_xplane_events(session, pattern=pattern, plane="/device:TPU", line=line_name))
        except NotAvailable:
            continue
    if not results:
        raise NotAvailable(f"no LLO event matches {pattern!r}")
    summary = {
        "pattern": pattern,
        "matches": sum(r.summary["matches"] for r in results),
        "total_ms": round(sum(r.summary["total_ms"] for r in results), 4),
    }
    return ToolOutput(summary, {"groups": [g for r in results for g in r.detail["groups"]]}, "TPU LLO lines")
