"""The user's lines whose device time moved most between two sessions, from each side's line view (get_line_view:
each line's self time, the ops whose innermost user frame it is), per step.

The line view lists its first lines by self time (top_n, as the broad collection runs it); a line one side does
not list is either absent there (its list is complete: `lines` in its summary is no more than it lists, or it
reaches lines of no self time, so a line it leaves out has none) or below the last one it lists: then its time there is
unknown but at most that last one's: the row says so (`bound_ms_per_step`, no delta) and is ranked by the least it
can have moved (its time on the side that lists it beyond that bound), never shown as a measured change.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from xdiag.analysis.line_view import line_times_of_result

LINE_TOOL = "get_line_view"


class LineChange(BaseModel):
    line: str
    function: str | None = None
    baseline_ms_per_step: float | None = None  # None: not listed on that side (bounded: at most bound_ms_per_step)
    candidate_ms_per_step: float | None = None
    delta_ms_per_step: float | None = None
    status: str  # slower | faster | appeared | gone | unlisted
    bound_ms_per_step: float | None = None  # where one side does not list it: its time there is at most this
    baseline_line: str | None = None  # where the edit moved the line: its place in the baseline (same code)


class LinesDiff(BaseModel):
    available: bool = False
    reason: str = "no line view compared"
    source: str = LINE_TOOL
    moved: list[LineChange] = Field(default_factory=list)  # the largest changes first
    note: str = ""


def _listed(result: dict[str, Any] | None, steps: int) -> tuple[dict[str, dict[str, Any]], bool, float] | None:
    if not result or result.get("status") != "ok":
        return None
    listed = line_times_of_result(result)
    smallest = min((float(r.get("self_ms") or 0.0) for r in listed.values()), default=0.0) / steps
    # every line, or the list (ranked by self time) reaches lines of no self time: one it leaves out has none
    complete = (result.get("summary") or {}).get("lines", 0) <= len(listed) or (bool(listed) and smallest == 0)
    return listed, complete, smallest


def _why(result: dict[str, Any] | None, label: str) -> str:
    if result is None:
        return f"{label}: the analysis holds no {LINE_TOOL} output (the tool was not run)"
    return f"{label}: {LINE_TOOL} {result.get('status')}: {result.get('reason') or 'no reason given'}"


def lines_diff(before: dict[str, Any] | None, after: dict[str, Any] | None, steps: tuple[int, int],
               labels: tuple[str, str], top: int = 10) -> LinesDiff:
    """`steps`: each side's step count (0 where it has none: totals over the whole profile then)."""
    per_step = all(steps)
    div_a, div_b = (steps if per_step else (1, 1))
    a, b = _listed(before, div_a), _listed(after, div_b)
    if a is None or b is None:
        return LinesDiff(reason=_why(before, labels[0]) if a is None else _why(after, labels[1]))
    (rows_a, complete_a, least_a), (rows_b, complete_b, least_b) = a, b
    changes = []
    for line in dict.fromkeys([*rows_a, *rows_b]):
        ra, rb = rows_a.get(line), rows_b.get(line)
        ms_a = float(ra.get("self_ms") or 0.0) / div_a if ra else None
        ms_b = float(rb.get("self_ms") or 0.0) / div_b if rb else None
        function = (ra or rb).get("function")
        if ms_a is not None and ms_b is not None:
            status = "slower" if ms_b > ms_a else "faster"
            change = LineChange(line=line, function=function, baseline_ms_per_step=round(ms_a, 6),
                                candidate_ms_per_step=round(ms_b, 6), delta_ms_per_step=round(ms_b - ms_a, 6), status=status)
        elif ms_a is None and complete_a:
            change = LineChange(line=line, function=function, baseline_ms_per_step=0.0, candidate_ms_per_step=round(ms_b, 6),
                                delta_ms_per_step=round(ms_b, 6), status="appeared")
        elif ms_b is None and complete_b:
            change = LineChange(line=line, function=function, baseline_ms_per_step=round(ms_a, 6), candidate_ms_per_step=0.0,
                                delta_ms_per_step=round(-ms_a, 6), status="gone")
        else:
            bound = least_a if ms_a is None else least_b
            change = LineChange(line=line, function=function, status="unlisted", bound_ms_per_step=round(bound, 6),
                                baseline_ms_per_step=None if ms_a is None else round(ms_a, 6),
                                candidate_ms_per_step=None if ms_b is None else round(ms_b, 6))
        changes.append(change)

    def size(c: LineChange) -> float:
        if c.delta_ms_per_step is not None:
            return abs(c.delta_ms_per_step)
        # listed on one side only: it moved by at least what it holds there beyond the other side's last listed line
        known = c.baseline_ms_per_step if c.baseline_ms_per_step is not None else c.candidate_ms_per_step
        return max((known or 0.0) - (c.bound_ms_per_step or 0.0), 0.0)

    changes, paired = _pair_moved_lines(changes, rows_a, rows_b)
    moved = sorted((c for c in changes if size(c) > 0), key=lambda c: -size(c))[:top]
    notes = ["self time: the ops whose innermost user frame is the line"]
    if not per_step:
        notes.append("one side has no steps: totals over the whole profile, not per step")
    if paired:
        notes.append(f"{paired} line(s) the edit moved are matched by their code (baseline_line: where it was)")
    if not (complete_a and complete_b):
        notes.append("a side lists only its first lines: a line it does not list is at most its last listed one")
    return LinesDiff(available=True, reason="", moved=moved, note="; ".join(notes))


def _file_of(line: str) -> str:
    return line.rsplit(":", 1)[0]


def _pair_moved_lines(changes: list[LineChange], rows_a: dict[str, dict[str, Any]],
                      rows_b: dict[str, dict[str, Any]]) -> tuple[list[LineChange], int]:
    """A line gone from the baseline and one appeared in the candidate, in the same file and function, with the same
    code (the line view quotes each side's code where the source is at hand): one line the edit moved, compared with
    itself, not a line removed and another added. Pairs only where the code names one line on each side."""
    def code(row: dict[str, Any] | None) -> str:
        return " ".join(str((row or {}).get("code") or "").split())

    gone = {c.line: c for c in changes if c.status == "gone" and code(rows_a.get(c.line))}
    appeared = {c.line: c for c in changes if c.status == "appeared" and code(rows_b.get(c.line))}

    def keyed(lines: dict[str, LineChange], rows: dict[str, dict[str, Any]]) -> dict[tuple, list[str]]:
        out: dict[tuple, list[str]] = {}
        for line, change in lines.items():
            out.setdefault((_file_of(line), change.function, code(rows.get(line))), []).append(line)
        return out

    before, after = keyed(gone, rows_a), keyed(appeared, rows_b)
    merged: dict[str, LineChange] = {}
    for key, old in before.items():
        new = after.get(key, [])
        if len(old) != 1 or len(new) != 1:
            continue
        ms_a, ms_b = gone[old[0]].baseline_ms_per_step or 0.0, appeared[new[0]].candidate_ms_per_step or 0.0
        merged[old[0]] = merged[new[0]] = LineChange(
            line=new[0], function=appeared[new[0]].function, baseline_line=old[0], baseline_ms_per_step=ms_a,
            candidate_ms_per_step=ms_b, delta_ms_per_step=round(ms_b - ms_a, 6),
            status="slower" if ms_b > ms_a else "faster")
    out, seen = [], set()
    for change in changes:
        replacement = merged.get(change.line) if change.status in ("gone", "appeared") else None
        if replacement is None:
            out.append(change)
        elif id(replacement) not in seen:
            seen.add(id(replacement))
            out.append(replacement)
    return out, len(seen)
