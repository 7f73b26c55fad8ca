"""Host summaries: what the broad tools read of one host, built where the host is decoded, and the session's tables
assembled from them, so that whoever assembles a many-host session (the reduce, a tool instance, `xdiag analyze`)
holds kilobytes per host instead of its columns or its op executions.

A summary is built in the map stage from the one host it decoded (`summarize_host`): the per-op aggregates (time,
executions per kernel, HLO cost, per program), the steps and their rows per timeline, the per-device rows and duty
cycles, every collective execution with the key of its instance (for the arrivals across hosts), the host's
warm-up calls and largest blocking wait, its allocator totals, op executions per device, its profile bounds, the
host's planes (names, stats, line names and event counts, no events), its HLO modules; on device platforms also
its async-copy pairs (spans and link rates), its op time in the profile's 'data formatting' category and, on GPU,
its kernels (launches, time, launching op). Times are the host's own,
from its earliest line (`origin_ns`); host names are a placeholder until the reduce knows whether two hosts share a
name. `assemble` combines summaries in the session's file order into the tables the whole-session read builds,
value for value (the per-step tables as arrays, xdiag.analysis.packed; the collectives' arrivals across hosts
computed there, once, not every execution), and `adopt` puts them in a session's cache, where the tools find them; `summary_session` is a
session of the hosts' planes without their events (a column read from it raises `ColumnsNotInSummary`).

Where the combination would not be the whole-session read's, `assemble` says why (`NotSummarized`) and the caller
reads the columns as before: PyTorch traces (a kernel's FLOPs are shared out over every host's launches), and
sessions whose hosts found their steps in different ways. XProf's own views are not in the summaries: they read
the xplane files, of every host or of the subset a many-host session names (xdiag.analysis.xprof.host_subset).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xdiag.analysis.breakdown import StepRow, device_rows, step_rows
from xdiag.analysis.device_time import DeviceRow
from xdiag.analysis.duty_cycle import DutyCycle, duty_cycles
from xdiag.analysis.op_table import device_op_counts, op_table
from xdiag.analysis.prepared import _as_columns, _from_columns, _typed, _untyped
from xdiag.analysis.session_cache import MadeOnFirstRead
from xdiag.analysis.steps import Step, StepSet, profile_window_ps, step_set
from xdiag.analysis import packed
from xdiag.analysis.stragglers import (
    Arrivals,
    Participant,
    arrivals_of,
    collective_arrivals,
    collective_records,
    straggler,
)
from xdiag.analysis.transfers import combined_transfer_spans, transfer_pairs
from xdiag.analysis.warm_up import WarmUpCall
from xdiag.errors import XdiagError
from xdiag.profile.compact import _plain, module_from_record, module_record
from xdiag.profile.reader import MAX_SHIFT_PS, assemble_session, shift_line
from xdiag.profile.space import NO_VALUE, HloModule, HostProfile, Line, Plane, Session, platform_of
from xdiag.profile.trace_json import KINETO, trace_format
from xdiag.tools.detect_layout_mismatch_copies import combined_data_formatting, data_formatting_ps
from xdiag.tools.get_device_information import FRAMEWORK_MARKS
from xdiag.tools.get_kernel_stats import combined_kernel_table, kernel_table
from xdiag.analysis.memory_use import allocator_totals
from xdiag.tools.get_step_trace import host_calls
from xdiag.analysis.op_stats import OpStat, _names_with_several_programs, op_stats
from xdiag.analysis.line_view import combined_python_frame_times, python_frame_times
from xdiag.analysis.source_lines import op_source

FORMAT = 3
ASSEMBLED_FORMAT = 4
"""Of what `assemble` writes: an assembled session of an earlier format is assembled again from its hosts'."""
HOST = "@@xdiag-host@@"
"""The host's name in its summary until the reduce names it (two hosts may have recorded the same name)."""
SUFFIX = ".summary.json.gz"
CACHED = ("op_stats", "step_set", "step_rows", "device_rows", "duty_cycles", "bounds", "collective_arrivals",
          "host_calls", "allocator_totals", "device_op_counts", "transfer_spans", "data_formatting", "kernel_table",
          "python_frame_times")
