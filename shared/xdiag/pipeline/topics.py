"""The pipeline's names: its Pub/Sub topics, the message type each carries, and its state collections."""

from __future__ import annotations

import hashlib

from xdiag.model import (
    Alert,
    CaptureReady,
    HostMapRun,
    InvestigationReady,
    Message,
    ProfileUploaded,
    ReportReady,
    StepTimes,
    SweepRequest,
    ToolDone,
    ToolRun,
)
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import RUNS

TOPIC_CAPTURES = "captures"
TOPIC_HOST_MAPS = "host-maps"  # one message per host file of a many-host session: its map stage
TOPIC_TOOL_RUNS = "tool-runs"
TOPIC_TOOL_RESULTS = "tool-results"
TOPIC_INVESTIGATIONS = "investigations"
TOPIC_REPORTS = "reports"
TOPIC_PROFILE_UPLOADS = "profile-uploads"
TOPIC_ALERTS = "alerts"  # capture requests: incidents, monitor verdicts, manual and snapshot requests
TOPIC_STEP_TIMES = "step-times"  # step times workloads report, for the monitor
TOPIC_SWEEPS = "sweeps"  # the sweeper's tick: Cloud Scheduler in the cloud, a timer in the local stack

ANALYSES = "analyses"
CLAIMS = "claims"
DEAD_LETTERS = "dead_letters"
ACTIVE_ANALYSES = "active_analyses"  # one document per analysis not yet DONE, FAILED or SUPERSEDED: the sweeper's list

ACTIVE = ("PENDING", "MAPPING_HOSTS", "RUNNING_TOOLS", "INVESTIGATING", "RENDERING")
TERMINAL = ("DONE", "FAILED", "SUPERSEDED")


def sessions_collection(run_id: str) -> str:
    return f"{RUNS}/{state_key(run_id)}/sessions"


def files_collection(run_id: str, session_id: str) -> str:
    return f"{sessions_collection(run_id)}/{state_key(session_id)}/files"


def letter_key(topic: str, data: bytes | str) -> str:
    """One id per (topic, message bytes): a poison message delivered twice is one dead letter."""
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(topic.encode() + b"\n" + raw).hexdigest()[:24]


def tools_collection(analysis_id: str) -> str:
    return f"{ANALYSES}/{analysis_id}/tools"


def host_maps_collection(analysis_id: str) -> str:
    """One document per host file the map stage decoded for the analysis (keyed by the file's version)."""
    return f"{ANALYSES}/{analysis_id}/host_maps"


MESSAGE_TYPES: dict[str, type[Message]] = {
    TOPIC_PROFILE_UPLOADS: ProfileUploaded,
    TOPIC_CAPTURES: CaptureReady,
    TOPIC_HOST_MAPS: HostMapRun,
    TOPIC_TOOL_RUNS: ToolRun,
    TOPIC_TOOL_RESULTS: ToolDone,
    TOPIC_INVESTIGATIONS: InvestigationReady,
    TOPIC_REPORTS: ReportReady,
    TOPIC_ALERTS: Alert,
    TOPIC_STEP_TIMES: StepTimes,
    TOPIC_SWEEPS: SweepRequest,
}
"""Topic -> the message type it carries (xdiag.handlers maps each topic to its stage)."""
