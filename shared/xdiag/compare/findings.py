"""Did each finding's fix pay off? For every finding of the baseline: gone, smaller, unchanged or larger in the
candidate, with the gain it predicted beside the gain realized.

The predicted gain is the finding's own `expected_impact`, as the investigator wrote it: the range its lead lever
gives ("Leading with <lever>: A–B% shorter steps", the change its fix leads with, or "… (predicted A–B%)" after an
idiom's stake, the share of it its change recovers), else "up to N% shorter steps" or
"up to N% of step time" (a share of the step), else a range it states ("A–B% shorter steps"), else "… = N% of op
time" / "cuts N% of op time" / "up to N% less op time" (a share of device op time, turned into a share of the step
with the side's op time per step). A finding that
states its gain in words alone has no predicted number, and the outcome says so. The realized gain is the step
time's (1 − after/before, from the step test); the finding's own stake on the candidate side (what the same finding
predicts there) says whether its part shrank: smaller where it is at most `SMALLER` of what it was, larger where it
is at least `LARGER`; where neither side states a number, a lower priority is smaller, a higher one larger.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

SMALLER, LARGER = 0.8, 1.25
_PRIORITY = {"P0": 0, "P1": 1, "P2": 2}
_STEP_SHARE = re.compile(r"up to (\d+(?:\.\d+)?)% (?:shorter steps|of step time)", re.IGNORECASE)
_STEP_RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*[–-]\s*(\d+(?:\.\d+)?)% shorter steps", re.IGNORECASE)
_LEAD_RANGE = re.compile(r"Leading with [^:.]+: " + _STEP_RANGE.pattern + r"|\(predicted (\d+(?:\.\d+)?)\s*[–-]\s*"
                         r"(\d+(?:\.\d+)?)%\)", re.IGNORECASE)
_OP_SHARE = re.compile(r"(?:=|cuts|up to)\s*(\d+(?:\.\d+)?)% (?:of op time|less op time)", re.IGNORECASE)


class Stake(BaseModel):
    """What a finding puts at stake on one side: a share of the step and its ms per step."""

    percent_of_step: float | None = None  # the most it predicts ("up to", a range's high end)
    ms_per_step: float | None = None
    low_percent_of_step: float | None = None  # a range's low end, where it predicts a range
    low_ms_per_step: float | None = None
    basis: str = ""  # "step time" | "op time" (then turned into a share of the step) | "" (words only)


class FindingOutcome(BaseModel):
    key: str
    title: str
    priority_before: str
    priority_after: str | None = None  # None: gone
    outcome: str  # gone | smaller | unchanged | larger
    predicted: Stake  # the baseline's own prediction
    remaining: Stake | None = None  # what the same finding predicts on the candidate side (None: gone)
    realized_gain_percent: float | None = None  # the step time's, 1 − after/before
    realized_gain_ms: float | None = None
    predicted_text: str = ""  # the finding's expected_impact, as written
    note: str = ""


def stake(finding: dict[str, Any], step_ms: float | None, op_ms_per_step: float | None) -> Stake:
    """The share of the step a finding predicts it would save, parsed from its expected_impact."""
    text = finding.get("expected_impact") or ""
    between = _LEAD_RANGE.search(text)
    step = None if between else _STEP_SHARE.search(text)
    between = between or (None if step else _STEP_RANGE.search(text))
    if between:
        low, high = (float(g) for g in between.groups() if g is not None)
        return Stake(percent_of_step=high, low_percent_of_step=low, basis="step time",
                     ms_per_step=round(step_ms * high / 100, 4) if step_ms else None,
                     low_ms_per_step=round(step_ms * low / 100, 4) if step_ms else None)
    if step:
        percent = float(step.group(1))
        return Stake(percent_of_step=percent, basis="step time",
                     ms_per_step=round(step_ms * percent / 100, 4) if step_ms else None)
    ops = [float(m) for m in _OP_SHARE.findall(text)]
    if ops and op_ms_per_step and step_ms:
        ms = op_ms_per_step * max(ops) / 100  # "up to": the largest gain it names
        return Stake(percent_of_step=round(100 * ms / step_ms, 2), ms_per_step=round(ms, 4), basis="op time")
    return Stake()


def finding_outcomes(before: list[dict[str, Any]], after: list[dict[str, Any]],
                     sides: tuple[tuple[float | None, float | None], tuple[float | None, float | None]],
                     realized_percent: float | None, realized_ms: float | None) -> list[FindingOutcome]:
    """`sides`: (step ms, op ms per step) of the baseline and of the candidate."""
    (step_a, ops_a), (step_b, ops_b) = sides
    found_after = {f["key"]: f for f in after}
    outcomes = []
    for f in before:
        predicted = stake(f, step_a, ops_a)
        g = found_after.get(f["key"])
        remaining = stake(g, step_b, ops_b) if g else None
        note = "" if predicted.basis else "its expected impact names no share of the step or of op time"
        if g is None:
            outcome = "gone"
            if realized_percent is not None and realized_percent < 0:  # the finding left, and took more with it
                note = (note + "; " if note else "") + (f"gone, but the step is {-realized_percent:.3g}% slower: "
                                                        "the change cost more than the finding held")
        elif predicted.ms_per_step and remaining and remaining.ms_per_step is not None:
            ratio = remaining.ms_per_step / predicted.ms_per_step
            outcome = "smaller" if ratio <= SMALLER else "larger" if ratio >= LARGER else "unchanged"
        else:
            order_a, order_b = _PRIORITY.get(f["priority"], 3), _PRIORITY.get(g["priority"], 3)
            outcome = "smaller" if order_b > order_a else "larger" if order_b < order_a else "unchanged"
            note = (note + "; " if note else "") + "judged by its priority"
        outcomes.append(FindingOutcome(
            key=f["key"], title=f["title"], priority_before=f["priority"], priority_after=g["priority"] if g else None,
            outcome=outcome, predicted=predicted, remaining=remaining, realized_gain_percent=realized_percent,
            realized_gain_ms=realized_ms, predicted_text=f.get("expected_impact") or "", note=note))
    return outcomes
