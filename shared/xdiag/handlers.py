"""The stage table: which handler consumes each topic. The one module that knows every stage.

Bus adapters (in-process, Pub/Sub push, Cloud Functions) wire topics to handlers from here; the stages themselves
import only what lies below them (xdiag.pipeline, xdiag.capture), so there is no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdiag.model import Alert, StepTimes, SweepRequest
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.stages.collect import collect
from xdiag.pipeline.stages.investigate import investigate
from xdiag.pipeline.stages.map_host import map_host
from xdiag.pipeline.stages.register import register
from xdiag.pipeline.stages.render import render
from xdiag.pipeline.stages.tool_runs import aggregate, run_tool
from xdiag.pipeline.topics import (
    MESSAGE_TYPES,
    TOPIC_ALERTS,
    TOPIC_CAPTURES,
    TOPIC_HOST_MAPS,
    TOPIC_INVESTIGATIONS,
    TOPIC_PROFILE_UPLOADS,
    TOPIC_REPORTS,
    TOPIC_STEP_TIMES,
    TOPIC_SWEEPS,
    TOPIC_TOOL_RESULTS,
    TOPIC_TOOL_RUNS,
)

# The stages an analysis of one session never reaches import on their first message: `xdiag analyze` wires every
# topic, and would otherwise load the capture stage, the step-time monitor and the sweeper it does not run.


def capture(message: Alert, deps: Dependencies) -> None:
    from xdiag.capture.stage import capture as stage

    stage(message, deps)


def monitor(message: StepTimes, deps: Dependencies) -> None:
    from xdiag.capture.monitor import monitor as stage

    stage(message, deps)


def sweep(message: SweepRequest, deps: Dependencies) -> None:
    from xdiag.pipeline.sweep import sweep as stage

    stage(message, deps)


_STAGES: dict[str, Callable[[Any, Dependencies], None]] = {
    TOPIC_PROFILE_UPLOADS: register,
    TOPIC_CAPTURES: collect,
    TOPIC_HOST_MAPS: map_host,
    TOPIC_TOOL_RUNS: run_tool,
    TOPIC_TOOL_RESULTS: aggregate,
    TOPIC_INVESTIGATIONS: investigate,
    TOPIC_REPORTS: render,
    TOPIC_ALERTS: capture,
    TOPIC_STEP_TIMES: monitor,
    TOPIC_SWEEPS: sweep,
}

HANDLERS: dict[str, tuple[type, Callable[[Any, Dependencies], None]]] = {
    topic: (MESSAGE_TYPES[topic], stage) for topic, stage in _STAGES.items()
}
"""Topic -> (message type, handler): the wiring every bus adapter uses."""
