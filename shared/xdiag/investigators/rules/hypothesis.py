"""A hypothesis (a finding in the making) and the evidence helpers every rule shares: evidence quotes a tool's
output by name, and the texts that say what is at stake read the same in every finding."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xdiag.model import Evidence, Finding, SourceLine, ToolResult

CallTool = Callable[[str, dict[str, Any], str], ToolResult | None]
"""call_tool(name, args, hypothesis) -> result, or None once the follow-up budget is spent."""


@dataclass
class Hypothesis:
    key: str
    score: float  # percent of step time (or op time) at stake; orders hypotheses and sets priority
    title: str
    whats_happening: str
    evidence: list[Evidence]
    expected_impact: str
    fix: str
    follow_up: tuple[str, dict[str, Any]] | None = None
    extra_evidence: Callable[[ToolResult], list[Evidence]] | None = field(default=None, repr=False)
    ops: frozenset[tuple[str, str]] = frozenset()  # (module, op) whose time the finding stakes, where it names them
    inflates: frozenset[tuple[str, str]] = frozenset()  # (module, op) reading the bytes this finding's ops write
    host_lines: list[SourceLine] = field(default_factory=list)  # the user's Python frames its host time runs in
    no_host_line: str = ""  # why it names none, for a host finding whose events no recorded user frame holds
    predicted: tuple[float, float] | None = None  # the step-time gain its fix's first change is predicted to realise
    withheld: bool = False  # its fix offers no change: the levers that fit were withheld (their premises fail)
    names_no_change: bool = False  # its fix names a kind of remedy, no change to make ("use another algorithm or
    # kernel"): it ranks after every finding that names one, and says what to look at next

    @property
    def priority(self) -> str:
        return "P0" if self.score >= 40 else "P1" if self.score >= 15 else "P2"

    def finding(self) -> Finding:
        found = Finding(priority=self.priority, key=self.key, title=self.title, whats_happening=self.whats_happening,
                        evidence=self.evidence, expected_impact=self.expected_impact, fix=self.fix)
        found._staked_ops = frozenset(op for _, op in self.ops)  # their source lines: investigators.source_lines
        found._host_lines, found._no_host_line = list(self.host_lines), self.no_host_line
        return found


def summary(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    """A tool's summary, empty where it did not run or did not succeed."""
    r = results.get(tool)
    return r.summary if r is not None and r.ok else {}


def detail(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    """A tool's detail, empty where it did not run or did not succeed."""
    r = results.get(tool)
    return r.detail if r is not None and r.ok else {}


def failure_reason(results: dict[str, ToolResult], tool: str) -> str | None:
    """Why a tool reported nothing; None where it succeeded or did not run."""
    result = results.get(tool)
    return result.reason if result is not None and not result.ok else None


def evidence(tool: str, metric: str, value: Any, note: str = "") -> Evidence:
    return Evidence(tool=tool, metric=metric, value=value, note=note)


def shape_note(row: dict, key: str = "shape") -> str:
    """"; shape S" where the profile gives the op's shape, else nothing: never a placeholder."""
    shape = row.get(key) or row.get("converted_shape")
    return f"; shape {shape}" if shape else ""


def saving(step_ms: float | None, share: float, idle: float | None = None) -> str:
    """The gain of removing `share`% of the step. A host-side lever's (`idle`: the step's measured device idle
    share) is a range: at least the time it removes, at most the device's whole idle time, which the host's other
    work hides once the host no longer blocks it (the LSTM trial of issue 61: float(loss) held 22% of the step,
    removing it gave 30%, the device having been idle 35% of it)."""
    if idle is not None and idle > share + 0.5:
        high = min(idle, 100.0)
        if not step_ms:
            return f"{share:.0f}–{high:.0f}% of step time"
        return (f"{share:.0f}–{high:.0f}% shorter steps: {step_ms:.3g} ms → about {step_ms * (1 - high / 100):.3g}–"
                f"{step_ms * (1 - share / 100):.3g} ms: the {share:.0f}% this time takes, and up to the {high:.0f}% "
                "the device sits idle if the host's other work then overlaps the device's")
    if not step_ms:
        return f"up to {share:.0f}% of step time"
    after = step_ms * (1 - share / 100)
    return f"up to {share:.0f}% shorter steps: {step_ms:.3g} ms → about {after:.3g} ms if this time were removed"


def device_idle(b: dict[str, float]) -> float:
    """The step's share with no device work (neither compute, collectives nor copies), from its breakdown."""
    return max(100.0 - sum(b.get(c, 0.0) for c in ("compute", "collective", "transfer")), 0.0)


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def program(module: str | None) -> str:
    """An HLO module's name without the id the HLO checks add (`jit_step(8)` -> `jit_step`), as op rows name it."""
    return re.sub(r"\(\d+\)$", "", module or "")


def events_evidence(result: ToolResult) -> list[Evidence]:
    s = result.summary
    nested = (s.get("matches") or 0) - (s.get("outermost_matches") or s.get("matches") or 0)
    outermost = "outermost_matches" in s  # nested matches are counted once: the count quoted is the outermost's
    out = [evidence("aggregate_xplane_events",
                    f"{'outermost ' if outermost else ''}events matching {s.get('pattern')!r}",
                    s["outermost_matches"] if outermost else s.get("matches"),
                    f"{s.get('total_ms')} ms in total, mean {s.get('mean_us')} µs"
                    + (f" ({nested} more nested in them, their time counted once)" if nested > 0 else ""))]
    # Python frames (a PyTorch trace's python_function events): the user's innermost frames and nn.Module calls, not
    # the outermost frames (threading.py's _bootstrap, torch's _call_impl) that enclose everything.
    named = [("user's innermost Python frames", "user_frames"), ("innermost nn.Module calls", "modules")]
    for metric, key in named:
        top = result.detail.get(key, [])[:3]
        if top:
            out.append(evidence("aggregate_xplane_events", metric,
                                ", ".join(f"{t['name']} ({t['total_ms']} ms)" for t in top)))
    top = result.detail.get("top_names", [])[:3]
    if top and not any(result.detail.get(key) for _, key in named):
        out.append(evidence("aggregate_xplane_events", "top matching events",
                            ", ".join(f"{t['name']} ({t['total_ms']} ms)" for t in top)))
    return out


def neighborhood_evidence(result: ToolResult) -> list[Evidence]:
    s = result.summary
    out = [evidence("get_hlo_neighborhood", f"{s.get('op')} in {s.get('module')}", s.get("shape"),
                    f"opcode {s.get('opcode')}; framework op {s.get('framework_op') or 'unknown'}")]
    if s.get("producers"):
        out.append(evidence("get_hlo_neighborhood", "fed by", ", ".join(s["producers"][:4])))
    if s.get("consumers"):
        out.append(evidence("get_hlo_neighborhood", "used by", ", ".join(s["consumers"][:4])))
    if s.get("source"):
        out.append(evidence("get_hlo_neighborhood", "source line", s["source"]))
    return out
