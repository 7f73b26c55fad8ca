"""Does Gemini's answer hold up against the tool outputs? Each finding's evidence, title and the summary are checked
number by number against what the cited tools reported (`ToolNumbers`); what does not check out is marked
unverified, and a finding with no evidence that holds is dropped."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from typing import Any

from xdiag.investigators.gemini.answer import GeminiAnswer
from xdiag.model import Evidence, Finding, GroundingCheck

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers_in_text(text: str) -> list[tuple[str, float]]:
    return [(m.group(), float(m.group())) for m in _NUMBER.finditer(text)]


_STANDALONE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def _quoted_numbers(prose: str) -> list[str]:
    """The numbers a sentence quotes (59.6% or 30 ms), not digits inside names (bf16, fusion.1, f32[8,128])."""
    return [m.group() for m in _STANDALONE_NUMBER.finditer(re.sub(r"\w+\[[^\]]*\]", " ", prose))]


def _key(text: str) -> str:
    """A metric or field name as compared: lower case, words joined by `_` (`Step time (ms)` → `step_time_ms`)."""
    return "_".join(re.findall(r"[a-z0-9]+", text.lower()))


class _Numbers:
    """A sorted set of numbers; a token matches one to its own precision (0.93 quotes 0.9298)."""

    def __init__(self) -> None:
        self._found: set[float] = set()
        self._sorted: list[float] | None = None

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._found.add(abs(float(value)))
            self._sorted = None

    def __bool__(self) -> bool:
        return bool(self._found)

    def contains(self, token: str) -> bool:
        if self._sorted is None:
            self._sorted = sorted(self._found)
        x = float(token)
        if "e" in token.lower():
            tolerance = abs(x) * 1e-3
        else:
            decimals = len(token.split(".", 1)[1]) if "." in token else 0
            tolerance = 0.5 * 10 ** -decimals + abs(x) * 1e-9
        i = bisect.bisect_left(self._sorted, x - tolerance)
        return i < len(self._sorted) and self._sorted[i] <= x + tolerance


class ToolNumbers:
    """The numbers each tool's outputs hold, and under which metric: a field's own numbers under its name (at any
    depth), and a row's numbers under each name the row carries (an op's time under the op's name)."""

    def __init__(self, outputs: Mapping[str, list[Any]]):
        self._tool: dict[str, _Numbers] = {}
        self._metric: dict[tuple[str, str], _Numbers] = {}
        self.everything = _Numbers()
        for tool, values in outputs.items():
            for value in values:
                self._walk(tool, value, ())

    def _numbers(self, tool: str, metric: str) -> _Numbers:
        return self._metric.setdefault((tool, metric), _Numbers())

    def _walk(self, tool: str, value: Any, names: tuple[str, ...]) -> list[float]:
        """Indexes `value` reached under the field names `names`; returns the numbers it holds."""
        found: list[float] = []
        if isinstance(value, bool) or value is None:
            return found
        if isinstance(value, (int, float)):
            found = [float(value)] if math.isfinite(value) else []
        elif isinstance(value, str):
            found = [n for _, n in _numbers_in_text(value)]
        elif isinstance(value, Mapping):
            labels = [_key(v) for v in value.values() if isinstance(v, str) and 0 < len(v) <= 200]
            row: list[float] = []
            for k, v in value.items():
                row += self._walk(tool, v, (*names[-1:], _key(str(k))))
            for label in labels:  # a row's numbers count under the op (or host, or module) it names
                for number in row:
                    self._numbers(tool, label).add(number)
            found = row
        elif isinstance(value, (list, tuple)):
            for v in value:
                found += self._walk(tool, v, names)
        for number in found:
            self._tool.setdefault(tool, _Numbers()).add(number)
            self.everything.add(number)
            for name in names[-1:]:
                self._numbers(tool, name).add(number)
        return found

    def of_tool(self, tool: str) -> _Numbers:
        return self._tool.get(tool) or _Numbers()

    def of_metric(self, tool: str, metric: str) -> _Numbers | None:
        """The numbers the tool reported under `metric` (a field name, a dotted path's last field, or a row's name);
        None where the tool's output has no such metric."""
        words = metric.split()
        candidates = [_key(metric), *(_key(w) for w in reversed(words)),
                      *(_key(part) for w in reversed(words) for part in reversed(re.split(r"[.\[\]/:]+", w)))]
        for candidate in candidates:
            numbers = self._metric.get((tool, candidate))
            if numbers:
                return numbers
        return None


