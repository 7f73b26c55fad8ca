"""Where each step's time goes: device compute, collectives, compile, host syncs, dispatch, host work.

The categories are computed as unions of intervals inside each step window, in this
order of precedence, so they never double count and always add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.timeline import (
    CALLBACK_EVENT,
    COMPILE_EVENT,
    DISPATCH_EVENT,
    EXECUTE_EVENT,
    SYNC_EVENT,
    EventSelection,
    HostEvents,
    covered,
    host_events,
    op_table,
    step_set,
)
from xdiag.profile.space import Session

PS_PER_MS = 1e9
TRANSFER_CATEGORIES = ("async_copy", "memcpy")
"""Op categories that only move data between memory spaces (host offload, H2D/D2H copies)."""

CATEGORIES = ("compute", "collective", "transfer", "compile", "host_sync", "dispatch", "host_other")
"""Step-time categories, in precedence order; `host_other` is what no event explains:
Python/input work outside the jitted computation (or nothing at all)."""


@dataclass
class StepRow:
    host: str
    number: int
    step_ms: float
    ms: dict[str, float]  # category -> ms inside this step
    ops: int  # XLA op executions that started inside the step
    dispatches: int  # jitted-function dispatches inside the step
    compiles: int  # compile events inside the step
    syncs: int  # blocking host<-device transfers inside the step
    callbacks: int


def _counts(starts: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """For each window [s, e): how many of `starts` fall inside it."""
    ordered = np.sort(starts)
    return np.searchsorted(ordered, win_e, side="left") - np.searchsorted(ordered, win_s, side="left")


def _outermost(mask: np.ndarray, line: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Of the events in `mask`, those not nested inside another masked event of the same line.

    The Python tracer nests `device_get` in `__float__` in `_value`…: one sync, not three.
    """
    keep = np.zeros(len(mask), dtype=bool)
    for name in np.unique(line[mask]):
        idx = np.nonzero(mask & (line == name))[0]
        idx = idx[np.lexsort((-ends[idx], starts[idx]))]
        running_end = np.maximum.accumulate(ends[idx])
        outer = np.ones(len(idx), dtype=bool)
        outer[1:] = starts[idx][1:] >= running_end[:-1]
        keep[idx[outer]] = True
    return keep


@dataclass
class _HostSignals:
    """A host's non-op events sorted into the breakdown's layers, and the outermost ones to count."""

    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # compile / host_sync / dispatch -> (starts, ends)
    counted: dict[str, np.ndarray]  # dispatches / compiles / syncs / callbacks -> starts of counted events

    @classmethod
    def of(cls, events: HostEvents | None, callback_s: np.ndarray, callback_e: np.ndarray) -> _HostSignals:
        empty = np.empty(0, np.int64)
        if events is None:
            return cls(
                layers={"compile": (empty, empty), "host_sync": (callback_s, callback_e), "dispatch": (empty, empty)},
                counted={"dispatches": empty, "compiles": empty, "syncs": empty, "callbacks": callback_s},
            )
        compile_, sync, dispatch, callback, execute = (
            events.select(p) for p in (COMPILE_EVENT, SYNC_EVENT, DISPATCH_EVENT, CALLBACK_EVENT, EXECUTE_EVENT)
        )

        def outer(selected: EventSelection) -> np.ndarray:
            everything = np.ones(len(selected.start_ps), dtype=bool)
            return selected.start_ps[_outermost(everything, selected.line, selected.start_ps, selected.end_ps)]

        python_callbacks = outer(callback)
        return cls(
            layers={
                "compile": (compile_.start_ps, compile_.end_ps),
                # Host callbacks run as XLA ops but are Python on the host: host_sync, not compute.
                "host_sync": (
                    np.concatenate([sync.start_ps, callback.start_ps, callback_s]),
                    np.concatenate([sync.end_ps, callback.end_ps, callback_e]),
                ),
                "dispatch": (dispatch.start_ps, dispatch.end_ps),
            },
            counted={
                # One launch shows as several nested execute events (C API, PjRt, stream executor): count the outermost.
                "dispatches": outer(execute if len(execute.start_ps) else dispatch),
                "compiles": outer(compile_),
                "syncs": outer(sync),
                "callbacks": callback_s if len(callback_s) >= len(python_callbacks) else python_callbacks,
            },
        )


