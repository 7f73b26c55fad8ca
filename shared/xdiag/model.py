"""Typed records and messages of the pipeline: JSON on the wire, versioned.

Every message carries the ids that make a redelivery harmless (`analysis_id`, `tool`):
each stage's writes are keyed by them, so running a handler twice changes nothing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from xdiag.ids import AnalysisId, InvestigatorName, RunId, SessionId, ToolName

SCHEMA_VERSION = 1


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Status(str, Enum):
    OPTIMAL = "OPTIMAL"
    NEEDS_ATTENTION = "NEEDS_ATTENTION"
    FAILED = "FAILED"


class ToolStatus(str, Enum):
    OK = "ok"
    NOT_AVAILABLE = "not_available"
    FAILED = "failed"


class Message(BaseModel):
    """Every id a message carries is checked against one grammar (`xdiag.ids`): a message whose id could name
    another document or folder is malformed, refused with the reason, and handled by nobody."""

    model_config = ConfigDict(extra="forbid")
    version: int = SCHEMA_VERSION
    attempt: int = Field(default=0, ge=0, le=1000)  # the sweeper's repair number: a repair is a new message


class CaptureReady(Message):
    """A session's files are in the blob store: analyse them (topic `captures`).

    A manual request may name only `run_id` and `session_id`: collect then finds the session's files
    in the bucket, derives the analysis id from their versions and puts the output beside them.
    """

    analysis_id: AnalysisId | None = None
    run_id: RunId
    session_id: SessionId
    profile_uris: list[str] = Field(default_factory=list, max_length=1024)
    output_uri: str | None = None  # in the cloud, derived from run and session: a message naming another is refused
    investigator: InvestigatorName = "rules"
    hosts_mapped: bool = False  # the map stage's fan-in: every host file of the analysis is decoded (map_host)


class HostMapRun(Message):
    """Decode one host file of an analysis' session into its prepared columns (topic `host-maps`): the map stage of a
    many-host session, one invocation per file version."""

    analysis_id: AnalysisId
    uri: str = Field(max_length=2048)
    generation: str = Field(default="", max_length=64)


class ToolRun(Message):
    """Run one tool over one session (topic `tool-runs`)."""

    analysis_id: AnalysisId
    tool: ToolName
    args: dict[str, Any] = Field(default_factory=dict)


class ToolDone(Message):
    """One tool's result is stored (topic `tool-results`)."""

    analysis_id: AnalysisId
    tool: ToolName


class InvestigationReady(Message):
    """All broad tools are in (topic `investigations`)."""

    analysis_id: AnalysisId


class ReportReady(Message):
    """The diagnosis is stored: render it (topic `reports`)."""

    analysis_id: AnalysisId


class SweepRequest(Message):
    """Look for analyses past their deadline and repair or fail them (topic `sweeps`: Cloud Scheduler, or the local
    stack's timer). Carries nothing: the sweeper reads the state."""


class ProfileUploaded(Message):
    """An object was written to the bucket (topic `profile-uploads`, from its object-finalize notification)."""

    uri: str  # gs://BUCKET/NAME
    generation: str = ""
    size: int = 0


class DeadLetter(Message):
    """A message that ended on a dead-letter topic, with why (a dead-letter topic's subscriber receives it)."""

    source_topic: str
    data: str  # the message's bytes as text (undecodable bytes replaced)
    attributes: dict[str, str] = Field(default_factory=dict)
    reason: str
    message_id: str = ""


class ToolResult(BaseModel):
    """What one tool said about one session: a compact summary and the full detail."""

    tool: str
    status: ToolStatus
    summary: dict[str, Any] = Field(default_factory=dict)
    detail: dict[str, Any] = Field(default_factory=dict)
    reason: str | None = None  # why not available / why it failed
    source: str = ""  # which analysis produced it (xdiag host-plane analysis, XProf converter …)
    args: dict[str, Any] = Field(default_factory=dict)
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == ToolStatus.OK


class Evidence(BaseModel):
    """One quoted fact: a number or op name and the tool output it came from."""

    tool: str
    metric: str
    value: Any
    note: str = ""
    verified: bool = True  # False when a number here appears in no tool output (model-written evidence)