def _value(text: str) -> Any:
    """The model writes values as strings; numbers go into the evidence as numbers."""
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return int(number) if re.fullmatch(r"[-+]?\d+", text.strip()) else number


def ground(
    answer: GeminiAnswer, tools_with_output: set[str], numbers: ToolNumbers
) -> tuple[list[Finding], list[GroundingCheck]]:
    """The answer checked against the tool outputs, metric by metric: each evidence value must be a number the
    cited tool reported under the cited metric (its note's numbers, somewhere in that tool's output); the numbers
    in a finding's title must come from the tools it cites, and those in the summary from some tool. What did not
    check out is recorded, with what was done: unverified, or dropped where no evidence row held."""
    findings, checks = [], []
    for f in answer.findings:
        evidence, reasons = [], []
        for e in f.evidence:
            problems = []
            if e.tool not in tools_with_output:
                problems.append(f"cites {e.tool!r}, which gave no output in this analysis")
            else:
                under_metric = numbers.of_metric(e.tool, e.metric)
                values = [tok for tok, _ in _numbers_in_text(f"{e.value}")]
                if values and under_metric is None:
                    problems.append(f"{e.tool} reported no metric {e.metric!r}")
                elif under_metric is not None:
                    wrong = [tok for tok in values if not under_metric.contains(tok)]
                    if wrong:
                        problems.append(f"{e.tool} {e.metric}: {', '.join(dict.fromkeys(wrong))} is not what "
                                        f"{e.tool} reported as {e.metric!r}")
                in_tool = numbers.of_tool(e.tool)
                stray = [tok for tok, _ in _numbers_in_text(e.note) if not in_tool.contains(tok)]
                if stray:
                    problems.append(f"{e.tool} {e.metric} note: {', '.join(dict.fromkeys(stray))} appear(s) in no "
                                    f"output of {e.tool}")
            reasons += problems
            evidence.append(Evidence(tool=e.tool, metric=e.metric, value=_value(e.value), note=e.note,
                                     verified=not problems))
        verified_rows = sum(e.verified for e in evidence)
        if not evidence or not verified_rows:
            checks.append(GroundingCheck(finding=f.title, action="dropped",
                                         reasons=reasons or ["no evidence quoted from a tool output"]))
            continue
        cited = {e.tool for e in f.evidence if e.tool in tools_with_output}
        in_title = [tok for tok in _quoted_numbers(f.title)
                    if not any(numbers.of_tool(tool).contains(tok) for tool in cited)]
        if in_title:
            reasons.append(f"title: {', '.join(dict.fromkeys(in_title))} appear(s) in none of the cited tools' "
                           f"outputs ({', '.join(sorted(cited))})")
        if reasons:
            checks.append(GroundingCheck(finding=f.title, action="unverified", reasons=reasons))
        findings.append(Finding(priority=f.priority, key=f.key, title=f.title, whats_happening=f.whats_happening,
                                evidence=evidence, expected_impact=f.expected_impact, fix=f.fix,
                                verified=not reasons))
    in_summary = [tok for tok in _quoted_numbers(answer.summary) if not numbers.everything.contains(tok)]
    if in_summary:
        checks.append(GroundingCheck(finding="summary", action="unverified",
                                     reasons=[f"summary: {', '.join(dict.fromkeys(in_summary))} appear(s) in no tool "
                                              "output"]))
    findings.sort(key=lambda x: x.priority)  # stable: the model's order within a priority
    return findings, checks
