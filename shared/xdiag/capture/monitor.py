"""The monitor stage (topic `step-times`): a run's step times → a baseline → a `bad` verdict on `alerts`.

The workload reports step times (`xdiag.sdk.workload`, through the control plane), each with when the step ended. Per
run the monitor skips the warm-up points, takes the median of the next `baseline_points` as the baseline, then
judges the run window by window: each window of `window_s` seconds (by the steps' own clock) with at least
`min_window_points` steps gets its median step time; only when `consecutive_windows` windows in a row are all
more than `margin` above the baseline is the slowdown sustained, and the monitor publishes
`{"run_id": …, "verdict": "bad", …}` on `alerts`, once, and again only after a window back under the margin.
The defaults (`xdiag.pipeline.runs.MonitorSettings`: 15%, 10 s windows, 5 steps, 3 windows) need at least 30 s of a
slowdown: a busy machine's scattered slow steps, or a stall of a second or two, move no window's median past the
margin. So automatic capture works without Cloud Monitoring, and does not cry wolf.

Points are keyed by step number: a redelivered or late batch adds nothing it already has. A point without a time
(`at` 0) counts as ending when it arrived. The state is one document per run (`monitors/{run}`), written by one
delivery at a time (the function's concurrency is 1). Step times for a run the registry does not know are
refused (dead-lettered with the reason): they create no monitor.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from xdiag.errors import PoisonMessage
from xdiag.ids import check_run_id
from xdiag.model import Alert, StepTimes, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import MONITORS, get_run
from xdiag.pipeline.topics import TOPIC_ALERTS

KEEP_WINDOWS = 20  # judged windows kept per run (the verdict needs the latest few; the rest is for people)
MAX_WINDOW_POINTS = 2000  # steps kept per open window (a median of 2000 steps is as good as of more; the document stays small)


def monitor(message: StepTimes, deps: Dependencies) -> None:
    settings = deps.monitor
    check_run_id(message.run_id)
    key = state_key(message.run_id)
    doc = deps.state.get(MONITORS, key)
    if doc is None:
        if get_run(deps.state, message.run_id) is None:
            raise PoisonMessage(f"step times for unknown run {message.run_id!r}: register the run first")
        doc = {"run_id": message.run_id, "verdict": "warming_up", "baseline_points": [], "open": [], "windows": []}
    last_step = doc.get("last_step", -1)
    fresh = sorted((p for p in message.points if p.step > last_step), key=lambda p: p.step)
    if not fresh:
        return
    received = time.time()
    doc["last_step"] = fresh[-1].step
    doc["seen"] = doc.get("seen", 0) + len(fresh)
    points = [(p.at or received, p.step_time_ms) for p in fresh]
    skip = max(0, settings.warmup_points - doc.get("skipped", 0))  # warm-up and compilation are no baseline
    doc["skipped"] = doc.get("skipped", 0) + min(skip, len(points))
    points = points[skip:]
    if doc.get("baseline_ms") is None:
        wanted = settings.baseline_points - len(doc["baseline_points"])
        doc["baseline_points"] += [ms for _, ms in points[:wanted]]
        points = points[wanted:]
        if len(doc["baseline_points"]) >= settings.baseline_points:
            doc["baseline_ms"] = statistics.median(doc["baseline_points"])
            doc["baseline_at"] = utc_now()
    doc["updated_at"] = utc_now()
    alert = _judge(doc, points, settings) if doc.get("baseline_ms") is not None else None
    deps.state.set(MONITORS, key, doc)  # before publishing: a redelivery finds the verdict given
    if alert is not None:
        deps.bus.publish(TOPIC_ALERTS, Alert(source="verdict", run_id=message.run_id, verdict="bad",
                                             summary=alert["summary"], detail={**alert, "target": message.target}))
        deps.on_event("monitor", {"run": message.run_id, "verdict": "bad", "summary": alert["summary"]})


def _judge(doc: dict[str, Any], points: list[tuple[float, float]], settings) -> dict[str, Any] | None:
    """Adds the points to the open windows, judges every window that has closed (a later step ended after it), and
    returns the alert's detail where the verdict turned bad."""
    baseline = doc["baseline_ms"]
    threshold = baseline * (1 + settings.margin)
    opened = doc.setdefault("open", [])
    if doc.get("origin") is None:  # windows count from the first judged step (None where a report had none left)
        doc["origin"] = min((at for at, _ in points), default=None)
    origin = doc["origin"]
    if origin is None:
        return None
    closed_until = doc.get("closed_until", -1)  # the last window index judged
    counts: dict[int, int] = {}
    for index, _ in opened:
        counts[index] = counts.get(index, 0) + 1
    for at, ms in points:
        index = math.floor((at - origin) / settings.window_s)
        if index > closed_until and counts.get(index, 0) < MAX_WINDOW_POINTS:  # a judged window's step is too late
            opened.append([index, ms])
            counts[index] = counts.get(index, 0) + 1
    newest = max((index for index, _ in opened), default=closed_until)
    alert = None
    for index in sorted({i for i, _ in opened if i < newest}):
        times = [ms for i, ms in opened if i == index]
        closed_until = index
        if len(times) < settings.min_window_points:
            continue  # too few steps to say anything: neither a slowdown nor a recovery
        median = statistics.median(times)
        above = median > threshold
        doc["windows"] = (doc.get("windows", []) + [{"window": index, "median_ms": round(median, 3),
                                                     "points": len(times), "above": above}])[-KEEP_WINDOWS:]
        doc["window_median_ms"] = median
        doc["streak"] = doc.get("streak", 0) + 1 if above else 0
        verdict = "bad" if doc["streak"] >= settings.consecutive_windows else "good" if not above else doc["verdict"]
        if verdict == "bad" and doc["verdict"] != "bad":
            doc["bad_at"] = utc_now()
            doc["verdicts"] = doc.get("verdicts", 0) + 1
            sustained = settings.consecutive_windows * settings.window_s
            alert = {
                "summary": (
                    f"step time degraded: the median step time was {median:.2f} ms, "
                    f"{100 * (median / baseline - 1):.0f}% above the baseline {baseline:.2f} ms (margin "
                    f"{100 * settings.margin:.0f}%), in {settings.consecutive_windows} windows of "
                    f"{settings.window_s:g} s in a row ({sustained:g} s sustained)"
                ),
                "metric": "step_time_ms", "baseline_ms": round(baseline, 3), "window_median_ms": round(median, 3),
                "margin": settings.margin, "window_s": settings.window_s,
                "consecutive_windows": settings.consecutive_windows, "window_points": len(times),
                "window_ms": [round(ms, 3) for ms in times[-500:]],  # the last window's step times (the viewer plots them)
                "source": "xdiag-monitor",
            }
        doc["verdict"] = verdict
    doc["closed_until"] = closed_until
    doc["open"] = [[i, ms] for i, ms in opened if i > closed_until]
    return alert