"""The session's cache entries a summary provides: every table the broad tools build from columns."""


class NotSummarized(XdiagError):
    """The session's tables cannot be assembled from its hosts' summaries exactly; the reason says why."""


class ColumnsNotInSummary(XdiagError):
    """A session assembled from summaries was asked for events: its columns stayed in the hosts' prepared files."""


def summary_path(prepared: Path) -> Path:
    """Where the summary of the host whose prepared columns are at `prepared` is written, beside them."""
    return prepared.with_name(prepared.name + SUFFIX)


def summarize_host(host: HostProfile, modules: list[HloModule]) -> dict[str, Any]:
    """The summary of one host as decoded (each line's times from its own timestamp; they are moved to the host's
    earliest line, in place: write the host's columns first)."""
    name, file, size = host.hostname, host.path.name, host.size_bytes
    host.hostname = HOST
    for item in (*host.planes, *modules):
        item.host = HOST
    session = assemble_session([(host, modules)], HOST)
    timestamps = [line.timestamp_ns for plane in host.planes for line in plane.lines if len(line)]
    out: dict[str, Any] = {
        "format": FORMAT, "hostname": name, "file": file, "size_bytes": size,
        "origin_ns": session.origin_ns if timestamps else None,
        "errors": host.errors, "warnings": host.warnings,
        "planes": [_plane_record(plane) for plane in host.planes],
        "modules": [module_record(module) for module in session.hlo_modules],
        "not_summarized": _not_summarized(session),
    }
    if out["not_summarized"]:
        return out
    steps = step_set(session)
    warm, waits = host_calls(session, steps.steps)
    bounds = profile_window_ps(session)
    out["tables"] = _typed({
        "op_stats": _op_rows(session),
        "step_set": {"source": steps.source, "annotation": steps.annotation, "sources": steps.sources,
                     "markers": steps.markers, "transfer_only": steps.transfer_only},
        "steps": _as_columns(steps.steps),
        "step_rows": _as_columns(step_rows(session)),
        "device_rows": _as_columns(device_rows(session)),
        "duty_cycles": _as_columns(duty_cycles(session)),
        "bounds": list(bounds) if timestamps else None,
        "collectives": [[list(key), device, start, end] for key, device, start, end in collective_records(session)],
        "warm_up_calls": _as_columns(warm),
        "sync_waits": [list(wait) for wait in waits],
        "allocator_totals": allocator_totals(session),
        "device_op_counts": device_op_counts(session),
        "transfer_pairs": transfer_pairs(session),
        "data_formatting": data_formatting_ps(session),
        "kernel_table": kernel_table(session),
        "python_frame_times": python_frame_times(session),
    })
    return out


def _not_summarized(session: Session) -> str | None:
    if trace_format(session) == KINETO:
        return "a PyTorch trace: each kernel's FLOPs are shared out over the launches of every host"
    return None


def _plane_record(plane: Plane) -> dict[str, Any]:
    marks = {}
    for text in plane.event_names.values() if plane.name == "/host:CPU" else ():
        for mark in FRAMEWORK_MARKS:
            if mark not in marks and text.startswith(mark):
                marks[mark] = text
    return {"id": plane.id, "name": plane.name, "stats": {k: _plain(v) for k, v in plane.stats.items()},
            "event_names": list(marks.values()),
            "lines": [[line.name, line.display_name, len(line)] for line in plane.lines]}


