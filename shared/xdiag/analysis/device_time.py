"""How does each device spend its own time in its steps? Its busy time split into computing, communicating and
only moving data (communication overlapped by compute is hidden), one row per device, and the spread of those
shares across the active devices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.categories import TRANSFER_OP_CATEGORIES
from xdiag.analysis.intervals import covered_by_unions, merge_intervals
from xdiag.analysis.op_table import OpTable

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
    is_transfer = ops.in_categories(TRANSFER_OP_CATEGORIES)
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
    # each layer joins the union of the ones before it
    strong_ps, with_collective, with_weak, everything = covered_by_unions(merge_intervals(*layers[0]), layers[1:],
                                                                          win_s, win_e)
    return DevicePartition(
        compute=strong_ps + (with_weak - with_collective),
        collective=with_collective - strong_ps,
        transfer=everything - with_weak,
    )


@dataclass(slots=True)
class DeviceRow:
    """One device over its own steps: the per-device spread behind the means."""

    device: str
    steps: int
    step_ms: float  # mean
    ms: dict[str, float]  # compute / collective / transfer / idle, summed over its steps


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
