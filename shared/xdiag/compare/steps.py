"""Did the step time change? Each side's step times with a confidence interval, and a verdict that holds its false
alarms under 5% on two captures of one unchanged program.

What the steps are: a capture holds few steps (3-10 is usual), their times are skewed (a slow step now and then,
never a fast one), and the first is often a warm-up (compilation, allocation, a cold cache). So:

- a first step slower than every other by more than the others' own spread (3 robust standard deviations of them,
  and at least 5% of their median) is a warm-up and left out, and said so;
- the comparison is on log step times (a ratio: "12% faster" whatever the scale; the skew tamed);
- the noise of a capture's mean is not only its steps' standard error. Two captures of the same program differ by
  more than their steps vary: on 72 same-program pairs on a TPU v5e (11 programs, 4 captures each in two
  processes, 8 steps each) Welch's t-test on log step times raised an alarm on 29 (40%), Mann-Whitney's on 31, and
  even with a minimum effect of 5% on 8 (11%): the captures differed by up to 6% (a 2.5 ms step dispatched from
  Python, a step that waits on host callbacks) while their steps varied by 1-4%. The capture-to-capture drift grows
  with the step-to-step spread (the same host jitter drives both), so each side's noise is its standard error plus
  a drift of `DRIFT_PER_SPREAD` times its steps' standard deviation plus a floor of `DRIFT_FLOOR` (clocks, placement):
  var = s²/n + (c·s)² + f². Over the 72 pairs (z: the change over its combined noise, an alarm at |z| > 1.96):
  c = 0.5 called 6 changed (8%), c = 0.75 2 (2.8%), c = 1 one (1.4%: two 4.3 ms steps dispatched from Python, 5.2%
  apart), c = 1.5 none. c = 1 is taken: under 5% with a margin (the pairs share captures, so
  they are fewer independent trials than 72, and their tails are heavy: c = 0.5, where the mean z² is about 1, still
  called 8%), while c = 1.5 would need a change 45% larger to call it. On 11 same-program pairs captured on a busy 2-core CPU (steps spread 11-37%,
  captures up to 52% apart) it called none. Held out (not calibrated on): 8 more programs (Flax, Keras, raw JAX)
  captured twice by another driver, 3-4 pipelined steps each: none called changed.
- a side with fewer than 2 steps (after a warm-up is left out) has no spread: "not enough steps", never a verdict.

The per-side interval is the plain one from its steps (Student's t on the log step times, back-transformed: the
geometric mean's 95% interval); the change's interval is the inflated one above, and it is the one the verdict and
`--fail-if-slower` read. On log step times the interval is symmetric, so the smallest change the captures could
call differs by direction: `min_detectable_gain_percent` is the smallest gain (a shorter step) they could show, the one
a fix is judged by, and `min_detectable_percent` the smallest slowdown (a step 1/(1 − gain) − 1 longer).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

DRIFT_PER_SPREAD = 1.0
DRIFT_FLOOR = 0.005  # 0.5% of the step, as a log ratio
Z_95 = 1.959964
WARM_UP_SIGMAS = 3.0
WARM_UP_MIN_EXCESS = 0.05
_T_975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
          2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
"""Student's t, two-sided 95%, for 1..30 degrees of freedom (1.96 beyond)."""


def t_975(df: int) -> float:
    return _T_975[df - 1] if 1 <= df <= len(_T_975) else Z_95


class StepSide(BaseModel):
    """One capture's step times (ms, as its step trace measured them)."""

    steps_total: int = 0
    steps_used: int = 0
    note: str = ""  # what was left out before counting (the last of steps measured start to start)
    warm_up_left_out_ms: float | None = None  # the first step, where it was a warm-up and is not counted
    mean_ms: float | None = None  # arithmetic mean of the steps used (what a program's own timer averages)
    geomean_ms: float | None = None
    ci_low_ms: float | None = None  # the geometric mean's 95% interval, from the steps' spread alone
    ci_high_ms: float | None = None
    spread_percent: float | None = None  # standard deviation of the log step times, as a percent
    step_ms: list[float] = Field(default_factory=list)  # the steps used, in order


class StepTest(BaseModel):
    """The verdict on the step time: faster | slower | no_change | not_enough_steps | not_comparable."""

    verdict: str
    baseline: StepSide = Field(default_factory=StepSide)
    candidate: StepSide = Field(default_factory=StepSide)
    change_percent: float | None = None  # candidate / baseline − 1 of the means, in percent (+ is slower)
    ci_low_percent: float | None = None  # the change's 95% interval, capture-to-capture drift included
    ci_high_percent: float | None = None
    z: float | None = None
    min_detectable_percent: float | None = None  # the smallest slowdown these captures could call (+ is slower)
    min_detectable_gain_percent: float | None = None  # the smallest gain (shorter step) these captures could call
    realized_gain_percent: float | None = None  # 1 − after/before of the mean step, in percent (+ is a gain)
    realized_gain_ms: float | None = None
    reason: str = ""
    method: str = (f"log step times; noise per side s²/n + ({DRIFT_PER_SPREAD}·s)² + {DRIFT_FLOOR:.3g}² (s: the steps' "
                   "standard deviation, n steps), calibrated on 72 same-program TPU pairs (1 "
                   "called changed, 1.4%); |z| > 1.96")


