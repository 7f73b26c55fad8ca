"""What the local stack runs and where it keeps its state: the functions and the topics they are pushed, the settings
a stack starts with, the state dir's layout; and the environment a client of a running stack reads from its state file.

`xdiag.cloud.localstack` starts and stops the stack from these; the CLI reads only this module to reach a stack
that is up."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from xdiag.cloud.runtime import dead_letter_topic
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

HOST = "127.0.0.1"
PIPELINE_TOPICS = list(MESSAGE_TYPES)  # every topic a stage consumes, each with its dead-letter topic
UNRECORDED_TOPIC = "dead-letters-unrecorded"  # a letter even dead_letter could not record, kept for a person
DEFAULT_STATE_DIR = Path(".xdiag-stack")
STATE_FILE = "stack.json"
EMULATOR_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The emulators' JVMs compile with C1 only and collect with one thread: over a stack's life (minutes, a few thousand
requests) C2's compilations cost more CPU than they give back. The Firestore emulator's CPU per request fell from 7.6
to 2.0 ms after 300 requests, and from 3.0 to 1.9 ms after 2,000 (bench/README.md, "Measured design choices").
A JAVA_TOOL_OPTIONS of the caller's comes after these, so it wins."""
TEMPORARY_DIR = "tmp"  # under the state dir: each function's TMPDIR, removed by stop()
DATA_DIR = "data"  # under the state dir: what outlives the stack (the bucket's files, Firestore's exports)
FIRESTORE_EXPORTS = "firestore-exports"  # under the data dir: the newest export of Firestore's documents
FIRESTORE_EXPORT_STAGING = "firestore-export-staging"  # under the data dir: the export being written, until complete
FIRESTORE_EXPORT_LOCK = "firestore-export.lock"  # under the data dir: held (flock) by the one export at a time
FIRESTORE_EXPORT_INTERVAL_S = 10.0  # at most one export per this long (and per timer tick): each costs the emulator CPU
FIRESTORE_EXPORT_TIMEOUT_S = 120.0  # an export's answer waited for this long (16 MB of documents: under 1 s)


class StackError(RuntimeError):
    """The stack cannot start or stop; the message says what to do."""


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    topics: tuple[str, ...]
    concurrency: int = 0  # deliveries one process works on at once (0: one per server thread)
    workers: int = 1  # processes (instances)
    threads: int = 4  # server threads per process; never 1 (gunicorn then stalls kept-alive pushes for 2 s)
    signature: str = "cloudevent"  # or "http" (the control plane)


FUNCTIONS = (
    FunctionSpec("register", (TOPIC_PROFILE_UPLOADS,), threads=16),  # deliveries wait out the quiet period
    FunctionSpec("collect", (TOPIC_CAPTURES,), concurrency=1),  # the stages that read a profile: one at a time
    # A many-host session's map stage: each instance decodes one host file at a time (its peak is that host's), two
    # instances on two cores (the cloud runs up to max_instances of them).
    FunctionSpec("map_host", (TOPIC_HOST_MAPS,), concurrency=1, workers=2),
    # Three instances of one delivery each (the cloud runs up to 30): a tool run is mostly round trips to the
    # emulators, so a third process shortens the fan-out (bench/cloud_bench.py: 1.05 -> 0.85 s) on two cores.
    FunctionSpec("run_tool", (TOPIC_TOOL_RUNS,), concurrency=1, workers=3),
    FunctionSpec("aggregate", (TOPIC_TOOL_RESULTS,)),
    FunctionSpec("investigate", (TOPIC_INVESTIGATIONS,), concurrency=1),
    FunctionSpec("render", (TOPIC_REPORTS,)),
    FunctionSpec("dead_letter", tuple(dead_letter_topic(t) for t in PIPELINE_TOPICS)),
    FunctionSpec("capture", (TOPIC_ALERTS,), threads=16),  # a capture holds its delivery for its duration
    FunctionSpec("monitor", (TOPIC_STEP_TIMES,), concurrency=1),  # one delivery at a time per run's document
    FunctionSpec("sweep", (TOPIC_SWEEPS,), concurrency=1),  # the timer's ticks: one sweep at a time
    FunctionSpec("control_plane", (), threads=8, signature="http"),
)
EMULATORS = ("pubsub", "firestore", "storage")  # the services that hold the stack's state (the others write to them)
SERVICE_ORDER = (*EMULATORS, *(spec.name for spec in FUNCTIONS), "timer")
"""The order services (re)start in: fake-gcs-server publishes on a Pub/Sub topic, which must exist first."""


@dataclass
class StackSettings:
    project: str = "xdiag-local"
    bucket: str = "xdiag-profiles"
    quiet_period_s: float = 3.0
    multi_host_quiet_period_s: float = 10.0  # while fewer files are in than the run has hosts
    stage_deadline_s: float = 90.0  # an analysis without progress this long is repaired …
    max_repairs: int = 2  # … twice, then FAILED: a lost stage is repaired within ~2 minutes, or flagged within ~5
    sweep_interval_s: float = 20.0  # the timer that ticks the sweeper (Cloud Scheduler's job in the cloud)
    max_delivery_attempts: int = 5  # Pub/Sub's minimum
    min_backoff_s: float = 1.0
    max_backoff_s: float = 10.0
    functions_dir: str = str(Path(__file__).resolve().parents[3] / "functions")
    capture_cooldown_s: float = 60.0
    # "filesystem": the bucket outlives the stack (data/storage/), but holds no object name with a path segment over
    # 255 bytes (a file name there; Cloud Storage takes them); "memory": any name, lost with the emulator
    storage_backend: str = "filesystem"
    token: str = ""  # the control plane's bearer token (a fresh one per start)


def load_stack_env(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, str]:
    """Puts the environment of the stack in `state_dir` into os.environ where the variables are unset."""
    path = Path(state_dir) / STATE_FILE
    if not path.exists():
        return {}
    env = json.loads(path.read_text()).get("env", {})
    for key, value in env.items():
        os.environ.setdefault(key, value)
    return env

