"""Where each step's time goes: device compute, collectives, compile, host syncs, dispatch, host work.

The categories are computed as unions of intervals inside each step window, in this
order of precedence, so they never double count and always add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.profile.space import Session
from xdiag.timeline import (
    CALLBACK_EVENT,
    COMPILE_EVENT,
    DISPATCH_EVENT,
    EXECUTE_EVENT,
    SYNC_EVENT,
    covered,
    host_events,
    op_table,
    step_set,
)

PS_PER_MS = 1e9

CATEGORIES = ("compute", "collective", "compile", "host_sync", "dispatch", "host_other")
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


def _count_in(starts: np.ndarray, lo: int, hi: int) -> int:
    return int(np.count_nonzero((starts >= lo) & (starts < hi)))


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


def step_rows(session: Session) -> list[StepRow]:
    """One row per step, cached on the session."""
    if "step_rows" in session.cache:
        return session.cache["step_rows"]
    ops = op_table(session)
    steps = step_set(session).steps
    events_by_host = {e.host: e for e in host_events(session)}
    rows: list[StepRow] = []
    for host in sorted({s.host for s in steps}):
        host_steps = [s for s in steps if s.host == host]
        win_s = np.array([s.start_ps for s in host_steps], dtype=np.int64)
        win_e = np.array([s.end_ps for s in host_steps], dtype=np.int64)
        on_host = np.fromiter((d.startswith(host + " ") for d in ops.device), dtype=bool, count=len(ops))
        host_ops = ops.take(on_host) if len(ops) else ops
        devices = sorted(set(host_ops.device)) or [""]
        is_collective = host_ops.category == "collective"
        is_callback_op = host_ops.category == "host_callback"
        not_compute = is_collective | is_callback_op
        # Per device, then averaged: a 4-device host that is busy on one device is 25% busy.
        compute = np.zeros(len(host_steps))
        collective_only = np.zeros(len(host_steps))
        for device in devices:
            on_device = host_ops.device == device
            device_ops = on_device & ~is_callback_op
            all_ops = covered(host_ops.start_ps[device_ops], host_ops.end_ps[device_ops], win_s, win_e)
            compute_ops = covered(
                host_ops.start_ps[on_device & ~not_compute], host_ops.end_ps[on_device & ~not_compute], win_s, win_e
            )
            compute += compute_ops
            collective_only += all_ops - compute_ops
        compute /= len(devices)
        collective_only /= len(devices)
        # Host callbacks run as XLA ops but are Python on the host: they count as host_sync, not compute.
        any_op_s, any_op_e = host_ops.start_ps[~is_callback_op], host_ops.end_ps[~is_callback_op]
        callback_s, callback_e = host_ops.start_ps[is_callback_op], host_ops.end_ps[is_callback_op]

        events = events_by_host.get(host)
        if events is not None:
            is_compile = events.matches(COMPILE_EVENT)
            is_sync = events.matches(SYNC_EVENT)
            is_dispatch = events.matches(DISPATCH_EVENT)
            is_callback = events.matches(CALLBACK_EVENT)
            # One launch shows as several nested execute events (C API, PjRt, stream executor): count the outermost.
            is_execute = events.matches(EXECUTE_EVENT)
            is_execute = _outermost(is_execute if is_execute.any() else is_dispatch, events.line, events.start_ps, events.end_ps)
            is_compile_outer = _outermost(is_compile, events.line, events.start_ps, events.end_ps)
            sync_count = _outermost(is_sync, events.line, events.start_ps, events.end_ps)
            callback_count = _outermost(is_callback, events.line, events.start_ps, events.end_ps)
        layers = [(any_op_s, any_op_e)]
        explained_prev = covered(any_op_s, any_op_e, win_s, win_e)
        extra: dict[str, np.ndarray] = {}
        for category, mask in (
            ("compile", is_compile if events is not None else None),
            ("host_sync", (is_sync | is_callback) if events is not None else None),
            ("dispatch", is_dispatch if events is not None else None),
        ):
            if mask is None and not (category == "host_sync" and len(callback_s)):
                extra[category] = np.zeros(len(host_steps))
                continue
            if mask is not None:
                layers.append((events.start_ps[mask], events.end_ps[mask]))
            if category == "host_sync":
                layers.append((callback_s, callback_e))
            union = covered(np.concatenate([l[0] for l in layers]), np.concatenate([l[1] for l in layers]), win_s, win_e)
            extra[category] = union - explained_prev
            explained_prev = union
        for i, step in enumerate(host_steps):
            step_ps = max(step.duration_ps, 1)
            explained = float(explained_prev[i])
            ms = {
                "compute": compute[i] / PS_PER_MS,
                "collective": collective_only[i] / PS_PER_MS,
                "compile": extra["compile"][i] / PS_PER_MS,
                "host_sync": extra["host_sync"][i] / PS_PER_MS,
                "dispatch": extra["dispatch"][i] / PS_PER_MS,
                # Device idle time on a multi-device host is not host work: it stays out of host_other.
                "host_other": max(step_ps - explained, 0) / PS_PER_MS,
            }
            lo, hi = step.start_ps, step.end_ps
            rows.append(
                StepRow(
                    host=host,
                    number=step.number,
                    step_ms=step_ps / PS_PER_MS,
                    ms=ms,
                    ops=_count_in(host_ops.start_ps, lo, hi),
                    dispatches=_count_in(events.start_ps[is_execute], lo, hi) if events is not None else 0,
                    compiles=_count_in(events.start_ps[is_compile_outer], lo, hi) if events is not None else 0,
                    syncs=_count_in(events.start_ps[sync_count], lo, hi) if events is not None else 0,
                    callbacks=max(
                        _count_in(events.start_ps[callback_count], lo, hi) if events is not None else 0,
                        _count_in(callback_s, lo, hi),
                    ),
                )
            )
    session.cache["step_rows"] = rows
    return rows


def summarize_steps(rows: list[StepRow]) -> dict:
    """Averages over steps: the numbers the investigator and report use."""
    if not rows:
        return {"steps": 0}
    step_ms = np.array([r.step_ms for r in rows])
    total = float(step_ms.sum()) or 1.0
    shares = {f"{c}_percent": round(100 * sum(r.ms[c] for r in rows) / total, 2) for c in CATEGORIES}
    idle = 100 - shares["compute_percent"] - shares["collective_percent"]
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
