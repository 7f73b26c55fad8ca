"""What the recognisers read: one profile's HLO graphs, op times, device peaks and step facts, each read once."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from xdiag.analysis.breakdown import step_rows, summarize_steps
from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.host_threads import host_threads
from xdiag.analysis.intervals import merge_intervals
from xdiag.analysis.memory_use import memory_use
from xdiag.analysis.op_stats import OpStat, op_stats
from xdiag.analysis.source_lines import frame_kinds, source_of_stack, user_files
from xdiag.analysis.steps import step_set
from xdiag.errors import NotAvailable
from xdiag.idioms.hlo_graph import Graph, Site
from xdiag.profile.space import HloModule, Session


@dataclass
class HostEvents:
    """Host-thread events of one name pattern, over every host: name, start, end and thread of each, by start. Each
    event's name is vocabulary[code]: the Python tracer's events run to millions, their distinct names to hundreds."""

    codes: np.ndarray
    vocabulary: np.ndarray  # object: the names
    start_ps: np.ndarray
    end_ps: np.ndarray
    thread: np.ndarray  # (host, thread) as one number: events nest only within one thread

    def __len__(self) -> int:
        return len(self.start_ps)

    @property
    def names(self) -> np.ndarray:
        return self.vocabulary[self.codes]

    def take(self, index: np.ndarray) -> HostEvents:
        return HostEvents(self.codes[index], self.vocabulary, self.start_ps[index], self.end_ps[index],
                          self.thread[index])

    def named(self, test: Callable[[str], bool]) -> np.ndarray:
        """Per event: test(its name), each name of the vocabulary tested once."""
        verdicts = np.fromiter((bool(test(name)) for name in self.vocabulary), bool, len(self.vocabulary))
        return verdicts[self.codes]

    def where(self, test: Callable[[str], bool]) -> HostEvents:
        return self.take(np.flatnonzero(self.named(test)))

    @staticmethod
    def joined(parts: list[HostEvents]) -> HostEvents:
        """The parts' events one after another, in the parts' order."""
        offsets = np.cumsum([0] + [len(part.vocabulary) for part in parts])
        return HostEvents(np.concatenate([part.codes + offset for part, offset in zip(parts, offsets)]),
                          np.concatenate([part.vocabulary for part in parts]),
                          *(np.concatenate([getattr(part, f) for part in parts])
                            for f in ("start_ps", "end_ps", "thread")))


class Program:
    """One session as the idiom recognisers see it."""

    def __init__(self, session: Session):
        self.session = session

    @cached_property
    def stats(self) -> list[OpStat]:
        return op_stats(self.session)

    @cached_property
    def op_ms(self) -> dict[tuple[str, str], float]:
        """(module, op) -> the op's total time over the capture, in ms; both the module's name and its display
        name key it."""
        out: dict[tuple[str, str], float] = {}
        for s in self.stats:
            out[(s.module, s.name)] = out.get((s.module, s.name), 0.0) + s.total_ms
        return out

    @cached_property
    def rows(self) -> list[dict[str, Any]]:
        """The op rows get_hlo_op_profile gives (share of op time, framework op, roofline), busiest first."""
        total_ps = sum(s.total_ps for s in self.stats)
        return [s.row(total_ps, self.peaks) for s in self.stats]

    @cached_property
    def memory(self) -> dict[str, Any]:
        """The peak against the memory limit, as get_memory_profile summarises it; {} where the profile cannot say."""
        try:
            return memory_use(self.session)[0]
        except NotAvailable:
            return {}

    @cached_property
    def runs(self) -> dict[tuple[str, str], int]:
        return {(s.module, s.name): s.count for s in self.stats}

    @cached_property
    def step(self) -> dict[str, Any]:
        """The step facts get_step_trace summarises (steps, step_time_ms_mean, the breakdown, per-step counts)."""
        return summarize_steps(step_rows(self.session))

    @property
    def profiled_step_ms(self) -> float:
        """The steps' summed time over one timeline: what a stake's share of the step is a share of."""
        return float(self.step.get("step_time_ms_mean") or 0.0) * float(self.step.get("steps") or 0)

    @cached_property
    def step_windows(self) -> tuple[np.ndarray, np.ndarray]:
        """The steps' windows (start, end in ps), merged over the timelines that mark them."""
        steps = step_set(self.session).steps
        return merge_intervals(np.array([s.start_ps for s in steps], np.int64),
                               np.array([s.end_ps for s in steps], np.int64))

    def host_events(self, pattern: re.Pattern) -> HostEvents:
        """The hosts' non-op events whose names match, by start (each pattern read once)."""
        cache = self.__dict__.setdefault("host_events_read", {})
        if pattern.pattern not in cache:
            cache[pattern.pattern] = self._host_events(pattern)
        return cache[pattern.pattern]

    def _host_events(self, pattern: re.Pattern) -> HostEvents:
        # A host known from its summary keeps its tables, not its events: it has none to give (these idioms are
        # not recognised in a session assembled from host summaries)
        summarized = {host.hostname for host in self.session.hosts if host.summarized}
        parts = []
        for number, threads in enumerate(host_threads(self.session)):
            if threads.host in summarized:
                continue
            selected = threads.select(pattern)
            parts.append(HostEvents(*threads.name_codes(pattern), selected.start_ps, selected.end_ps,
                                    selected.line.astype(np.int64) + (number << 32)))
        if not parts:
            empty = np.empty(0, np.int64)
            return HostEvents(empty, np.empty(0, object), empty, empty, empty)
        events = HostEvents.joined(parts)
        return events.take(np.argsort(events.start_ps, kind="stable"))

    @cached_property
    def is_user_frame(self):
        """Python-tracer event name -> whether it is a frame of the user's code (a file the HLO's stacks name)."""
        kind_of = frame_kinds(user_files(self.session.hlo_modules))
        return lambda name: kind_of(name) == "user"

    @cached_property
    def peaks(self) -> dict[str, Any] | None:
        return session_peaks(self.session)

    @property
    def platform(self) -> str:
        return self.session.platform

    @cached_property
    def graphs(self) -> list[Graph]:
        return [Graph(m) for m in self.session.hlo_modules]

    def module_key(self, module: HloModule) -> str:
        """The name op rows give this module's ops (a display name where several programs share a name)."""
        for key in (module.name, getattr(module, "display_name", module.name)):
            if any(k[0] == key for k in self.op_ms):
                return key
        return module.name

    def time_ms(self, module: HloModule, ops: list[str]) -> float:
        key = self.module_key(module)
        return sum(self.op_ms.get((key, op), 0.0) for op in dict.fromkeys(ops))

    def step_percent(self, ms: float) -> float:
        """`ms` of the capture's op time as a share of the profiled steps (capped at 100)."""
        total = self.profiled_step_ms
        return round(min(100.0 * ms / total, 100.0), 2) if total > 0 else 0.0

    def roof_ms(self, flops: float = 0.0, hbm_bytes: float = 0.0) -> float | None:
        """The time the device needs for this much work at its peaks; None where the profile records no peaks."""
        peaks = self.peaks or {}
        flops_rate, bytes_rate = peaks.get("peak_flops_per_s"), peaks.get("peak_hbm_bytes_per_s")
        if not flops_rate or not bytes_rate:
            return None
        return 1e3 * max(flops / flops_rate, hbm_bytes / bytes_rate)

    def line_of(self, graph: Graph, site: Site) -> tuple[str, str]:
        """The user's line ("file:line") and function an instruction's Python stack names; ("", "") where none."""
        source = source_of_stack(graph.module.stack(site.instruction))
        if source is None or source.user is None:
            return "", ""
        return source.user.short, source.user.function


def calls_per_step_of(program: Program) -> list[tuple[str, float]]:
    """Each program's executions per step (its most-run op's runs over the steps), most first."""
    steps = float(program.step.get("steps") or 0)
    if steps <= 0:
        return []
    runs: dict[str, int] = {}
    for (module, _), count in program.runs.items():
        if module:  # ops no program names (a trace's bare kernels) are no call of one
            runs[module] = max(runs.get(module, 0), count)
    return sorted(((m, n / steps) for m, n in runs.items()), key=lambda kv: -kv[1])


def jitted_function(module_name: str) -> str:
    """The jitted function an HLO module compiles, as the user named it (jit_decode -> the jitted decode)."""
    name = re.sub(r"^p?jit_|\(\d+\)$", "", module_name)
    return f"the jitted {name}" if name else "the jitted step"
