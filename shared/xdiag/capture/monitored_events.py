"""Monitored events, as the managed service's `monitored-events list|describe`: the degradation events xdiag saw
(Cloud Monitoring incidents, the monitor's verdicts, manual requests) and what each led to — a capture, a cool-down,
nothing and why — from the record the capture stage keeps of every message on `alerts` (`alerts/{key}`).

`describe` adds the analyser's details: for a monitor verdict its baseline, window and step times; the run's monitor
state; the session the event captured, its analysis and report; for a cool-down, the event whose capture it fell
inside.
"""

from __future__ import annotations

from typing import Any

from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import ALERTS, MONITORS
from xdiag.pipeline.topics import ANALYSES, sessions_collection

OUTCOMES = ("captured", "cool-down", "ignored", "refused", "rejected", "FAILED", "NO_BUFFER")


def outcome_kind(outcome: str) -> str:
    """`cool-down: run 'r' was captured …` → `cool-down`."""
    head = (outcome or "").split(":", 1)[0].strip()
    return head if head in OUTCOMES else "other"


def _event(key: str, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": key, "run_id": record.get("run_id"), "source": record.get("source"),
        "received_at": record.get("received_at"), "outcome": outcome_kind(record.get("outcome", "")),
        "session_id": record.get("session_id"),  # the session it captured (a cool-down captured none)
        "summary": record.get("summary") or "", "detail": record.get("outcome", ""),
    }


def list_events(state, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every event (of one run, or all), oldest first."""
    events = [_event(key, doc) for key, doc in state.list(ALERTS) if run_id is None or doc.get("run_id") == run_id]
    return sorted(events, key=lambda e: str(e["received_at"] or ""))


def describe_event(state, event_id: str) -> dict[str, Any] | None:
    record = state.get(ALERTS, event_id)
    if record is None:
        return None
    event = {**_event(event_id, record), "incident_id": record.get("incident_id"),
             "analyser": record.get("detail") or {}}
    run_id = record.get("run_id")
    if run_id:
        monitor = state.get(MONITORS, state_key(run_id))
        if monitor:
            event["monitor"] = {k: monitor.get(k) for k in ("verdict", "baseline_ms", "baseline_at", "window_median_ms",
                                                             "bad_at", "verdicts", "seen")}
            event["monitor"]["latest_step_times_ms"] = (monitor.get("points") or [])[-20:]
    if event["outcome"] == "cool-down" and run_id:
        # The capture received last before it; in a storm delivered at once, the one that claimed the capture may
        # have been received a moment after it: then the first capture after it.
        received = str(record.get("received_at"))
        captured = [e for e in list_events(state, run_id) if e["outcome"] == "captured"]
        before = [e for e in captured if str(e["received_at"]) <= received]
        after = [e for e in captured if str(e["received_at"]) > received]
        event["cooled_down_by"] = before[-1]["id"] if before else after[0]["id"] if after else None
    session_id = record.get("session_id")
    if run_id and session_id:
        session = state.get(sessions_collection(run_id), state_key(session_id)) or {}
        analysis = state.get(ANALYSES, session["analysis_id"]) if session.get("analysis_id") else None
        event["capture"] = {
            "session_id": session_id, "kind": session.get("kind"), "status": session.get("status"),
            "mode": session.get("mode"), "targets": session.get("targets"),
            "analysis": None if analysis is None else {
                "analysis_id": analysis.get("analysis_id"), "status": analysis.get("status"),
                "result": analysis.get("result"), "report_uri": analysis.get("report_uri")},
        }
    return event