class SourceLine(BaseModel):
    """A line of the user's program that holds some of a finding's op time, from the ops' HLO Python stacks."""

    line: str  # "examples/train.py:33"; the library's line where no frame of the user's code is recorded
    function: str = ""
    library: str = ""  # the library frame that emitted the op (a Pallas kernel's own file:line), where one did
    share_percent: float  # of all op time
    ops: list[str] = Field(default_factory=list)  # the cited ops it holds
    fused_lines: list[str] = Field(default_factory=list)  # other user lines those ops fuse (a widening astype's)
    host_ms: float | None = None  # a host-side line (a Python frame): the host time it holds; share_percent is then
    # of the profiled steps' time
    code: str = ""  # the line's code, where the analysis' line view read it (its file at hand, the version profiled)
    computes: str = ""  # what its busiest cited op computes, from the op profile: "gather: f32[1024,2520] → ..."


class Finding(BaseModel):
    priority: Literal["P0", "P1", "P2"]
    key: str  # stable identifier of the kind of problem, e.g. "input_bound"
    title: str
    whats_happening: str
    evidence: list[Evidence]
    expected_impact: str
    fix: str
    verified: bool = True  # False when a number in the evidence appears in no tool output
    source_lines: list[SourceLine] = Field(default_factory=list)  # the 1-3 lines holding the time of the ops it cites
    _staked_ops: frozenset[str] = PrivateAttr(default_factory=frozenset)  # op names its rule staked (not stored)
    _host_lines: list[SourceLine] = PrivateAttr(default_factory=list)  # a host finding's Python frames (not stored)
    _no_host_line: str = PrivateAttr(default="")  # why a host finding names no line, where it names none


class FollowUpCall(BaseModel):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    hypothesis: str = ""
    status: ToolStatus = ToolStatus.OK
    reason: str | None = None


class ModelCall(BaseModel):
    """One request to a hosted model: what it cost and how long it took."""

    phase: Literal["investigate", "answer"]
    attempt: int = 1  # 2+ are retries after 429/5xx or a transport error
    latency_ms: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0  # candidates
    thoughts_tokens: int = 0
    total_tokens: int = 0
    error: str | None = None


class GroundingCheck(BaseModel):
    """A model-written finding whose evidence did not check out against the tool outputs."""

    finding: str
    action: Literal["unverified", "dropped"]
    reasons: list[str] = Field(default_factory=list)


class InvestigatorAudit(BaseModel):
    """Cost and audit record of a model-backed investigation (Gemini on Vertex AI)."""

    model: str
    location: str = ""
    prompt_version: str = ""
    model_calls: int = 0  # requests sent, retries included
    retries: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    thoughts_tokens: int = 0
    total_tokens: int = 0
    latency_ms: float = 0.0  # time spent waiting for the model, all calls together
    tool_calls: list[FollowUpCall] = Field(default_factory=list)  # every call the model asked for, refused ones too
    calls: list[ModelCall] = Field(default_factory=list)
    grounding: list[GroundingCheck] = Field(default_factory=list)
    fallback_reason: str | None = None  # why the rule engine's diagnosis was used instead


class Diagnosis(BaseModel):
    """What an investigator concluded."""

    status: Status
    summary: str
    findings: list[Finding] = Field(default_factory=list)
    hypotheses: list[str] = Field(default_factory=list)
    follow_up_calls: list[FollowUpCall] = Field(default_factory=list)
    investigator: str = "rules"
    investigator_note: str = ""  # e.g. why Gemini was not used
    audit: InvestigatorAudit | None = None  # cost and audit of a model-backed investigation (absent for rules)


class Analysis(BaseModel):
    """The state of one analysis of one session; `analysis.json` on disk."""

    version: int = SCHEMA_VERSION
    analysis_id: str
    run_id: str
    session_id: str
    profile_uris: list[str]
    output_uri: str  # the session's analysis folder: its current summary.html and analysis.json
    status: Literal["PENDING", "MAPPING_HOSTS", "RUNNING_TOOLS", "INVESTIGATING", "RENDERING", "DONE", "FAILED", "SUPERSEDED"] = "PENDING"
    result: Status | None = None
    failure_reason: str | None = None
    inputs: list[dict[str, Any]] = Field(default_factory=list)  # [{uri, generation, size}]: exactly what is analysed
    work_uri: str = ""  # this analysis' own files (tools/, follow-ups, its report); "" → output_uri
    superseded_by: str | None = None  # a newer analysis of the session's changed files
    repairs: int = 0  # how often the sweeper re-published a lost stage
    last_repair: dict[str, Any] | None = None  # the sweeper's last repair: when, in which status, what was missing
    last_error: dict[str, Any] | None = None  # the last error a stage raised on it (then retried): topic, error, when
    profile: dict[str, Any] = Field(default_factory=dict)  # platform, hosts, devices, size, events
    health: dict[str, Any] = Field(default_factory=dict)  # investigators.health.HealthSnapshot.as_dict()
    diagnosis: Diagnosis | None = None
    tools: dict[str, dict[str, Any]] = Field(default_factory=dict)  # tool -> {status, reason, duration_ms}
    timings_ms: dict[str, float] = Field(default_factory=dict)
    timeline: dict[str, str] = Field(default_factory=dict)  # stage -> when it finished (UTC, ISO 8601)
    report_uri: str | None = None
    # the session it was compared with (xdiag.pipeline.previous): run_id, session_id, analysis_id, role ("previous
    # session" or, for an automatic capture, "last healthy session"), verdict, since (one line), diff_uri
    baseline: dict[str, Any] | None = None
    investigator: str = "rules"
    created_at: str = Field(default_factory=utc_now)
    updated_at: str = Field(default_factory=utc_now)


