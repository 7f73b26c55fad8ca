"""How busy is each device over its whole capture window, as XProf's duty cycle measures it, and why does that
differ from its busy share inside the steps (idle time before the first step, between steps, after the last)?"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.intervals import PS_PER_MS, covered, merge_intervals
from xdiag.analysis.op_table import OpTable, module_spans, op_table
from xdiag.analysis.steps import step_set
from xdiag.profile.space import Session

@dataclass(slots=True)
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
