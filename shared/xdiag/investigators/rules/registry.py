"""The rule registry: one rule per finding, registered with `@rule(key)` the way `@tool` registers tools.

A rule is a function `(facts, found) -> Hypothesis | None`: it reads the facts (the health snapshot and the broad
tools' outputs) and the hypotheses the rules before it formed, and forms its finding's hypothesis when its signal is
present. The engine runs the rules in `RULE_ORDER`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from xdiag.investigators import advice
from xdiag.investigators.health import HealthSnapshot
from xdiag.investigators.rules.hypothesis import Hypothesis, detail, evidence, summary
from xdiag.model import Evidence, ToolResult


@dataclass
class Facts:
    """What every rule reads: the health snapshot, the broad tools' outputs, and the step figures most rules share."""

    health: HealthSnapshot
    results: dict[str, ToolResult]

    def summary(self, tool: str) -> dict[str, Any]:
        return summary(self.results, tool)

    def detail(self, tool: str) -> dict[str, Any]:
        return detail(self.results, tool)

    def context(self) -> advice.Context:
        """The platform, vendor and framework that the advice is written for."""
        return advice.context(self.summary("get_device_information"))

    @cached_property
    def step(self) -> dict[str, Any]:
        return self.summary("get_step_trace")

    @property
    def breakdown(self) -> dict[str, float]:
        return self.health.breakdown_percent

    @property
    def step_ms(self) -> float | None:
        return self.health.step_time_ms

    @property
    def compute(self) -> float:
        return self.breakdown.get("compute", 0.0)

    @property
    def compute_ms(self) -> float:
        return (self.step_ms or 0) * self.compute / 100

    @property
    def dispatches(self) -> float:
        return self.step.get("dispatches_per_step_mean") or 0

    @cached_property
    def base(self) -> list[Evidence]:
        """The evidence every step-time finding opens with: the step time and the share the devices compute.
        Rules add to a copy (`facts.base + [...]`), never to this list."""
        steps = self.step.get("steps") or 0
        return [evidence("get_step_trace", "step_time_ms_mean", self.step_ms,
                         f"over {steps} {'step' if steps == 1 else 'steps'} ({self.step.get('step_source')})"),
                evidence("get_step_trace", "compute_percent", self.compute)]

    @property
    def small_work(self) -> bool:
        """Too little work per step: the device finishes quickly and fixed per-step costs dominate."""
        return self.compute < 50 and self.compute_ms < 1.0 and self.dispatches <= 3 and (self.step_ms or 0) < 10


Rule = Callable[[Facts, list[Hypothesis]], "Hypothesis | list[Hypothesis] | None"]
"""A rule forms its finding's hypothesis, or none; the idiom rule forms one per match (a list)."""

RULES: dict[str, Rule] = {}

RULE_ORDER = (
    "program_idioms",
    "low_utilization",
    "dispatch_overhead",
    "recompilation",
    "host_sync",
    "warm_up",
    "input_bound",
    "collectives",
    "widening_converts",
    "unfused_data_movement",
    "materialised_attention",
    "memory_bound",
    "latency_bound",
    "low_kernel_efficiency",
    "bounded_efficiency",
    "memory_transfers",
    "unfused_kernels",
    "opaque_kernel",
    "memory_pressure",
    "straggler_host",
    "device_idle",
    "measured_not_explained",
)
"""The order the engine runs the rules in. It matters: findings of equal score keep it in the ranking, and some
rules read the findings before them (unfused_data_movement yields to the argument_copies and layout_copies
idioms, low_kernel_efficiency to memory_bound and latency_bound, opaque_kernel to any finding naming its kernels, device_idle to any strong one)."""


def rule(key: str) -> Callable[[Rule], Rule]:
    """Registers the rule that forms the finding `key`."""

    def register(func: Rule) -> Rule:
        if key in RULES:
            raise ValueError(f"rule {key!r} is registered twice")
        if key not in RULE_ORDER:
            raise ValueError(f"rule {key!r} has no place in RULE_ORDER")
        RULES[key] = func
        return func

    return register


def ordered_rules() -> list[Rule]:
    """The registered rules in RULE_ORDER; every rule in the order must be registered."""
    missing = [key for key in RULE_ORDER if key not in RULES]
    if missing:
        raise LookupError(f"rules in RULE_ORDER that no module registers: {missing}")
    return [RULES[key] for key in RULE_ORDER]
