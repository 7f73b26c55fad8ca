"""aggregate_xplane_events: how often, how long and how far apart do matching events happen?"""

from __future__ import annotations

import numpy as np

from xdiag.analysis.intervals import merge_intervals
from xdiag.analysis.source_lines import enclosing_user_frames, frame_kinds, innermost_user_frames, user_files
from xdiag.errors import NotAvailable
from xdiag.profile.columns import isin_ids
from xdiag.profile.space import Session
from xdiag.tools.registry import ToolOutput, compile_pattern, tool


TOP_FRAMES = 5
COUNTER_LINE_HINTS = ("_counters_", "counter")
"""Lines of counter samples (TPU `_counters_`: a throttle percentage, a clock, at an instant): their events' lengths
are no time the program spent (one such line summed 491 ms in a 0.6 ms capture)."""


def is_counter_line(name: str) -> bool:
    return any(hint in name.lower() for hint in COUNTER_LINE_HINTS)


def zero_length(ln) -> bool:
    """Every event of the line is an instant (a marker, a sample): none takes time."""
    return bool(len(ln)) and not ln.durations.at(np.ones(len(ln), bool)).any()


@tool(
    "aggregate_xplane_events",
    "Events whose name matches a regular expression, per host, plane and line: count, total, mean and max "
    "duration, and the gaps between consecutive matches.",
    parameters={
        "pattern": {"type": "string", "description": "regular expression (RE2 syntax) matched against event names",
                    "required": True, "format": "re2", "max_length": 500},
        "plane": {"type": "string", "description": "only planes whose name contains this (e.g. '/host:CPU')"},
        "line": {"type": "string", "description": "only lines whose name contains this (e.g. 'python')"},
    },
)
def aggregate_xplane_events(session: Session, pattern: str, plane: str | None = None, line: str | None = None) -> ToolOutput:
    """summary: pattern, matches, outermost_matches (those not nested in another match on their line), total_ms
    (the time the matches cover on each line, a nested match counted once: total_is says so), mean_us (over the
    outermost matches), max_us, mean_gap_ms, max_gap_ms, distinct_names, not_time_matches (matches on counter lines or
    lines of zero-length events: samples and instants, counted in matches, never summed as time).
    detail: groups per host/plane/line, top names by time; not_time (the counter and zero-length lines matched, and
    what their events are); where the matching events are Python frames (PyTorch's
    `python_function` events, `path.py(LINE): function`; JAX's Python tracer's, `$file.py:LINE function`),
    user_frames (the user's innermost frames by time: past threading, the standard library and the frameworks' own
    frames) and modules (the innermost `nn.Module` calls by time); where matching events that are no user frame (a
    host wait, a dispatch, a compile) run inside the user's frames on their line, user_callers (the innermost user
    frame around them, by the matching time it encloses). Of a session assembled from host summaries, over
    the hosts whose events it holds (the ones that matter: the straggler of the collectives, the host with the longest
    mean step, the first host), which hosts_covered names beside hosts_in_session."""
    regex = compile_pattern(pattern)  # RE2: linear time, whatever a model chose
    # Running totals, not every matched event's duration and gap kept to the end: a pattern that matches every
    # dispatch of a many-host session matches millions (32 hosts of the 20 MiB bench capture: 2.5 M, ~80 MiB).
    groups, names_time, user_frames, modules, callers, not_time = [], {}, {}, {}, {}, []
    kind_of = None  # made on the first line that may hold Python frames
    count = outer_count = total_ps = longest = gap_count = gap_total = 0
    longest_gap = None
    covered = session.hosts_with_events()
    if not covered:
        raise NotAvailable("the session was assembled from its hosts' summaries, which hold no events: they are in "
                           "the hosts' prepared columns, which this session did not map")
    for p in session.host_by_host([plane for host in covered for plane in host.planes]):
        if plane and plane not in p.name:
            continue
        matching_ids = {k for k, n in p.event_names.items() if regex.search(n)}
        matching_ids |= {k for k, n in p.event_display_names.items() if regex.search(n)}
        if not matching_ids:
            continue
        ids = np.fromiter(matching_ids, dtype=np.int64)
        for ln in p.lines:
            if line and line not in ln.name:
                continue
            mask = isin_ids(ln.metadata_id, ids)
            if not mask.any():
                continue
            d = ln.durations.at(mask)
            if is_counter_line(ln.name) or not d.any():  # samples or instants: counted, never summed as time
                count += int(mask.sum())
                not_time.append({"host": p.host, "plane": p.name, "line": ln.name, "count": int(mask.sum()),
                                 "is": "counter samples (values at instants), not time" if is_counter_line(ln.name)
                                 else "zero-length events (instants), not time"})
                continue
            starts = ln.starts.at(mask)
            order = np.argsort(starts)
            s = starts[order]
            e_sorted = (starts + d)[order]
            g = (s[1:] - np.maximum.accumulate(e_sorted)[:-1]) if len(s) > 1 else np.empty(0, np.int64)
            # A matching event nested in another (a Python frame in its caller's, an execute in its dispatch) is
            # time already counted: the line's time is what its matches cover, each instant once.
            merged = merge_intervals(s, e_sorted)
            covered_ps = int((merged[1] - merged[0]).sum())
            outer = 1 + int((g >= 0).sum()) if len(s) else 0
            count, outer_count = count + len(d), outer_count + outer
            total_ps, longest = total_ps + covered_ps, max(longest, int(d.max()))
            if len(g):
                clipped = np.clip(g, 0, None)
                gap_count, gap_total = gap_count + len(clipped), gap_total + int(clipped.sum())
                longest_gap = max(longest_gap or 0, int(clipped.max()))
            uniq, inverse = np.unique(ln.metadata_id[mask], return_inverse=True)
            per_name = np.bincount(inverse, weights=d.astype(float))
            for mid, total in zip(uniq, per_name):
                name = p.event_names.get(int(mid), "")
                names_time[name] = names_time.get(name, 0.0) + total
            if ln.name.startswith("thread ") or "python" in ln.name.lower():
                # Lines whose events may be Python frames: a PyTorch trace's host threads, JAX's Python tracer's.
                kind_of = kind_of or frame_kinds(user_files(session.hlo_modules))
                names = [p.event_names.get(int(m), "") for m in uniq.tolist()]
                # Only frames (a user's, an nn.Module call's) are stacked: the events of no kind, skipped there, are
                # left out before (the 20.7 MiB CPU capture's 40,000 dispatches, none a frame).
                framed = np.array([bool(kind_of(name)) for name in names], dtype=bool)[inverse]
                users, called = innermost_user_frames(zip(
                    starts[framed].tolist(), (starts + d)[framed].tolist(),
                    (names[i] for i in inverse[framed].tolist())), kind_of) if framed.any() else ({}, {})
                for totals, found in ((user_frames, users), (modules, called)):
                    for name, ps in found.items():
                        totals[name] = totals.get(name, 0) + ps
                for name, ps in _callers(p, ln, kind_of, starts, d, names, inverse).items():
                    callers[name] = callers.get(name, 0) + ps
            groups.append(
                {"host": p.host, "plane": p.name, "line": ln.name, "count": int(mask.sum()), "outermost": outer,
                 "total_ms": round(covered_ps / 1e9, 4), "max_us": round(float(d.max()) / 1e6, 3),
                 "mean_gap_ms": round(float(g.mean()) / 1e9, 4) if len(g) else None}
            )
    if not groups and not not_time:
        raise NotAvailable(f"no event matches {pattern!r}" + (f" on planes with {plane!r}" if plane else "") + (f", lines with {line!r}" if line else ""))
    if not groups:  # only samples or instants matched: what they are, and no time
        return ToolOutput({"pattern": pattern, "matches": count, "outermost_matches": 0, "total_ms": None,
                           "not_time_matches": count, "total_is": _NO_TIME}, {"not_time": not_time}, "profile events")
    summary = {
        "pattern": pattern, "matches": count, "outermost_matches": outer_count, "total_ms": round(total_ps / 1e9, 4),
        "total_is": "the time the matching events cover on each line (one nested in another counted once), summed "
                    "over lines",
        "mean_us": round(total_ps / outer_count / 1e6, 3), "max_us": round(longest / 1e6, 3),
        "mean_gap_ms": round(gap_total / gap_count / 1e9, 4) if gap_count else None,
        "max_gap_ms": round(longest_gap / 1e9, 4) if gap_count else None,
        "distinct_names": len(names_time),
    }
    if not_time:
        summary["not_time_matches"] = sum(g["count"] for g in not_time)
    if len(covered) < len(session.hosts):
        summary.update(hosts_covered=[host.hostname for host in covered], hosts_in_session=len(session.hosts))
    top = sorted(names_time.items(), key=lambda kv: -kv[1])[:20]
    detail = {"groups": sorted(groups, key=lambda g: -g["total_ms"])[:50],
              "top_names": [{"name": n, "total_ms": round(t / 1e9, 4)} for n, t in top]}
    for key, totals in (("user_frames", user_frames), ("modules", modules), ("user_callers", callers)):
        if totals:
            detail[key] = [{"name": n, "total_ms": round(t / 1e9, 4)}
                           for n, t in sorted(totals.items(), key=lambda kv: -kv[1])[:TOP_FRAMES]]
    if not_time:
        detail["not_time"] = not_time
    return ToolOutput(summary, detail, "profile events")


_NO_TIME = ("none: the matching events are counter samples or zero-length instants (detail.not_time), which take no "
            "time; count them, never sum them")


def _callers(p, ln, kind_of, starts, durations, names, inverse) -> dict[str, int]:
    """The user's frames on line `ln` that enclose its matching events that are not themselves user frames."""
    not_user = np.array([kind_of(name) != "user" for name in names], dtype=bool)[inverse]
    waits = list(zip(starts[not_user].tolist(), (starts + durations)[not_user].tolist()))
    if not waits:
        return {}
    user_ids = np.fromiter((k for k, n in p.event_names.items() if kind_of(n) == "user"), dtype=np.int64)
    if not len(user_ids):
        return {}
    mask = isin_ids(ln.metadata_id, user_ids)
    if not mask.any():
        return {}
    s, d = ln.starts.at(mask), ln.durations.at(mask)
    frames = zip(s.tolist(), (s + d).tolist(), (p.event_names.get(int(m), "") for m in ln.metadata_id[mask].tolist()))
    return enclosing_user_frames(frames, waits)
