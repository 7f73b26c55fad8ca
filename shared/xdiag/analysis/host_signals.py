"""What does a host's own activity explain of its steps? Its non-op events sorted into the step breakdown's host
layers (callbacks, host<->device copies, compiles, warm-up, blocking syncs, dispatch), the outermost ones counted,
and the blocking wait that takes the most host time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.host_threads import EventSelection, HostThreads
from xdiag.analysis.host_vocabulary import (
    CALLBACK_EVENT,
    COMPILE_EVENT,
    DEVICE_TO_HOST_COPY_EVENT,
    HOST_TRANSFER_EVENT,
)
from xdiag.analysis.intervals import PS_PER_MS, covered_by_merged, merge_intervals, outermost
from xdiag.analysis.warm_up import warm_up_calls

HOST_LAYERS = ("callback", "transfer", "compile", "warm_up", "host_sync", "dispatch")
"""The layers host events explain, in precedence order, each booked in the category of its name but `callback`
(the device's host-callback ops, and the copies that serve them) in host_sync; `transfer` (host<->device copies
seen on the host's lines) comes before host_sync: np.asarray's wait for its read is the copy."""
LAYER_CATEGORY = {"callback": "host_sync"}


def largest_sync_event(events: HostThreads) -> tuple[str, float] | None:
    """(name, total ms) of the blocking wait that takes the most host time, outermost events only."""
    words = events.vocabulary
    waits = events.select(words.sync, words.sync_stat)
    if not len(waits.start_ps):
        return None
    keep = outermost(np.ones(len(waits.start_ps), dtype=bool), waits.line, waits.start_ps, waits.end_ps)
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
    outer = outermost(np.ones(len(selected.start_ps), dtype=bool), selected.line, selected.start_ps, selected.end_ps)
    lines, counts = np.unique(selected.line[outer], return_counts=True)
    return selected.start_ps[outer & (selected.line == lines[int(np.argmax(counts))])]


@dataclass
class HostSignals:
    """A host's non-op events sorted into the breakdown's layers, and the outermost ones to count."""

    layers: dict[str, tuple[np.ndarray, np.ndarray]]  # HOST_LAYERS -> (starts, ends)
    counted: dict[str, np.ndarray]  # dispatches / compiles / syncs / callbacks -> starts of counted events
    read_ends: np.ndarray  # ends of the blocking reads that mostly copied data (not waited for the device)
    call_copies: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.int64), np.empty(0, np.int64))
    """(starts, ends) of the copies of a jitted call's own arguments (DevicePut inside PjitFunction): booked as the
    call's dispatch, they are its arguments' bytes, not its launch"""

    @classmethod
    def of(cls, events: HostThreads | None, callback_s: np.ndarray, callback_e: np.ndarray,
           callback_calls: np.ndarray) -> HostSignals:
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
            return selected.start_ps[outermost(everything, selected.line, selected.start_ps, selected.end_ps)]

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
            call_copies=(transfer.start_ps[~outside], transfer.end_ps[~outside]),
        )


def _copying_read_ends(sync: EventSelection, copies: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Ends of the outermost blocking reads that spent most of their time copying data to the host (np.asarray of a
    large array) rather than waiting for the device to finish (float(loss), block_until_ready): what the host does
    right after such a read is work on the data it brought back."""
    if not len(sync.start_ps):
        return np.empty(0, np.int64)
    keep = outermost(np.ones(len(sync.start_ps), dtype=bool), sync.line, sync.start_ps, sync.end_ps)
    starts, ends = sync.start_ps[keep], sync.end_ps[keep]
    copying = 2 * covered_by_merged(copies, starts, ends) >= ends - starts
    return np.unique(ends[copying & (ends > starts)])
