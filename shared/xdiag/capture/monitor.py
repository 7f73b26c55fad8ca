"""The monitor stage (topic `step-times`): a run's step times → a baseline → a `bad` verdict on `alerts`.

The workload reports step times (`xdiag.capture.workload`, through the control plane). Per run the monitor skips the
warm-up points, takes the median of the next `baseline_points` as the baseline, then watches the median of the
latest `window_points`: once it is more than `margin` (15% by default) above the baseline, it publishes
`{"run_id": …, "verdict": "bad", …}` on `alerts`, once, and again only after the run has recovered. So automatic
capture works without Cloud Monitoring.

Points are keyed by step number: a redelivered or late batch adds nothing it already has. The state is one
document per run (`monitors/{run}`), written by one delivery at a time (the function's concurrency is 1).
"""

from __future__ import annotations

import statistics
from typing import Any

from xdiag.model import Alert, StepTimes, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import MONITORS, check_run_id
from xdiag.pipeline.topics import TOPIC_ALERTS

KEEP_POINTS = 200  # the latest points kept per run, besides the baseline


def monitor(message: StepTimes, deps: Dependencies) -> None:
    settings = deps.monitor
    check_run_id(message.run_id)
    key = state_key(message.run_id)
    doc = deps.state.get(MONITORS, key) or {"run_id": message.run_id, "verdict": "warming_up", "points": []}
    last_step = doc.get("last_step", -1)
    fresh = sorted((p for p in message.points if p.step > last_step and p.step_time_ms > 0), key=lambda p: p.step)
    if not fresh:
        return
    doc["last_step"] = fresh[-1].step
    doc["seen"] = doc.get("seen", 0) + len(fresh)
    times = [p.step_time_ms for p in fresh]
    skip = max(0, settings.warmup_points - doc.get("skipped", 0))  # warm-up and compilation are no baseline
    doc["skipped"] = doc.get("skipped", 0) + min(skip, len(times))
    points = doc["points"] + times[skip:]
    if doc.get("baseline_ms") is None and len(points) >= settings.baseline_points:
        doc["baseline_ms"] = statistics.median(points[:settings.baseline_points])
        doc["baseline_at"] = utc_now()
        points = points[settings.baseline_points:]
    doc["points"] = points[-KEEP_POINTS:]
    doc["updated_at"] = utc_now()
    baseline = doc.get("baseline_ms")
    window = doc["points"][-settings.window_points:]
    if baseline is None or len(window) < settings.window_points:
        deps.state.set(MONITORS, key, doc)
        return
    current = statistics.median(window)
    threshold = baseline * (1 + settings.margin)
    doc["window_median_ms"] = current
    verdict = "bad" if current > threshold else "good"
    changed = verdict != doc.get("verdict")
    doc["verdict"] = verdict
    if changed and verdict == "bad":
        doc["bad_at"] = utc_now()
        doc["verdicts"] = doc.get("verdicts", 0) + 1
    deps.state.set(MONITORS, key, doc)  # before publishing: a redelivery finds the verdict given
    if changed and verdict == "bad":
        summary = (
            f"step time degraded: median of the last {len(window)} steps {current:.2f} ms is "
            f"{100 * (current / baseline - 1):.0f}% above the baseline {baseline:.2f} ms (margin {100 * settings.margin:.0f}%)"
        )
        detail: dict[str, Any] = {"metric": "step_time_ms", "baseline_ms": round(baseline, 3),
                                  "window_median_ms": round(current, 3), "margin": settings.margin,
                                  "window_points": len(window), "target": message.target, "source": "xdiag-monitor",
                                  "window_ms": [round(point, 3) for point in window]}
        deps.bus.publish(TOPIC_ALERTS, Alert(source="verdict", run_id=message.run_id, verdict="bad", summary=summary,
                                             detail=detail))
        deps.on_event("monitor", {"run": message.run_id, "verdict": "bad", "summary": summary})