def step_side(step_ms: list[float]) -> StepSide:
    """One side's steps: the warm-up first step left out where it is one, then its mean and interval."""
    times = [float(t) for t in step_ms if t and t > 0]
    side = StepSide(steps_total=len(times))
    warm = None
    if len(times) >= 3:
        rest = np.array(times[1:])
        median = float(np.median(rest))
        robust_sd = 1.4826 * float(np.median(np.abs(rest - median)))
        if times[0] > max(rest.max(), median + WARM_UP_SIGMAS * robust_sd, median * (1 + WARM_UP_MIN_EXCESS)):
            warm, times = times[0], times[1:]
    side.warm_up_left_out_ms = round(warm, 4) if warm is not None else None
    side.steps_used, side.step_ms = len(times), [round(t, 4) for t in times]
    if not times:
        return side
    logs = np.log(times)
    side.mean_ms = round(float(np.mean(times)), 4)
    side.geomean_ms = round(float(math.exp(logs.mean())), 4)
    if len(times) >= 2:
        sd = float(logs.std(ddof=1))
        half = t_975(len(times) - 1) * sd / math.sqrt(len(times))
        side.ci_low_ms = round(math.exp(logs.mean() - half), 4)
        side.ci_high_ms = round(math.exp(logs.mean() + half), 4)
        side.spread_percent = round(100 * sd, 3)
    return side


def _noise(side: StepSide) -> float:
    """The variance of a capture's mean log step time: its steps' standard error, the capture-to-capture drift."""
    logs = np.log(side.step_ms)
    var = float(logs.var(ddof=1))
    return var / len(logs) + DRIFT_PER_SPREAD ** 2 * var + DRIFT_FLOOR ** 2


def compare_steps(before_ms: list[float], after_ms: list[float]) -> StepTest:
    """The step-time verdict of two captures' step times (ms)."""
    a, b = step_side(before_ms), step_side(after_ms)
    test = StepTest(verdict="not_enough_steps", baseline=a, candidate=b)
    if a.mean_ms and b.mean_ms:
        test.change_percent = round(100 * (b.mean_ms / a.mean_ms - 1), 3)
        test.realized_gain_percent = round(100 * (1 - b.mean_ms / a.mean_ms), 3)
        test.realized_gain_ms = round(a.mean_ms - b.mean_ms, 4)
    short = [name for name, side in (("before", a), ("after", b)) if side.steps_used < 2]
    if short:
        test.reason = "not enough steps: " + ", ".join(
            f"{name} has {side.steps_used} step{'' if side.steps_used == 1 else 's'}"
            + (" after its warm-up" if side.warm_up_left_out_ms is not None else "")
            for name, side in (("before", a), ("after", b)) if name in short) + " (a verdict needs 2 on each side)"
        return test
    delta = math.log(b.geomean_ms / a.geomean_ms)
    sd = math.sqrt(_noise(a) + _noise(b))
    test.z = round(delta / sd, 3)
    test.ci_low_percent = round(100 * (math.exp(delta - Z_95 * sd) - 1), 3)
    test.ci_high_percent = round(100 * (math.exp(delta + Z_95 * sd) - 1), 3)
    test.min_detectable_percent = round(100 * (math.exp(Z_95 * sd) - 1), 3)
    test.min_detectable_gain_percent = round(100 * (1 - math.exp(-Z_95 * sd)), 3)
    test.verdict = "no_change" if abs(delta) <= Z_95 * sd else "slower" if delta > 0 else "faster"
    return test


def slower_than(test: StepTest, percent: float) -> bool:
    """True where the candidate is slower by more than `percent` with the test's confidence: the verdict is slower
    and the change's interval lies wholly above `percent`."""
    return test.verdict == "slower" and test.ci_low_percent is not None and test.ci_low_percent > percent


def start_to_start(step_trace: dict[str, Any] | None) -> bool:
    """Steps measured from one start to the next (a module's executions, a repeating op or program sequence, host
    launches: no step markers): each is a period, but the last one has no next start and is its own duration only."""
    source = str(((step_trace or {}).get("summary") or {}).get("step_source") or "")
    return "start to start" in source or source.startswith("repeating")


LAST_STEP_NOTE = ("the last step left out: its steps run from one start to the next, and the last has no next start "
                  "(its time is its own duration, not a step)")


def trace_step_ms(step_trace: dict[str, Any] | None) -> list[float]:
    """The step times a get_step_trace output lists, one per step: a step seen on several timelines (hosts, devices
    with steps of their own) counts once, at its longest (the step ends when its slowest timeline does). Where the
    steps run start to start, each timeline's last is left out (LAST_STEP_NOTE)."""
    if not step_trace or step_trace.get("status") != "ok":
        return []
    rows = (step_trace.get("detail") or {}).get("steps") or []
    if start_to_start(step_trace) and (step_trace.get("detail") or {}).get("steps_total", len(rows)) == len(rows):
        last: dict[tuple[Any, Any], int] = {}
        for i, row in enumerate(rows):
            last[(row.get("host"), row.get("device"))] = i
        rows = [row for i, row in enumerate(rows) if i not in set(last.values())]
    by_step: dict[Any, float] = {}
    order: list[Any] = []
    seen: dict[tuple[Any, Any, Any], int] = {}
    for row in rows:
        ms = row.get("step_ms")
        if not isinstance(ms, (int, float)):
            continue
        # a step number a timeline repeats (a loop annotating every step as step 0) is another step each time
        timeline_step = (row.get("host"), row.get("device"), row.get("step"))
        seen[timeline_step] = seen.get(timeline_step, -1) + 1
        key = (row.get("step"), seen[timeline_step])
        if key not in by_step:
            order.append(key)
            by_step[key] = float(ms)
        else:
            by_step[key] = max(by_step[key], float(ms))
    return [by_step[k] for k in order]