def _host_rows(host: str, host_steps: list, ops, events: HostEvents | None) -> list[StepRow]:
    win_s = np.array([s.start_ps for s in host_steps], dtype=np.int64)
    win_e = np.array([s.end_ps for s in host_steps], dtype=np.int64)
    devices = sorted(set(ops.device)) or [""]
    is_collective = ops.category == "collective"
    is_transfer = np.isin(ops.category, TRANSFER_CATEGORIES)
    is_callback_op = ops.category == "host_callback"
    # Per device, then averaged: a 4-device host that is busy on one device is 25% busy. The device's busy
    # time is split by precedence: computing, else communicating, else only moving data between memories.
    compute = np.zeros(len(host_steps))
    collective_only = np.zeros(len(host_steps))
    transfer_only = np.zeros(len(host_steps))
    for device in devices:
        on_device = ops.device == device

        def busy(mask: np.ndarray) -> np.ndarray:
            return covered(ops.start_ps[on_device & mask], ops.end_ps[on_device & mask], win_s, win_e)

        computing = busy(~(is_collective | is_transfer | is_callback_op))
        computing_or_collective = busy(~(is_transfer | is_callback_op))
        compute += computing
        collective_only += computing_or_collective - computing
        transfer_only += busy(~is_callback_op) - computing_or_collective
    compute /= len(devices)
    collective_only /= len(devices)
    transfer_only /= len(devices)

    signals = _HostSignals.of(events, ops.start_ps[is_callback_op], ops.end_ps[is_callback_op])
    # Each layer gets only the time that no earlier layer (ops first) already explains.
    layer_s, layer_e = [ops.start_ps[~is_callback_op]], [ops.end_ps[~is_callback_op]]
    explained = covered(layer_s[0], layer_e[0], win_s, win_e)
    extra: dict[str, np.ndarray] = {}
    for category in ("compile", "host_sync", "dispatch"):
        starts, ends = signals.layers[category]
        layer_s.append(starts)
        layer_e.append(ends)
        union = covered(np.concatenate(layer_s), np.concatenate(layer_e), win_s, win_e)
        extra[category] = union - explained
        explained = union
    counts = {name: _counts(starts, win_s, win_e) for name, starts in signals.counted.items()}
    op_counts = _counts(ops.start_ps, win_s, win_e)
    rows = []
    for i, step in enumerate(host_steps):
        step_ps = max(step.duration_ps, 1)
        ms = {
            "compute": compute[i] / PS_PER_MS,
            "collective": collective_only[i] / PS_PER_MS,
            "transfer": transfer_only[i] / PS_PER_MS,
            "compile": extra["compile"][i] / PS_PER_MS,
            "host_sync": extra["host_sync"][i] / PS_PER_MS,
            "dispatch": extra["dispatch"][i] / PS_PER_MS,
            # Device idle time on a multi-device host is not host work: it stays out of host_other.
            "host_other": max(step_ps - float(explained[i]), 0) / PS_PER_MS,
        }
        rows.append(
            StepRow(
                host=host, number=step.number, step_ms=step_ps / PS_PER_MS, ms=ms, ops=int(op_counts[i]),
                dispatches=int(counts["dispatches"][i]), compiles=int(counts["compiles"][i]),
                syncs=int(counts["syncs"][i]), callbacks=int(counts["callbacks"][i]),
            )
        )
    return rows


def step_rows(session: Session) -> list[StepRow]:
    """One row per step, cached on the session."""
    if "step_rows" in session.cache:
        return session.cache["step_rows"]
    ops = op_table(session)
    steps = step_set(session).steps
    events_by_host = {e.host: e for e in host_events(session)}
    rows: list[StepRow] = []
    for host in sorted({s.host for s in steps}):
        on_host = np.fromiter((d.startswith(host + " ") for d in ops.device), dtype=bool, count=len(ops))
        rows += _host_rows(host, [s for s in steps if s.host == host], ops.take(on_host), events_by_host.get(host))
    session.cache["step_rows"] = rows
    return rows


def summarize_steps(rows: list[StepRow]) -> dict:
    """Averages over steps: the numbers the investigator and report use."""
    if not rows:
        return {"steps": 0}
    step_ms = np.array([r.step_ms for r in rows])
    total = float(step_ms.sum()) or 1.0
    shares = {f"{c}_percent": round(100 * sum(r.ms[c] for r in rows) / total, 2) for c in CATEGORIES}
    idle = 100 - shares["compute_percent"] - shares["collective_percent"] - shares["transfer_percent"]
    return {
        "steps": len(rows),
        "step_time_ms_mean": round(float(step_ms.mean()), 4),
        "step_time_ms_median": round(float(np.median(step_ms)), 4),
        "step_time_ms_min": round(float(step_ms.min()), 4),
        "step_time_ms_max": round(float(step_ms.max()), 4),
        "step_time_cv_percent": round(float(100 * step_ms.std() / step_ms.mean()), 2) if step_ms.mean() else 0.0,
        **shares,
        "device_idle_percent": round(max(idle, 0.0), 2),
        "ops_per_step_mean": round(float(np.mean([r.ops for r in rows])), 2),
        "dispatches_per_step_mean": round(float(np.mean([r.dispatches for r in rows])), 2),
        "compiles_per_step_mean": round(float(np.mean([r.compiles for r in rows])), 3),
        "steps_with_compiles": int(sum(1 for r in rows if r.compiles)),
        "syncs_per_step_mean": round(float(np.mean([r.syncs for r in rows])), 2),
        "callbacks_per_step_mean": round(float(np.mean([r.callbacks for r in rows])), 2),
    }
