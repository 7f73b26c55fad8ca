"""Investigators: read the broad tools' outputs, decide OPTIMAL or form hypotheses and findings."""

from xdiag.investigators.health import HealthSnapshot, health_snapshot
from xdiag.investigators.rules import RuleEngine
from xdiag.investigators.verdict import checked_verdict

MAX_FOLLOW_UP_CALLS = 4
"""An investigation's budget of follow-up tool calls, whoever investigates (the investigate stage enforces it)."""

__all__ = ["MAX_FOLLOW_UP_CALLS", "HealthSnapshot", "RuleEngine", "checked_verdict", "health_snapshot"]