class Alert(Message):
    """A message on `alerts`, whatever form it came in, in one shape (`source` says which form):

    - `incident`: Cloud Monitoring's Pub/Sub notification (incident JSON, schema version 1.2); the run is named by a
      label (`run_id` by default) in the metric, resource, metadata or policy labels; `state: closed` does nothing;
    - `verdict`: a workload monitor's `{"run_id": …, "verdict": "bad", …}` (other verdicts do nothing);
    - `manual`: `{"run_id": …, "duration_ms": …, "hosts": […], "host_tracer_level": …, "session_id": …}`;
    - `snapshot`: `{"run_id": …, "action": "snapshot", "session_id": …, "hosts": […]}` (the control plane's).

    `hosts` are names of registered targets, never addresses.
    """

    source: Literal["incident", "verdict", "manual", "snapshot"]
    run_id: str | None = None
    session_id: str | None = None
    hosts: list[Any] | None = None
    duration_ms: int | None = None
    host_tracer_level: int | None = None
    device_tracer_level: int | None = None
    python_tracer_level: int | None = None
    incident_id: str = ""
    incident_state: str = ""  # open | closed
    verdict: str = ""
    summary: str = ""
    labels: dict[str, str] = Field(default_factory=dict)  # an incident's labels, merged
    detail: dict[str, Any] = Field(default_factory=dict)  # what else a verdict said

    @model_validator(mode="before")
    @classmethod
    def _one_shape(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "source" in data:
            return data
        if isinstance(data.get("incident"), dict):
            return _from_incident(data["incident"])
        if "verdict" in data:
            known = {"run_id", "verdict", "summary", "version"}
            return {"source": "verdict", "run_id": data.get("run_id"), "verdict": str(data.get("verdict")),
                    "summary": str(data.get("summary") or ""), "detail": {k: v for k, v in data.items() if k not in known}}
        if data.get("action") == "snapshot":
            return {"source": "snapshot", **{k: v for k, v in data.items() if k != "action"}}
        return {"source": "manual", **data}


def _from_incident(incident: dict[str, Any]) -> dict[str, Any]:
    labels: dict[str, str] = {}
    metadata = incident.get("metadata") if isinstance(incident.get("metadata"), dict) else {}
    for group in (
        metadata.get("system_labels"),
        incident.get("policy_user_labels"),
        metadata.get("user_labels"),
        (incident.get("resource") or {}).get("labels") if isinstance(incident.get("resource"), dict) else None,
        (incident.get("metric") or {}).get("labels") if isinstance(incident.get("metric"), dict) else None,
    ):  # later groups win: the metric's own labels name the run most precisely
        if isinstance(group, dict):
            labels.update({str(k): str(v) for k, v in group.items() if not isinstance(v, (dict, list))})
    return {
        "source": "incident",
        "incident_id": str(incident.get("incident_id") or ""),
        "incident_state": str(incident.get("state") or "").lower(),
        "summary": str(incident.get("summary") or incident.get("policy_name") or "")[:1000],
        "labels": labels,
    }


class StepPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=0)
    step_time_ms: float = Field(gt=0, le=86_400_000)
    at: float = Field(default=0.0, ge=0)  # when the step ended (epoch seconds, the workload's clock)


class StepTimes(Message):
    """Step times a workload reported (topic `step-times`): the monitor's input."""

    run_id: RunId
    target: str = Field(default="", max_length=128)
    points: list[StepPoint]