def _op_rows(session: Session) -> list[dict[str, Any]]:
    """op_stats' rows with what combining them needs: the row's key as op_stats orders it (module, program id,
    name), its module's name and display name, and its executions per kernel (an op ran as often as its most
    launched kernel)."""
    ops = op_table(session)
    per_code = np.bincount(ops.op, minlength=len(ops.op_keys)).tolist() if len(ops) else []
    kernels: dict[str, dict[str, list[int]]] = {}
    programs: dict[str, tuple[str, int]] = {}
    for (module_name, pid, name, kernel), count in zip(ops.op_keys, per_code):
        key = f"{module_name}\x00{pid}\x00{name}"
        kernels.setdefault(key, {}).setdefault(kernel, []).append(count)
        programs[key] = (module_name, pid)
    shared = _names_with_several_programs(session)
    by_label = {}
    for key, (module_name, pid) in programs.items():
        module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
        label = module.display_name if module is not None and module_name in shared else module_name
        by_label[(label, key.split("\x00", 2)[2])] = (key, module_name, module.display_name if module else None)
    rows = []
    for stat in op_stats(session):
        key, module_name, display = by_label[(stat.module, stat.name)]
        rows.append({"key": key, "module_name": module_name, "display_name": display, "name": stat.name,
                     "category": stat.category, "total_ps": stat.total_ps, "kernels": kernels[key], "cost": stat.cost})
    return rows


def _named(part: Any, name: str) -> Any:
    """A part of a host's summary with its host's name in place of the placeholder, everywhere it appears."""
    text = json.dumps(part)
    return json.loads(text.replace(HOST, json.dumps(name)[1:-1]))


