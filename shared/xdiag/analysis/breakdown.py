"""Where each step's time goes: device compute, collectives, compile, host syncs, dispatch, host work.

The categories are computed as unions of intervals inside each step window, in this
order of precedence, so they never double count and always add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.device_time import DeviceRow, partition_device
from xdiag.analysis.host_signals import HOST_LAYERS, LAYER_CATEGORY, HostSignals
from xdiag.analysis.host_threads import HostThreads, host_threads
from xdiag.analysis.intervals import PS_PER_MS, covered_by_merged, merge_intervals, union_with
from xdiag.analysis.op_table import OpTable, callback_call_ops, op_table
from xdiag.analysis.steps import step_set
from xdiag.profile.space import Session

CATEGORIES = ("compute", "collective", "transfer", "compile", "warm_up", "host_sync", "dispatch", "host_other")
"""Step-time categories, in precedence order; `warm_up` is the first call of a program where it takes far longer
than its later calls (allocation, autotuning, loading), or a GPU runtime call far longer than its median (loading
a kernel's module on first use, creating the context); `host_other` is what no event explains: Python/input
work outside the jitted computation (or nothing at all)."""


@dataclass(slots=True)
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
    device: str | None = None  # the device whose own step this is; None: the host's step over its devices
    host_transfer_ms: float = 0.0  # of ms["transfer"]: host<->device copies seen only on the host's lines
    after_read_ms: float = 0.0  # of ms["host_other"]: host work that begins where a read of device data ends
    call_copy_ms: float = 0.0  # of ms["dispatch"]: the copies of a jitted call's own arguments, inside its dispatch


def _counts(starts: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """For each window [s, e): how many of `starts` fall inside it."""
    in_order = len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all())  # the op table's starts are, in time order
    ordered = starts if in_order else np.sort(starts)
    return np.searchsorted(ordered, win_e, side="left") - np.searchsorted(ordered, win_s, side="left")


def _gaps_after(merged: tuple[np.ndarray, np.ndarray], marks: np.ndarray, win_s: np.ndarray,
                win_e: np.ndarray) -> np.ndarray:
    """Per window: the time in gaps of `merged` (nothing explained) that begin exactly where one of `marks` ends
    an explained interval, up to the next explained interval or the window's end."""
    starts, ends = merged
    out = np.zeros(len(win_s), dtype=np.int64)
    if not len(starts) or not len(marks):
        return out
    after = np.isin(ends, marks)
    gap_s, gap_e = ends[after], np.append(starts[1:], np.iinfo(np.int64).max)[after]
    for i, (lo, hi) in enumerate(zip(win_s, win_e)):
        inside = (gap_s >= lo) & (gap_s < hi)
        out[i] = int(np.minimum(gap_e[inside], hi).sum() - gap_s[inside].sum())
    return out


def _timeline_rows(
    host: str, device: str | None, steps: list, ops: OpTable, devices: list[str], events: HostThreads | None,
    call_begins: np.ndarray,
) -> tuple[list[StepRow], list[DeviceRow]]:
    """Rows for one timeline: a host's steps (every active device of it partitioned in them and averaged)
    or one device's own steps. call_begins: per op code, whether the op begins a host callback call."""
    win_s = np.array([s.start_ps for s in steps], dtype=np.int64)
    win_e = np.array([s.end_ps for s in steps], dtype=np.int64)
    is_callback_op = ops.in_categories(["host_callback"])
    compute = np.zeros(len(steps))
    collective = np.zeros(len(steps))
    transfer = np.zeros(len(steps))
    device_rows = []
    span_ms = float((win_e - win_s).sum()) / PS_PER_MS
    for name in devices:
        part = partition_device(ops.take(ops.on_device(name)), win_s, win_e)
        compute += part.compute
        collective += part.collective
        transfer += part.transfer
        busy = {"compute": part.compute.sum(), "collective": part.collective.sum(), "transfer": part.transfer.sum()}
        ms = {k: float(v) / PS_PER_MS for k, v in busy.items()}
        ms["idle"] = max(span_ms - sum(ms.values()), 0.0)
        device_rows.append(DeviceRow(name, len(steps), span_ms / max(len(steps), 1), ms))
    if devices:
        compute, collective, transfer = (x / len(devices) for x in (compute, collective, transfer))

    calls = call_begins[ops.op] if len(ops) else np.zeros(0, dtype=bool)
    signals = HostSignals.of(events, ops.start_ps[is_callback_op], ops.end_ps[is_callback_op], ops.start_ps[calls])
    # Each layer gets only the time that no earlier layer (ops first) already explains.
    merged = merge_intervals(ops.start_ps[~is_callback_op], ops.end_ps[~is_callback_op])
    explained = covered_by_merged(merged, win_s, win_e)
    extra = {LAYER_CATEGORY.get(layer, layer): np.zeros(len(steps), dtype=np.int64) for layer in HOST_LAYERS}
    for layer in HOST_LAYERS:
        merged = union_with(merged, *signals.layers[layer])
        union = covered_by_merged(merged, win_s, win_e)
        extra[LAYER_CATEGORY.get(layer, layer)] += union - explained
        explained = union
    after_read = _gaps_after(merged, signals.read_ends, win_s, win_e)
    # The dispatch layer holds a call's own argument copies: what of its time they cover, no more than it booked
    call_copies = np.minimum(covered_by_merged(merge_intervals(*signals.call_copies), win_s, win_e),
                             extra["dispatch"])
    counts = {name: _counts(starts, win_s, win_e) for name, starts in signals.counted.items()}
    op_counts = _counts(ops.start_ps, win_s, win_e)
    rows = []
    for i, step in enumerate(steps):
        step_ps = max(step.duration_ps, 1)
        ms = {
            "compute": compute[i] / PS_PER_MS,
            "collective": collective[i] / PS_PER_MS,
            "transfer": (transfer[i] + extra["transfer"][i]) / PS_PER_MS,
            **{category: extra[category][i] / PS_PER_MS for category in extra if category != "transfer"},
            # Device idle time on a multi-device host is not host work: it stays out of host_other.
            "host_other": max(step_ps - float(explained[i]), 0) / PS_PER_MS,
        }
        rows.append(
            StepRow(
                host=host, number=step.number, step_ms=step_ps / PS_PER_MS, ms=ms, ops=int(op_counts[i]),
                dispatches=int(counts["dispatches"][i]), compiles=int(counts["compiles"][i]),
                syncs=int(counts["syncs"][i]), callbacks=int(counts["callbacks"][i]), device=device,
                host_transfer_ms=extra["transfer"][i] / PS_PER_MS, after_read_ms=after_read[i] / PS_PER_MS,
                call_copy_ms=call_copies[i] / PS_PER_MS,
            )
        )
    return rows, device_rows


def _build(session: Session) -> tuple[list[StepRow], list[DeviceRow]]:
    ops = op_table(session)
    call_begins = callback_call_ops(session)
    found = step_set(session)
    events_by_host = {e.host: e for e in host_threads(session)}
    all_devices = set(ops.devices())
    active = sorted(all_devices - set(found.transfer_only))
    timelines: dict[tuple[str, str | None], list] = {}
    for step in found.steps:
        timelines.setdefault((step.host, step.device), []).append(step)
    rows: list[StepRow] = []
    device_rows: list[DeviceRow] = []
    for (host, device), steps in sorted(timelines.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if device is None:
            on_host = np.array([d.startswith(host + " ") for d in ops.device_labels], dtype=bool)  # per device code
            mask = on_host[ops.device_code]
            devices = [d for d in active if d.startswith(host + " ")]
        else:
            mask = ops.on_device(device)
            devices = [device]
        steps = sorted(steps, key=lambda s: s.start_ps)
        timeline_rows, timeline_devices = _timeline_rows(host, device, steps, ops.take(mask), devices, events_by_host.get(host),
                                                          call_begins)
        rows += timeline_rows
        device_rows += timeline_devices
    return rows, device_rows


def step_rows(session: Session) -> list[StepRow]:
    """One row per step and timeline (a host's annotated steps, or one device's own steps), cached on the session."""
    if "step_rows" not in session.cache:
        session.cache["step_rows"], session.cache["device_rows"] = _build(session)
    return session.cache["step_rows"]


def device_rows(session: Session) -> list[DeviceRow]:
    """One row per active device: its own time in its own steps split into compute/collective/transfer/idle."""
    step_rows(session)
    return session.cache["device_rows"]


def summarize_steps(rows: list[StepRow]) -> dict:
    """Averages over steps: the numbers the investigator and report use."""
    if not rows:
        return {"steps": 0}
    step_ms = np.array([r.step_ms for r in rows])
    total = float(step_ms.sum()) or 1.0
    timelines = {(r.host, r.device) for r in rows}
    shares = {f"{c}_percent": round(100 * sum(r.ms[c] for r in rows) / total, 2) for c in CATEGORIES}
    host_transfer = round(100 * sum(r.host_transfer_ms for r in rows) / total, 2)
    after_read = round(100 * sum(r.after_read_ms for r in rows) / total, 2)
    call_copies = round(100 * sum(r.call_copy_ms for r in rows) / total, 2)
    # Copies the device's op lines do not show (the host re-tiles and DMAs them) leave the device's cores idle.
    idle = 100 - shares["compute_percent"] - shares["collective_percent"] - (shares["transfer_percent"] - host_transfer)
    return {
        # Steps per timeline (a host, or a device with steps of its own): the same step seen on 4 devices is 1 step.
        "steps": int(round(len(rows) / len(timelines))),
        "timelines": len(timelines),
        "step_time_ms_mean": round(float(step_ms.mean()), 4),
        "step_time_ms_median": round(float(np.median(step_ms)), 4),
        "step_time_ms_min": round(float(step_ms.min()), 4),
        "step_time_ms_max": round(float(step_ms.max()), 4),
        "step_time_cv_percent": round(float(100 * step_ms.std() / step_ms.mean()), 2) if step_ms.mean() else 0.0,
        **shares,
        "host_transfer_percent": host_transfer,
        "host_after_read_percent": after_read,
        "dispatch_copy_percent": call_copies,
        "device_idle_percent": round(max(idle, 0.0), 2),
        "ops_per_step_mean": round(float(np.mean([r.ops for r in rows])), 2),
        "dispatches_per_step_mean": round(float(np.mean([r.dispatches for r in rows])), 2),
        "compiles_per_step_mean": round(float(np.mean([r.compiles for r in rows])), 3),
        "steps_with_compiles": int(sum(1 for r in rows if r.compiles)),
        "syncs_per_step_mean": round(float(np.mean([r.syncs for r in rows])), 2),
        "callbacks_per_step_mean": round(float(np.mean([r.callbacks for r in rows])), 2),
    }


SPREAD_EXPLAINED_CV_PERCENT = 50.0
"""A step-time spread (CV) this wide is explained where its steps say why; a narrower one is ordinary jitter."""
RUN_AHEAD_SHARE = 0.5
"""The share of a step a fast step spends dispatching, and a slow one blocked waiting for the device (or running
the device's work), for the spread to be the host running ahead of the device."""


def spread_from_dispatch(rows: list[StepRow]) -> dict:
    """Where the steps' spread is asynchronous dispatch, what the steps say: JAX returns from a jitted call once its
    work is queued, so a step that does not wait on the device ends as soon as it has dispatched, and the step that
    waits (a float(loss), a block_until_ready, a full queue) waits for everything the steps before it queued. Then
    no single step's time is its work: the mean over the steps is. step_time_spread_is "asynchronous dispatch",
    run_ahead_steps (ended once dispatched: their mean ms and dispatch share), blocking_steps (their mean ms and the
    share waiting); {} where the spread is narrow or the steps do not show this pattern."""
    if len(rows) < 3:
        return {}
    step_ms = np.array([r.step_ms for r in rows])
    mean = float(step_ms.mean())
    if not mean or 100 * float(step_ms.std()) / mean < SPREAD_EXPLAINED_CV_PERCENT:
        return {}
    median = float(np.median(step_ms))
    fast = [r for r in rows if r.step_ms <= median]
    slow = [r for r in rows if r.step_ms > median]
    if not fast or not slow:
        return {}

    def share(group: list[StepRow], categories: tuple[str, ...]) -> float:
        total = sum(r.step_ms for r in group)
        return sum(r.ms.get(c, 0.0) for r in group for c in categories) / total if total else 0.0

    dispatching = share(fast, ("dispatch",))
    waiting = share(slow, ("host_sync", "compute", "collective", "transfer"))
    if dispatching < RUN_AHEAD_SHARE or waiting < RUN_AHEAD_SHARE:
        return {}
    fast_ms = float(np.mean([r.step_ms for r in fast]))
    slow_ms = float(np.mean([r.step_ms for r in slow]))
    return {
        "step_time_spread_is": "asynchronous dispatch",
        "step_time_spread_because": (
            f"the host runs ahead of the device: {len(fast)} of {len(rows)} steps end once their work is dispatched "
            f"({fast_ms:.3g} ms each, {100 * dispatching:.0f}% dispatching), and the {len(slow)} that wait on the "
            f"device ({slow_ms:.3g} ms each, {100 * waiting:.0f}% waiting or running device work) end when it has "
            f"finished what the steps before them queued: no one step's time is its work, the mean "
            f"({mean:.3g} ms) is"),
        "run_ahead_steps": len(fast),
        "run_ahead_step_ms_mean": round(fast_ms, 4),
        "blocking_steps": len(slow),
        "blocking_step_ms_mean": round(slow_ms, 4),
    }

