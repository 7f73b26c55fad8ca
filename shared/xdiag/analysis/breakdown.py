"""Where each step's time goes: device compute, collectives, compile, host syncs, dispatch, host work.

The categories are computed as unions of intervals inside each step window, in this
order of precedence, so they never double count and always add up to the step time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from xdiag.analysis.categories import TRANSFER_OP_CATEGORIES
from xdiag.analysis.host_threads import EventSelection, HostThreads, host_threads
from xdiag.analysis.host_vocabulary import (
    CALLBACK_EVENT,
    COMPILE_EVENT,
    DEVICE_TO_HOST_COPY_EVENT,
    HOST_TRANSFER_EVENT,
    JITTED_CALL_EVENT,
)
from xdiag.analysis.intervals import covered, covered_by_merged, merge_intervals, union_with
from xdiag.analysis.op_table import OpTable, callback_call_ops, module_spans, op_table
from xdiag.analysis.steps import step_set
from xdiag.profile.space import Session

PS_PER_MS = 1e9
TRANSFER_CATEGORIES = TRANSFER_OP_CATEGORIES

CATEGORIES = ("compute", "collective", "transfer", "compile", "warm_up", "host_sync", "dispatch", "host_other")
"""Step-time categories, in precedence order; `warm_up` is the first call of a program where it takes far longer
than its later calls (allocation, autotuning, loading), or a GPU runtime call far longer than its median (loading
a kernel's module on first use, creating the context); `host_other` is what no event explains: Python/input
work outside the jitted computation (or nothing at all)."""
HOST_LAYERS = ("callback", "transfer", "compile", "warm_up", "host_sync", "dispatch")
"""The layers host events explain, in precedence order, each booked in the category of its name but `callback`
(the device's host-callback ops, and the copies that serve them) in host_sync; `transfer` (host<->device copies
seen on the host's lines) comes before host_sync: np.asarray's wait for its read is the copy."""
LAYER_CATEGORY = {"callback": "host_sync"}

WARM_UP_MIN_RATIO = 3.0
"""A first call counts as warm-up when it takes at least this many times its function's median later call."""
WARM_UP_MIN_EXCESS_PS = 1_000_000_000  # and at least 1 ms longer: a few µs of noise is no warm-up


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
    device: str | None = None  # the device whose own step this is; None: the host's step over its devices
    host_transfer_ms: float = 0.0  # of ms["transfer"]: host<->device copies seen only on the host's lines
    after_read_ms: float = 0.0  # of ms["host_other"]: host work that begins where a read of device data ends


def _counts(starts: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> np.ndarray:
    """For each window [s, e): how many of `starts` fall inside it."""
    ordered = np.sort(starts)
    return np.searchsorted(ordered, win_e, side="left") - np.searchsorted(ordered, win_s, side="left")


def _outermost(mask: np.ndarray, line: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Of the events in `mask`, those not nested inside another masked event of the same thread.

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
class WarmUpCall:
    """The first call of a jitted function that takes far longer than its later calls; or a GPU runtime call far
    longer than its call's median (first_call False)."""

    host: str
    function: str
    start_ps: int
    end_ps: int
    later_call_ms_median: float
    first_call: bool = True  # False: a GPU runtime call far longer than its call's median (_slow_runtime_calls)

    @property
    def ms(self) -> float:
        return (self.end_ps - self.start_ps) / PS_PER_MS


def warm_up_calls(events: HostThreads) -> list[WarmUpCall]:
    """The first call of each function that takes far longer than its later calls (WARM_UP_MIN_RATIO): the
    warm-up a benchmark or training loop pays once (buffer allocation, autotuning, loading the program)."""
    calls = events.select(JITTED_CALL_EVENT)
    keep = _outermost(np.ones(len(calls.start_ps), dtype=bool), calls.line, calls.start_ps, calls.end_ps)
    starts, ends, names = calls.start_ps[keep], calls.end_ps[keep], events.names(JITTED_CALL_EVENT)[keep]
    out = []
    for name in np.unique(names):
        idx = np.flatnonzero(names == name)
        if len(idx) < 3:  # the first call and at least two later ones to compare it with
            continue
        idx = idx[np.argsort(starts[idx], kind="stable")]
        durations = ends[idx] - starts[idx]
        later = float(np.median(durations[1:]))
        if durations[0] >= WARM_UP_MIN_RATIO * later and durations[0] - later >= WARM_UP_MIN_EXCESS_PS:
            out.append(WarmUpCall(events.host, str(name), int(starts[idx[0]]), int(ends[idx[0]]), later / PS_PER_MS))
    if events.vocabulary.runtime_call is not None:
        out += _slow_runtime_calls(events)
    return out


_COPY_CALL = re.compile(r"Memcpy")
_NO_NAME = re.compile(r"(?!)")  # matches no event name: select by a stat alone


def _slow_runtime_calls(events: HostThreads) -> list[WarmUpCall]:
    """GPU runtime calls (HostVocabulary.runtime_call: not its syncs nor copies) that take far longer than their
    call's median, by the first-call rule's ratio and excess (and, as there, two other calls to compare with): the
    first cudaFree that sets up the context, a stream or library handle created once, the allocator growing; and a
    launch that loads its kernel's module: only the first launch of its kernel (first_launch_stat), as a launch
    that is slow at every step (a full launch queue, a lock) is not paid once. Nor is another call that is slow in
    most of the trace's annotated steps (_slow_in_most_steps: the allocator freeing and growing again each step)."""
    words = events.vocabulary
    calls = events.select(words.runtime_call)
    starts, ends, names = calls.start_ps, calls.end_ps, events.names(words.runtime_call)
    firsts = events.select(_NO_NAME, words.first_launch_stat) if words.first_launch_stat else None
    first_starts = set(zip(firsts.line.tolist(), firsts.start_ps.tolist())) if firsts is not None else set()
    is_first = np.array([key in first_starts for key in zip(calls.line.tolist(), starts.tolist())], dtype=bool)
    steps = _annotated_steps(events)
    out = []
    for name in np.unique(names):
        if words.sync.search(str(name)) or _COPY_CALL.search(str(name)):
            continue
        idx = np.flatnonzero(names == name)
        if len(idx) < 3:  # the slow call and at least two others to compare it with
            continue
        durations = ends[idx] - starts[idx]
        median = float(np.median(durations))
        slow = (durations >= WARM_UP_MIN_RATIO * median) & (durations - median >= WARM_UP_MIN_EXCESS_PS)
        if words.dispatch.search(str(name)):
            slow &= is_first[idx]
        elif _slow_in_most_steps(starts[idx[slow]], steps):
            continue
        out += [WarmUpCall(events.host, str(name), int(starts[i]), int(ends[i]), median / PS_PER_MS, first_call=False)
                for i in idx[slow]]
    return out


def _annotated_steps(events: HostThreads) -> list[tuple[int, int]]:
    """(start, end) of each step the trace's own step annotations mark (ProfilerStep#N), one per step number."""
    spans: dict[int, tuple[int, int]] = {}
    for number, start, end in events.step_annotations()[1]:
        found = spans.get(number)
        spans[number] = (start, end) if found is None else (min(found[0], start), max(found[1], end))
    return sorted(spans.values())


def _slow_in_most_steps(slow_starts: np.ndarray, steps: list[tuple[int, int]]) -> bool:
    """Whether a call's slow runs start in more than half of the annotated steps, and in two at least: a cost every
    step pays (per-step overhead), not a one-time one. Without two steps to compare, nothing recurs."""
    if len(steps) < 2 or not len(slow_starts):
        return False
    ordered = np.sort(slow_starts)
    hit = sum(1 for start, end in steps
              if np.searchsorted(ordered, end, side="left") > np.searchsorted(ordered, start, side="left"))
    return hit >= 2 and hit > len(steps) / 2


def largest_sync_event(events: HostThreads) -> tuple[str, float] | None:
    """(name, total ms) of the blocking wait that takes the most host time, outermost events only."""
    words = events.vocabulary
    waits = events.select(words.sync, words.sync_stat)
    if not len(waits.start_ps):
        return None
    keep = _outermost(np.ones(len(waits.start_ps), dtype=bool), waits.line, waits.start_ps, waits.end_ps)
    names = events.names(words.sync, words.sync_stat)[keep]
    durations = (waits.end_ps - waits.start_ps)[keep].astype(float)
    unique, inverse = np.unique(names, return_inverse=True)
    totals = np.bincount(inverse, weights=durations)
    top = int(np.argmax(totals))
    return str(unique[top]), float(totals[top]) / PS_PER_MS


def _launching_thread(selected: EventSelection) -> np.ndarray:
    """Starts of the outermost launches on the thread that launched most: one SPMD launch shows once on the
    calling thread and again on each device's execute thread, and is one launch."""
    if not len(selected.start_ps):
        return selected.start_ps
    outer = _outermost(np.ones(len(selected.start_ps), dtype=bool), selected.line, selected.start_ps, selected.end_ps)
    lines, counts = np.unique(selected.line[outer], return_counts=True)
    return selected.start_ps[outer & (selected.line == lines[int(np.argmax(counts))])]


@dataclass
class _HostSignals:
    """A host's non-op events sorted into the breakdown's layers, and the outermost ones to count."""

    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # HOST_LAYERS -> (starts, ends)
    counted: dict[str, np.ndarray]  # dispatches / compiles / syncs / callbacks -> starts of counted events
    read_ends: np.ndarray  # ends of the blocking reads that mostly copied data (not waited for the device)

    @classmethod
    def of(cls, events: HostThreads | None, callback_s: np.ndarray, callback_e: np.ndarray,
           callback_calls: np.ndarray) -> _HostSignals:
        """callback_s/_e: the device's callback ops; callback_calls: the starts of those that begin a call."""
        empty = np.empty(0, np.int64)
        if events is None:
            return cls(
                layers={**{layer: (empty, empty) for layer in HOST_LAYERS}, "callback": (callback_s, callback_e)},
                counted={"dispatches": empty, "compiles": empty, "syncs": empty, "callbacks": callback_calls},
                read_ends=empty,
            )
        words = events.vocabulary
        compile_, callback, execute = (events.select(p) for p in (COMPILE_EVENT, CALLBACK_EVENT, words.execute))
        sync = events.select(words.sync, words.sync_stat)

        def outer(selected: EventSelection) -> np.ndarray:
            everything = np.ones(len(selected.start_ps), dtype=bool)
            return selected.start_ps[_outermost(everything, selected.line, selected.start_ps, selected.end_ps)]

        python_callbacks = outer(callback)
        warm_up = warm_up_calls(events)
        dispatch = events.union(words.dispatch)  # only its union is needed: not every event gathered
        transfer = events.select(HOST_TRANSFER_EVENT)
        # A jitted call's own argument transfer (DevicePut inside PjitFunction) is part of its dispatch.
        outside = covered_by_merged(dispatch, transfer.start_ps, transfer.end_ps) < transfer.end_ps - transfer.start_ps
        dma = events.issued_until_done(HOST_TRANSFER_EVENT)
        reads = events.select(DEVICE_TO_HOST_COPY_EVENT)
        read_dma = events.issued_until_done(DEVICE_TO_HOST_COPY_EVENT)
        copies = merge_intervals(np.concatenate([reads.start_ps, read_dma[0]]),
                                 np.concatenate([reads.end_ps, read_dma[1]]))
        return cls(
            layers={
                # Host callbacks run as XLA ops but are Python on the host: host_sync, not compute; the copies that
                # serve a callback are the callback's.
                "callback": (callback_s, callback_e),
                "transfer": (np.concatenate([transfer.start_ps[outside], dma[0]]),
                             np.concatenate([transfer.end_ps[outside], dma[1]])),
                "compile": (compile_.start_ps, compile_.end_ps),
                "warm_up": (np.array([w.start_ps for w in warm_up], dtype=np.int64),
                            np.array([w.end_ps for w in warm_up], dtype=np.int64)),
                "host_sync": (
                    np.concatenate([sync.start_ps, callback.start_ps]),
                    np.concatenate([sync.end_ps, callback.end_ps]),
                ),
                "dispatch": dispatch,
            },
            counted={
                # One launch shows as several nested execute events (C API, PjRt, stream executor), on the Python
                # thread's line and the runtime's line of the same thread (`python3`, `main/<pid>` on a TPU, one
                # thread in the selection): count the outermost.
                "dispatches": (_launching_thread if words.one_launch_on_several_threads else outer)(
                    execute if len(execute.start_ps) else events.select(words.dispatch)),
                "compiles": outer(compile_),
                # One blocking read shows on several threads at once (the Python call, the runtime's transfer and
                # its completion): the union's segments are the reads.
                "syncs": merge_intervals(sync.start_ps, sync.end_ps)[0],
                "callbacks": callback_calls if len(callback_calls) >= len(python_callbacks) else python_callbacks,
            },
            read_ends=_copying_read_ends(sync, copies),
        )


def _copying_read_ends(sync: EventSelection, copies: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Ends of the outermost blocking reads that spent most of their time copying data to the host (np.asarray of a
    large array) rather than waiting for the device to finish (float(loss), block_until_ready): what the host does
    right after such a read is work on the data it brought back."""
    if not len(sync.start_ps):
        return np.empty(0, np.int64)
    keep = _outermost(np.ones(len(sync.start_ps), dtype=bool), sync.line, sync.start_ps, sync.end_ps)
    starts, ends = sync.start_ps[keep], sync.end_ps[keep]
    copying = 2 * covered_by_merged(copies, starts, ends) >= ends - starts
    return np.unique(ends[copying & (ends > starts)])


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


@dataclass
class DevicePartition:
    """One device's own time in its windows, split by what it was doing (ps per window)."""

    compute: np.ndarray
    collective: np.ndarray
    transfer: np.ndarray


def partition_device(ops: OpTable, win_s: np.ndarray, win_e: np.ndarray) -> DevicePartition:
    """Split one device's busy time in each window: computing, else communicating, else only moving data.

    Waiting is not compute: a control-flow op that encloses others (a while loop whose body all-reduces) and
    the tail of an op paired with a later `end:` event are "weak" compute that a collective running at the
    same time outranks; an op's own event still outranks the collective (overlapped communication is hidden).
    """
    is_collective = ops.in_categories(["collective"])
    is_transfer = ops.in_categories(TRANSFER_CATEGORIES)
    is_callback = ops.in_categories(["host_callback"])
    is_container = ops.in_categories(["control_flow"])
    strong = ~(is_collective | is_transfer | is_callback | is_container)
    tail = strong & (ops.end_ps > ops.event_end_ps)
    layers = [
        (ops.start_ps[strong], ops.event_end_ps[strong]),
        (ops.start_ps[is_collective], ops.end_ps[is_collective]),
        (np.concatenate([ops.start_ps[is_container], ops.event_end_ps[tail]]),
         np.concatenate([ops.end_ps[is_container], ops.end_ps[tail]])),
        (ops.start_ps[is_transfer], ops.end_ps[is_transfer]),
    ]
    totals = []
    union = merge_intervals(*layers[0])
    for starts, ends in layers:
        if totals:  # each layer joins the union of the ones before it
            union = union_with(union, starts, ends)
        totals.append(covered_by_merged(union, win_s, win_e))
    strong_ps, with_collective, with_weak, everything = totals
    return DevicePartition(
        compute=strong_ps + (with_weak - with_collective),
        collective=with_collective - strong_ps,
        transfer=everything - with_weak,
    )


@dataclass
class DeviceRow:
    """One device over its own steps: the per-device spread behind the means."""

    device: str
    steps: int
    step_ms: float  # mean
    ms: dict[str, float]  # compute / collective / transfer / idle, summed over its steps


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
    signals = _HostSignals.of(events, ops.start_ps[is_callback_op], ops.end_ps[is_callback_op], ops.start_ps[calls])
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


BUSY_PARTS = ("compute", "collective", "transfer")
"""A device is busy while it computes, communicates or moves data: one definition for every busy figure."""


def device_spread(rows: list[DeviceRow]) -> dict:
    """Each share of the active devices' own step time, with the least and most busy device named. The means
    weigh each device by its step time, as the step breakdown does, so the busy share is one number everywhere."""
    if not rows:
        return {}
    def share(row: DeviceRow, key: str) -> float:
        return 100 * row.ms[key] / max(row.step_ms * row.steps, 1e-12)
    busy = [sum(share(r, k) for k in BUSY_PARTS) for r in rows]
    least, most = int(np.argmin(busy)), int(np.argmax(busy))
    total_ms = sum(r.step_ms * r.steps for r in rows) or 1e-12
    means = {k: 100 * sum(r.ms[k] for r in rows) / total_ms for k in (*BUSY_PARTS, "idle")}
    return {
        "active_devices": len(rows),
        "device_busy_percent_mean": round(sum(means[k] for k in BUSY_PARTS), 2),
        "device_busy_percent_min": round(busy[least], 2),
        "least_busy_device": rows[least].device,
        "device_busy_percent_max": round(busy[most], 2),
        "most_busy_device": rows[most].device,
        **{f"device_{k}_percent_mean": round(v, 2) for k, v in means.items()},
    }


def device_table(rows: list[DeviceRow]) -> list[dict]:
    return [
        {"device": r.device, "steps": r.steps, "step_ms_mean": round(r.step_ms, 4),
         **{f"{k}_percent": round(100 * v / max(r.step_ms * r.steps, 1e-12), 2) for k, v in r.ms.items()}}
        for r in rows
    ]


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
        "device_idle_percent": round(max(idle, 0.0), 2),
        "ops_per_step_mean": round(float(np.mean([r.ops for r in rows])), 2),
        "dispatches_per_step_mean": round(float(np.mean([r.dispatches for r in rows])), 2),
        "compiles_per_step_mean": round(float(np.mean([r.compiles for r in rows])), 3),
        "steps_with_compiles": int(sum(1 for r in rows if r.compiles)),
        "syncs_per_step_mean": round(float(np.mean([r.syncs for r in rows])), 2),
        "callbacks_per_step_mean": round(float(np.mean([r.callbacks for r in rows])), 2),
    }


@dataclass
class DutyCycle:
    """One device's activity over its whole capture window, the measure XProf's duty cycle uses."""

    device: str
    window_ms: float  # first activity start -> last activity end
    busy_ms: float
    idle_outside_steps_ms: float  # idle time in the window that lies outside this device's steps
    largest_gap_ms: float
    largest_gap_where: str  # before the first step / between steps / inside a step / after the last step

    @property
    def busy_percent(self) -> float:
        return round(100 * self.busy_ms / self.window_ms, 2) if self.window_ms else 0.0


def _activity(session: Session, device: str, ops: OpTable) -> tuple[np.ndarray, np.ndarray]:
    """A device's activity intervals: its program executions where the plane records them (TPU `XLA Modules`,
    as XProf counts), else its ops."""
    for plane in session.device_planes(with_events=True):
        if f"{plane.host} {plane.name}" == device:
            spans = module_spans(plane)
            if spans is not None:
                return spans[0], spans[1]
    mask = ops.on_device(device)
    return ops.start_ps[mask], ops.end_ps[mask]


def duty_cycles(session: Session) -> list[DutyCycle]:
    """Per active device: busy share of its whole window, and where its longest idle gap lies relative to its
    steps, so a difference between in-step idle and XProf's duty cycle can be explained."""
    if "duty_cycles" in session.cache:
        return session.cache["duty_cycles"]
    ops = op_table(session)
    found = step_set(session)
    out = []
    for device in sorted(set(ops.devices()) - set(found.transfer_only)):
        host = device.split(" ", 1)[0]
        steps = [s for s in found.steps if s.device == device] or [s for s in found.steps if s.device is None and s.host == host]
        starts, ends = merge_intervals(*_activity(session, device, ops))
        if not len(starts):
            continue
        lo, hi = int(starts[0]), int(ends[-1])
        win_s = np.array([s.start_ps for s in steps], dtype=np.int64)
        win_e = np.array([s.end_ps for s in steps], dtype=np.int64)
        in_steps = covered(win_s, win_e, np.array([lo]), np.array([hi]))[0] if len(steps) else 0
        busy_in_steps = covered(starts, ends, win_s, win_e).sum() if len(steps) else 0
        busy = int((ends - starts).sum())
        gaps = starts[1:] - ends[:-1]
        largest, where = 0.0, ""
        if len(gaps):
            k = int(np.argmax(gaps))
            largest = float(gaps[k]) / PS_PER_MS
            gap_s, gap_e = int(ends[k]), int(starts[k + 1])
            if not len(steps):
                where = "no steps"
            elif gap_e <= win_s.min():
                where = "before the first step"
            elif gap_s >= win_e.max():
                where = "after the last step"
            elif covered(win_s, win_e, np.array([gap_s]), np.array([gap_e]))[0] >= (gap_e - gap_s) // 2:
                where = "inside a step"
            else:
                where = "between steps"
        out.append(DutyCycle(
            device=device, window_ms=(hi - lo) / PS_PER_MS, busy_ms=busy / PS_PER_MS,
            idle_outside_steps_ms=max(hi - lo - int(in_steps) - (busy - int(busy_in_steps)), 0) / PS_PER_MS,
            largest_gap_ms=largest, largest_gap_where=where,
        ))
    session.cache["duty_cycles"] = out
    return out


def duration_text(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def duty_summary(cycles: list[DutyCycle], in_step_busy_percent: float | None) -> dict:
    """Busy share over the whole window (mean over devices) beside the in-step share, and why they differ."""
    if not cycles:
        return {}
    window_busy = round(float(np.mean([c.busy_percent for c in cycles])), 2)
    widest = max(cycles, key=lambda c: c.largest_gap_ms)
    out = {
        "window_busy_percent": window_busy,
        "idle_outside_steps_ms": round(float(np.mean([c.idle_outside_steps_ms for c in cycles])), 4),
        "largest_idle_gap_ms": round(widest.largest_gap_ms, 4),
        "largest_idle_gap_where": widest.largest_gap_where,
        "largest_idle_gap_device": widest.device,
    }
    if in_step_busy_percent is not None and abs(window_busy - in_step_busy_percent) >= 5:
        out["window_vs_step_note"] = (
            f"Over the whole capture window the devices are busy {window_busy}% of the time, against "
            f"{round(in_step_busy_percent, 2)}% inside the steps. The difference is idle time outside the steps: "
            f"{duration_text(out['idle_outside_steps_ms'])} per device (largest idle gap {duration_text(widest.largest_gap_ms)}, "
            f"{widest.largest_gap_where} on {widest.device}), e.g. warm-up, compilation or host work before the "
            "first step; XProf's duty cycle counts it, the step breakdown does not."
        )
    return out
