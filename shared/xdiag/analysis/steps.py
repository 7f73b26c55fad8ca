"""What is a step, and where does each one start and end? The session's steps: from step annotations, else each
device's own timeline (its `Steps` line, its `XLA Modules` executions, the period of its op sequence, its host's
launches), else the whole profile; and the profile's window."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from xdiag.analysis.categories import TRANSFER_OP_CATEGORIES
from xdiag.analysis.host_threads import host_threads
from xdiag.analysis.op_table import OpTable, module_spans, op_table
from xdiag.analysis.session_cache import cached
from xdiag.profile.space import Plane, Session
from xdiag.text_numbers import whole_number


@dataclass(slots=True)
class Step:
    host: str
    number: int
    start_ps: int
    end_ps: int
    device: str | None = None  # the device whose own timeline this step is on; None: every device of the host

    @property
    def duration_ps(self) -> int:
        return self.end_ps - self.start_ps


@dataclass
class StepSet:
    steps: list[Step]
    source: str  # how steps were found: step annotations, device Steps line, module executions, op period, whole window
    annotation: str  # the annotation or module name that marks a step
    sources: dict[str, str] = field(default_factory=dict)  # device -> how its own steps were found (device steps only)
    transfer_only: list[str] = field(default_factory=list)  # devices that only copied data: not compute timelines
    markers: dict[str, str] = field(default_factory=dict)  # device -> what marks its own steps (device steps only)


MIN_PERIOD_MATCH = 0.9
"""Share of ops that must repeat one period later for an op sequence to count as a repeating step."""
CLEAR_PERIOD_MATCH = 0.99
"""A multiple of the period that repeats this exactly is the step (layers repeat inside a step, steps repeat whole)."""
_MAX_PERIOD_OPS = 50_000  # ops looked at to find the period; the period then applies to the whole device timeline
_MAX_PERIOD_CANDIDATES = 64


def repeating_period(tokens: np.ndarray) -> tuple[int, float] | None:
    """(period, match) of the smallest repeating unit of a token sequence seen at least twice, else None.

    Candidate periods are the distances between successive occurrences of one token; a candidate holds when
    at least MIN_PERIOD_MATCH of the tokens equal the token one period later (captures start and stop inside
    a step, and a step's data-dependent parts may differ).
    """
    codes = np.unique(np.asarray(tokens[:_MAX_PERIOD_OPS]), return_inverse=True)[1]
    n = len(codes)
    if n < 4:
        return None
    order = np.lexsort((np.arange(n), codes))
    same = codes[order][1:] == codes[order][:-1]
    distances = (order[1:] - order[:-1])[same]
    distances = distances[(distances >= 1) & (distances <= n // 2)]
    if not len(distances):
        return None
    values, counts = np.unique(distances, return_counts=True)
    candidates = np.sort(values[np.argsort(-counts, kind="stable")[:_MAX_PERIOD_CANDIDATES]])
    match = {int(p): float(np.mean(codes[:-p] == codes[p:])) for p in candidates}
    held = [p for p in match if match[p] >= MIN_PERIOD_MATCH]
    if not held:
        return None
    period = held[0]
    if match[period] < CLEAR_PERIOD_MATCH:
        clearer = [p for p in held if p % period == 0 and match[p] >= CLEAR_PERIOD_MATCH]
        period = clearer[0] if clearer else period
    return period, round(match[period], 3)


def _device_of(plane: Plane) -> str:
    return f"{plane.host} {plane.name}"


def transfer_only_devices(session: Session) -> list[str]:
    """Devices whose every op only copies data (H2D/D2H memcpy, async copies): not compute timelines."""

    def build() -> list[str]:
        ops = op_table(session)
        moving = ops.in_categories(TRANSFER_OP_CATEGORIES)
        return sorted(set(ops.devices()) - set(ops.devices(~moving)))

    return cached(session, "transfer_only_devices", build)


def _windows_from_starts(host: str, device: str, starts: np.ndarray, last_end: int) -> list[Step]:
    """Steps from one start to the next (the gaps between them are idle time in the step); the last ends at `last_end`."""
    ends = np.append(starts[1:], last_end)
    return [Step(host, i, int(a), int(b), device) for i, (a, b) in enumerate(zip(starts, ends)) if b > a]


def _device_steps_lines(session: Session) -> dict[str, list[Step]]:
    """Device -> steps from that device's own `Steps` line (each device runs its step at its own time)."""
    out: dict[str, list[Step]] = {}
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            if line.name == "Steps" and len(line):
                names = plane.names_of(line)
                device = _device_of(plane)
                starts, ends = line.start_ps.tolist(), line.end_ps.tolist()
                out[device] = [
                    Step(plane.host, whole_number(str(n), i), starts[i], ends[i], device)
                    for i, n in enumerate(names)
                ]
                break
    return out


def _module_line_steps(plane: Plane) -> tuple[list[Step], str] | None:
    """Executions of the plane's busiest module on its `XLA Modules` line, each from its start to the next's."""
    spans = module_spans(plane)
    if spans is None or len(spans[0]) < 2:
        return None
    starts, ends, names = spans
    uniq, inverse = np.unique(names, return_inverse=True)
    main = uniq[int(np.argmax(np.bincount(inverse, weights=(ends - starts).astype(float))))]
    mask = names == main
    if mask.sum() < 2:
        return None
    return _windows_from_starts(plane.host, _device_of(plane), starts[mask], int(ends[mask].max())), str(main)


def _op_sequence_steps(ops: OpTable, device: str) -> tuple[list[Step], str]:
    """A device without step markers: the repeating unit of its op sequence as the step, from the first op of one
    repetition to the first of the next. First the sequence of ops (program and op name); else the sequence of
    program launches (runs of ops of one program), which repeats even where a program's kernels vary; else the
    device's whole window as one step."""
    mask = ops.on_device(device)
    starts, ends = ops.start_ps[mask], ops.end_ps[mask]
    host = device.split(" ", 1)[0]
    gaps = np.concatenate([[0], starts[1:] - np.maximum.accumulate(ends)[:-1]])
    # A program is its module and compiled version: jit_dot for two shapes is two programs, not a repetition. Ops
    # and programs are integer labels of op codes (a TPU host's tens of millions of rows hold no text).
    rows = ops.op[mask]
    programs = ops.grouped_by(lambda key: key[:2])[0][rows]
    launch_starts = np.flatnonzero(np.concatenate([[True], programs[1:] != programs[:-1]]))
    for unit, positions, tokens in (
        ("ops", np.arange(len(starts)), ops.grouped_by(lambda key: key[:3])[0][rows]),
        ("program launches", launch_starts, programs[launch_starts]),
    ):
        found = repeating_period(tokens)
        if found is None:
            continue
        period, match = found
        first = _unit_starts(positions, gaps, period)
        if len(first) >= 2:
            steps = _windows_from_starts(host, device, starts[first], int(ends[first[-1]:].max()))
            return steps, f"repeating op sequence ({period} {unit} per step, {round(100 * match)}% repeat)"
    return [Step(host, 0, int(starts.min()), int(ends.max()), device)], NO_REPEATING_STEP


def _unit_starts(positions: np.ndarray, gaps: np.ndarray, period: int) -> np.ndarray:
    """The positions that begin a repeating unit of `period` items: a step begins after the longest pause, the
    phase of the period preceded by the largest mean gap (`gaps`: idle time before each item)."""
    phase_gap = np.bincount(np.arange(len(positions)) % period, weights=gaps[positions].astype(float), minlength=period)
    return positions[np.arange(int(np.argmax(phase_gap[:period])), len(positions), period)]


def _program_sequence_steps(plane: Plane, line_steps: list[Step]) -> tuple[list[Step], str] | None:
    """Where the device's `Steps` line marks every program execution as a step but an iteration runs several
    programs (a host loop that converts, normalises and trains in separate jitted calls): the repeating unit of
    the whole program sequence, from its first program's start to the next unit's. None where the Steps line
    marks fewer steps than programs ran, or the sequence repeats program by program."""
    spans = module_spans(plane)
    if spans is None or len(line_steps) < len(spans[0]):
        return None
    starts, ends, names = spans
    found = repeating_period(names)
    if found is None or found[0] < 2:
        return None
    period, match = found
    gaps = np.concatenate([[0], starts[1:] - np.maximum.accumulate(ends)[:-1]])
    first = _unit_starts(np.arange(len(starts)), gaps, period)
    if len(first) < 2:
        return None
    steps = _windows_from_starts(plane.host, _device_of(plane), starts[first], int(ends[first[-1]:].max()))
    # The last unit has no next one to end it: without the host work that follows each unit it is a partial step.
    if len(steps) >= 3 and steps[-1].duration_ps < 0.5 * np.median([s.duration_ps for s in steps[:-1]]):
        steps = steps[:-1]
    return steps, f"repeating program sequence ({period} programs per step, {round(100 * match)}% repeat)"


NO_REPEATING_STEP = "no repeating step: the capture window as one step"
_JITTED_MODULE = re.compile(r"^(jit|pmap)_(.+)$")


def _host_launch_steps(session: Session, ops: OpTable, device: str) -> list[Step] | None:
    """Steps from the host's launches of the device's busiest program (`PjitFunction(f)` for module `jit_f`, one
    compiled version), from one launch to the next: the repeated unit where the device's op sequence does not
    repeat exactly (threads interleave, data-dependent ops)."""
    mask = ops.on_device(device)
    rows = ops.op[mask]
    module_of, modules = ops.grouped_by(lambda key: key[0])
    time = np.bincount(module_of[rows], weights=ops.duration_ps[mask].astype(float), minlength=len(modules))
    ran = sorted(np.flatnonzero(np.bincount(module_of[rows], minlength=len(modules))).tolist(), key=modules.__getitem__)
    busiest = modules[max(ran, key=time.__getitem__)]  # a tie goes to the first name in sorted order
    named = _JITTED_MODULE.match(busiest)
    host = device.split(" ", 1)[0]
    events = next((e for e in host_threads(session) if e.host == host), None)
    compiled = {ops.op_keys[code][1] for code in np.unique(rows).tolist() if ops.op_keys[code][0] == busiest}
    if named is None or events is None or len(compiled) != 1:
        return None  # one function compiled for several shapes: its launches are different programs
    kind = "PjitFunction" if named.group(1) == "jit" else "PmapFunction"
    launches = events.select(re.compile(rf"^{kind}\({re.escape(named.group(2))}\)$"))
    order = np.argsort(launches.start_ps, kind="stable")
    starts, ends = launches.start_ps[order], launches.end_ps[order]
    outer = np.ones(len(starts), dtype=bool)  # a launch nested in another (a jitted call inside one) is one launch
    outer[1:] = starts[1:] >= np.maximum.accumulate(ends)[:-1]
    starts = starts[outer]
    if len(starts) < 2:
        return None
    steps = _windows_from_starts(host, device, starts, int(ops.end_ps[mask].max()))
    # The last launch has no next one to end its step; where its window is far shorter than the others', the
    # host work that precedes each launch is missing from it: a partial step, left out.
    if len(steps) >= 3 and steps[-1].duration_ps < 0.5 * np.median([s.duration_ps for s in steps[:-1]]):
        steps = steps[:-1]
    return steps


def step_set(session: Session) -> StepSet:
    """The session's steps. Step annotations (host-wide) first; else each device's own timeline: its `Steps`
    line, else its `XLA Modules` executions, else the period of its op sequence, else its whole window.
    One device's windows are never applied to another; devices that only copied data get no steps."""

    def build() -> StepSet:
        steps: list[Step] = []
        annotation = ""
        for events in host_threads(session):
            name, marked = events.step_annotations()
            annotation = annotation or name
            steps += [Step(events.host, number, start, end) for number, start, end in marked]
        if steps:
            return StepSet(sorted(steps, key=lambda s: (s.host, s.start_ps)), "step annotations", annotation)
        ops = op_table(session)
        moving_only = transfer_only_devices(session)
        by_line = _device_steps_lines(session)
        sources: dict[str, str] = {}
        markers: dict[str, str] = {}
        planes = {_device_of(p): p for p in session.device_planes(with_events=True)}
        for device in sorted(set(ops.devices()) - set(moving_only)):
            if device in by_line:
                grouped = _program_sequence_steps(planes[device], by_line[device]) if device in planes else None
                if grouped is not None:
                    steps += grouped[0]
                    sources[device], markers[device] = grouped[1], "XLA Modules"
                    continue
                steps += by_line[device]
                sources[device], markers[device] = "device Steps line", "Steps"
                continue
            executions = _module_line_steps(planes[device]) if device in planes else None
            if executions is not None:
                steps += executions[0]
                sources[device] = "executions of the busiest XLA module, start to start (device XLA Modules line)"
                markers[device] = executions[1]
                continue
            found, sources[device] = _op_sequence_steps(ops, device)
            if sources[device] == NO_REPEATING_STEP:
                launches = _host_launch_steps(session, ops, device)
                if launches is not None:
                    found, markers[device] = launches, "host launches"
                    sources[device] = "host launches of the busiest program, start to start"
            steps += found
        if not steps:
            bounds = _profile_bounds(session)
            host = session.hosts[0].hostname if session.hosts else ""
            return StepSet([Step(host, 0, bounds[0], bounds[1])] if bounds[1] > bounds[0] else [], "whole profile", "")
        common = max(set(sources.values()), key=list(sources.values()).count)
        marker = next((markers[d] for d in sources if sources[d] == common and d in markers), "")
        return StepSet(steps, common, marker, sources, moving_only, markers)

    return cached(session, "step_set", build)


def _profile_bounds(session: Session) -> tuple[int, int]:
    lo, hi = None, None
    for host in session.hosts:
        for plane in host.planes:
            for line in plane.lines:
                if len(line):
                    s, e = int(line.start_ps.min()), int(line.end_ps.max())
                    lo = s if lo is None else min(lo, s)
                    hi = e if hi is None else max(hi, e)
        host.release_pages()
    return (lo or 0, hi or 0)


def profile_window_ps(session: Session) -> tuple[int, int]:
    return cached(session, "bounds", lambda: _profile_bounds(session))
