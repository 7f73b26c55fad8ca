"""Investigators: read the broad tools' outputs, decide OPTIMAL or form hypotheses and findings."""

from xdiag.investigators.health import health_snapshot
from xdiag.investigators.rules import RuleEngine

__all__ = ["RuleEngine", "health_snapshot"]