def assemble(summaries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The session's tables from its hosts' summaries (in the session's file order), as the whole-session read
    builds them: a JSON document `adopt` and `summary_session` read. NotSummarized where they would differ. The
    summaries are taken one at a time: of each, its op rows are folded into the session's at once (most of a device
    host's summary, the same keys on every host), its other tables and planes are kept, and its HLO modules not seen
    yet."""
    named, stored, long, modules, programs = [], [], [], {}, []
    ops: dict[str, dict[str, Any]] = {}
    for s in summaries:
        if s.get("not_summarized"):
            raise NotSummarized(f"{s['file']}: {s['not_summarized']}")
        if s.get("format") != FORMAT:
            raise NotSummarized(f"{s['file']}: a host summary of another format")
        named.append({key: s[key] for key in ("hostname", "file", "size_bytes", "errors", "warnings", "planes",
                                               "origin_ns")})
        tables = s["tables"]  # per-step tables packed now: they grow with the steps (op rows, with the ops)
        long.append({key: packed.pack(tables.pop(key)) for key in ("steps", "step_rows")})
        _fold_op_rows(ops, _untyped(tables.pop("op_stats")))
        stored.append(tables)
        programs.append({})
        for module in s["modules"]:
            programs[-1].setdefault(module["name"], set()).add(module["program_id"])
            modules.setdefault((module["name"], module["program_id"]), (len(named) - 1, module))
    counts: dict[str, int] = {}
    for host in named:
        counts[host["hostname"]] = counts.get(host["hostname"], 0) + 1
    for host in named:  # as assemble_session tells apart hosts that recorded one name
        if counts[host["hostname"]] > 1:
            host["hostname"] = f"{host['hostname']}:{host['file'].removesuffix('.xplane.pb')}"
    origins = [s["origin_ns"] for s in named if s["origin_ns"] is not None]
    origin = min(origins) if origins else 0
    shifts = [(s["origin_ns"] - origin) * 1000 if s["origin_ns"] is not None else 0 for s in named]
    if max(shifts, default=0) > MAX_SHIFT_PS // 2:  # a host's times lie within MAX_SHIFT_PS: so moved, none wraps
        raise NotSummarized("the hosts' first lines lie too far apart to join their times here")
    tables = []
    for k, (table, host) in enumerate(zip(stored, named)):
        tables.append(_untyped(_named(table, host["hostname"])))
        name = host["hostname"]
        long[k] = {key: packed.rename(part, lambda text: text.replace(HOST, name)) for key, part in long[k].items()}
    del stored
    modules = {key: _named(module, named[k]["hostname"]) for key, (k, module) in modules.items()}
    by_name = sorted(range(len(named)), key=lambda k: named[k]["hostname"])

    sources = {t["step_set"]["source"] for t in tables}
    annotated = [t["step_set"]["source"] == "step annotations" for t in tables]
    if any(annotated) and not all(annotated):
        raise NotSummarized("some hosts mark their steps with annotations and others do not")
    if "whole profile" in sources and len(tables) > 1:
        raise NotSummarized("a host has no steps: the whole-session read spans its window with the others' steps")
    _same_programs(named, programs)
    keep = by_name

    steps = packed.joined([long[k]["steps"] for k in keep], [shifts[k] for k in keep])
    step_rows_joined = packed.joined([long[k]["step_rows"] for k in keep])
    del long
    step_sources, markers, transfer_only = {}, {}, []
    for k in keep:
        step_sources.update(tables[k]["step_set"]["sources"])
        markers.update(tables[k]["step_set"]["markers"])
        transfer_only += tables[k]["step_set"]["transfer_only"]
    if all(annotated):
        annotation = next((t["step_set"]["annotation"] for t in tables if t["step_set"]["annotation"]), "")
        found = StepSet([], "step annotations", annotation)
    else:
        step_sources = dict(sorted(step_sources.items()))
        values = list(step_sources.values())
        common = max(set(values), key=values.count)
        marker = next((markers[d] for d in step_sources if step_sources[d] == common and d in markers), "")
        found = StepSet([], common, marker, step_sources, sorted(transfer_only), dict(sorted(markers.items())))

    records = []
    for k, table in enumerate(tables):
        records += [(tuple(key), device, start + shifts[k], end + shifts[k])
                    for key, device, start, end in table["collectives"]]
    records.sort(key=lambda record: record[2])  # stable: ties keep the session's order, as the op table's
    arrivals = arrivals_of(records)  # here, once: each tool instance reads the arrivals, not every execution
    del records
    bounds = [(t["bounds"][0] + shifts[k], t["bounds"][1] + shifts[k]) for k, t in enumerate(tables) if t["bounds"]]
    totals = [t["allocator_totals"] for t in tables if t["allocator_totals"]]
    warm = []
    for k, table in enumerate(tables):
        warm += [{**row, "start_ps": row["start_ps"] + shifts[k], "end_ps": row["end_ps"] + shifts[k]}
                 for row in _from_columns(table["warm_up_calls"])]
    return {
        "format": ASSEMBLED_FORMAT,
        "origin_ns": origin,
        "hosts": [{key: s[key] for key in ("hostname", "file", "size_bytes", "errors", "warnings", "planes")}
                  for s in named],
        "modules": list(modules.values()),
        "tables": _typed({
            "op_stats": _combined_op_rows(ops, list(modules.values())),
            "step_set": {f.name: getattr(found, f.name) for f in dataclasses.fields(found) if f.name != "steps"},
            "steps": packed.encode(steps),
            "step_rows": packed.encode(step_rows_joined),
            "device_rows": _as_columns([row for k in keep for row in _rows(tables[k]["device_rows"], DeviceRow)]),
            "duty_cycles": _as_columns(sorted((row for k in by_name
                                               for row in _rows(tables[k]["duty_cycles"], DutyCycle)),
                                              key=lambda row: row.device)),
            "bounds": [min(b[0] for b in bounds), max(b[1] for b in bounds)] if bounds else [0, 0],
            "collective_arrivals": None if arrivals is None else dataclasses.asdict(arrivals),
            "warm_up_calls": _as_columns([WarmUpCall(**row) for row in warm]),
            "sync_waits": [wait for t in tables for wait in t["sync_waits"]],
            "allocator_totals": {"peak_bytes": max(t["peak_bytes"] for t in totals),
                                 "in_use_bytes_sum": sum(t["in_use_bytes_sum"] for t in totals),
                                 "events": sum(t["events"] for t in totals)} if totals else None,
            "device_op_counts": dict(sorted((device, count) for t in tables
                                            for device, count in t["device_op_counts"].items())),
            "transfer_spans": combined_transfer_spans([t["transfer_pairs"] for t in tables]),
            "data_formatting": combined_data_formatting([t["data_formatting"] for t in tables]),
            "kernel_table": combined_kernel_table([t["kernel_table"] for t in tables]),
            "python_frame_times": combined_python_frame_times([t["python_frame_times"] for t in tables]),
        }),
    }


def _same_programs(hosts: list[dict[str, Any]], programs: list[dict[str, set[int]]]) -> None:
    """NotSummarized where, on a device platform, hosts ran different programs of one name: the whole-session read
    looks the profile's cost model and the async-copy pairs up by program name across hosts, a host's summary
    within the host (the hosts of a pod run the same programs, of the same ids, everywhere)."""
    if platform_of(plane["name"] for host in hosts for plane in host["planes"]) == "CPU":
        return
    seen: dict[str, set[int]] = {}
    for ids_by_name in programs:
        for name, ids in ids_by_name.items():
            if seen.setdefault(name, ids) != ids:
                raise NotSummarized(f"hosts ran different programs named {name} (program ids {sorted(seen[name])} "
                                    f"and {sorted(ids)}): the whole-session read looks the profile's op costs and "
                                    "async copies up by program name across hosts")


def _rows(stored: dict[str, Any], kind: type) -> list:
    return [kind(**row) for row in _from_columns(stored)]


def _fold_op_rows(combined: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """One host's op_stats rows added into the session's: time and executions per kernel summed per op key, the
    first host's row giving the rest."""
    for row in rows:
        into = combined.get(row["key"])
        if into is None:
            combined[row["key"]] = {**row, "kernels": {k: list(v) for k, v in row["kernels"].items()}}
            continue
        into["total_ps"] += row["total_ps"]
        for kernel, counts in row["kernels"].items():
            mine = into["kernels"].setdefault(kernel, [0] * len(counts))
            if len(mine) != len(counts):
                raise NotSummarized(f"op {row['name']} resolves from different events on different hosts")
            into["kernels"][kernel] = [a + b for a, b in zip(mine, counts)]


def _combined_op_rows(combined: dict[str, dict[str, Any]], modules: list[dict]) -> list[dict[str, Any]]:
    """op_stats of the session from its hosts' rows folded together (_fold_op_rows): an op's executions those of
    its most launched kernel, labelled as op_stats labels a program whose name several programs share, busiest
    first with ties in key order (op_stats' order)."""
    seen: dict[str, set[int]] = {}
    for module in modules:
        seen.setdefault(module["name"], set()).add(module["program_id"])
    shared = {name for name, ids in seen.items() if len(ids) > 1}
    out = []
    for key in sorted(combined):
        row = combined[key]
        label = row["display_name"] if row["display_name"] and row["module_name"] in shared else row["module_name"]
        count = max(c for counts in row["kernels"].values() for c in counts)
        out.append({"module": label, "name": row["name"], "category": row["category"], "count": count,
                    "total_ps": row["total_ps"], "cost": row["cost"]})
    out.sort(key=lambda row: -row["total_ps"])
    return out


def _arrivals(stored: dict[str, Any] | None) -> Arrivals | None:
    if stored is None:
        return None
    return Arrivals(**{**stored, "participants": {name: Participant(**row)
                                                  for name, row in stored["participants"].items()}})


def adopt(session: Session, assembled: dict[str, Any]) -> None:
    """Puts the assembled tables in the session's cache (over anything built there), each made from its stored form
    where a tool first reads it (MadeOnFirstRead)."""
    tables = _untyped(assembled["tables"])
    session.cache = MadeOnFirstRead(session.cache, {
        # Each op's source line from the assembled modules' stacks, as op_stats finds it from the whole session's.
        "op_stats": lambda: [OpStat(**row, source=op_source(session.module_for(row["module"]) if row["module"] else None,
                                                           row["name"])) for row in tables["op_stats"]],
        "step_set": lambda: StepSet(steps=packed.rows(packed.decode(tables["steps"]), Step), **tables["step_set"]),
        "step_rows": lambda: packed.rows(packed.decode(tables["step_rows"]), StepRow),
        "device_rows": lambda: _rows(tables["device_rows"], DeviceRow),
        "duty_cycles": lambda: _rows(tables["duty_cycles"], DutyCycle),
        "bounds": lambda: tuple(tables["bounds"]),
        "collective_arrivals": lambda: _arrivals(tables["collective_arrivals"]),
        "host_calls": lambda: (_rows(tables["warm_up_calls"], WarmUpCall),
                               [tuple(wait) for wait in tables["sync_waits"]]),
        "allocator_totals": lambda: tables["allocator_totals"],
        "device_op_counts": lambda: tables["device_op_counts"],
        "transfer_spans": lambda: tables["transfer_spans"],
        "data_formatting": lambda: None if tables["data_formatting"] is None else tuple(tables["data_formatting"]),
        "kernel_table": lambda: tables["kernel_table"],
        "python_frame_times": lambda: tables["python_frame_times"],
    })


def adopt_mapped(session: Session, prepared: list[Path]) -> str | None:
    """Puts the tables assembled from the summaries beside the hosts' prepared files (in the session's order) in
    the session's cache; None, or why not (the session's tools then build their tables from its columns)."""
    try:
        assembled = assemble(read(summary_path(path)) for path in prepared)
    except (NotSummarized, FileNotFoundError, ValueError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"
    adopt(session, assembled)
    return None


class _SummarizedLine(Line):
    """A line of a host known from its summary: its name and how many events it has, not the events."""

    def __init__(self, name: str, display_name: str, events: int):  # noqa: D107 - Line's columns stay unset
        self.id, self.name, self.display_name, self.timestamp_ns, self._events = -1, name, display_name, 0, events

    def __len__(self) -> int:
        return self._events

    def __getattr__(self, attribute: str):
        raise ColumnsNotInSummary(f"line {self.name!r}: {attribute} is in the host's prepared columns, not its summary")


def summary_session(assembled: dict[str, Any], name: str) -> Session:
    """A session of the assembled hosts' planes (names, stats, line names and event counts) and HLO modules, the
    tables in its cache; reading an event from it raises ColumnsNotInSummary."""
    hosts = []
    for h in assembled["hosts"]:
        planes = [Plane(id=p["id"], name=p["name"], host=h["hostname"], event_names=dict(enumerate(p["event_names"])),
                        event_display_names={}, event_metadata_stats={}, stats=p["stats"], strings=[],
                        lines=[_SummarizedLine(*line) for line in p["lines"]])
                  for p in h["planes"]]
        hosts.append(HostProfile(hostname=h["hostname"], path=Path(h["file"]), size_bytes=h["size_bytes"],
                                 planes=planes, errors=h["errors"], warnings=h["warnings"], summarized=True))
    session = Session(name=name, hosts=hosts, hlo_modules=[module_from_record(m) for m in assembled["modules"]],
                      origin_ns=assembled["origin_ns"])
    adopt(session, assembled)
    return session


FOLLOW_UP_HOSTS = 3
"""Hosts whose events a follow-up reads in a session assembled from summaries: the straggler, the slowest, a sample
(those of them whose files fit the session limit together: hosts_within)."""


def hosts_that_matter(session: Session, most: int = FOLLOW_UP_HOSTS) -> list[int]:
    """The positions (in session.hosts) of the hosts a follow-up that reads events looks at, from the session's
    tables: the straggler of the collectives across hosts, the host with the longest mean step, the first host."""
    names = [host.hostname for host in session.hosts]
    steps: dict[str, list[float]] = {}
    for row in step_rows(session):
        steps.setdefault(row.host, []).append(row.step_ms)
    means = {host: float(np.mean(times)) for host, times in steps.items()}
    chosen = []
    arrivals = collective_arrivals(session)
    if arrivals is not None and arrivals.level == "hosts" and means:
        slow = straggler(arrivals, max(len(times) for times in steps.values()), float(np.mean(list(means.values()))))
        if slow is not None and slow.name in names:
            chosen.append(names.index(slow.name))
    if means and max(means, key=means.get) in names:
        chosen.append(names.index(max(means, key=means.get)))
    chosen.append(0)
    return list(dict.fromkeys(chosen))[:most]


def hosts_within(sizes: Sequence[int], preferred: Sequence[int], max_bytes: int | None) -> list[int]:
    """The positions of the hosts whose files a reader of several hosts at once takes (XProf's views; the events
    the follow-ups read): every host where their files fit `max_bytes` together, else those of `preferred` (in its
    order) that fit together; possibly none."""
    if max_bytes is None or sum(sizes) <= max_bytes:
        return list(range(len(sizes)))
    chosen, total = [], 0
    for position in dict.fromkeys(preferred):
        if total + sizes[position] <= max_bytes:
            chosen.append(position)
            total += sizes[position]
    return chosen


def take_events(session: Session, position: int, mapped: Session) -> None:
    """The session's host at `position` replaced by the same host's prepared columns (`mapped`, the map stage's
    file of it: times from each line's own timestamp), named and timed as the whole-session read names and times it."""
    known, host = session.hosts[position], mapped.hosts[0]
    host.hostname, host.path = known.hostname, known.path
    for plane in host.planes:
        plane.host = known.hostname
        for line in plane.lines:
            shift_line(line, (line.timestamp_ns - session.origin_ns) * 1000, known.path.name, plane.name)
    session.hosts[position] = host


def encode(document: dict[str, Any]) -> bytes:
    """A summary (or an assembled session's) as gzipped JSON."""
    return gzip.compress(json.dumps(document, separators=(",", ":")).encode(), compresslevel=6)


def decode(data: bytes) -> dict[str, Any]:
    return json.loads(gzip.decompress(data))


def write(document: dict[str, Any], path: Path) -> int:
    data = encode(document)
    path.write_bytes(data)
    return len(data)


def read(path: Path) -> dict[str, Any]:
    return decode(path.read_bytes())


def main() -> int:
    """`python -m xdiag.tools.host_summary`: a map worker (xdiag.profile.hosts_map's protocol) that also writes each
    host's summary beside its prepared columns (summary_path); a host it cannot summarise gets a summary that says
    why (`not_summarized`), and its session is read from the columns."""
    from xdiag.profile import hosts_map

    return hosts_map.serve_maps(lambda path, out, threads: map_and_summarize(path, out, threads)[1])


def map_and_summarize(path: Path, out: Path, threads: int = 1) -> tuple[int, int]:
    """The map stage of one host (hosts_map.map_host) and its summary at summary_path(out); returns (bytes of its
    columns, bytes of its summary)."""
    from xdiag.profile.hosts_map import map_host_read

    host, modules, size = map_host_read(path, out, threads)
    try:
        summary = summarize_host(host, modules)
    except Exception as exc:  # noqa: BLE001 - a host the summary cannot take is read from its columns instead
        summary = {"format": FORMAT, "hostname": host.hostname, "file": path.name,
                   "not_summarized": f"its summary failed ({type(exc).__name__}: {exc})"}
    return size, write(summary, summary_path(out))


if __name__ == "__main__":
    sys.exit(main())
