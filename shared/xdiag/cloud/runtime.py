"""The stages behind Cloud Functions: configuration, the Google Cloud adapters, and the wrappers that make a
stage a CloudEvent function (decode the event → call the stage → the stage publishes the next message).

Configuration is the environment:

    GOOGLE_CLOUD_PROJECT     the project (default `xdiag-local` against the emulators)
    XDIAG_BUCKET             the profile bucket: gs://BUCKET/<run>/plugins/profile/<session>/<host>.xplane.pb
    XDIAG_QUIET_PERIOD_S     register: a session is complete once no file of it arrived for this long (30)
    XDIAG_MULTI_HOST_QUIET_PERIOD_S  …this long while fewer files are in than the run has hosts (120)
    XDIAG_STAGE_DEADLINE_S   the sweeper repairs an analysis without progress for this long (900)
    XDIAG_MAX_REPAIRS        repairs before the sweeper fails the analysis with the reason (3)
    XDIAG_INVESTIGATION_DEADLINE_S  the whole investigation, follow-up tool calls included (300)
    XDIAG_INVESTIGATOR       the investigator for sessions register announces (rules)
    XDIAG_CACHE_DIR          where profiles are downloaded (a temporary folder); XDIAG_CACHE_GIB its limit (4)
    XDIAG_MAX_PROFILE_GIB    sessions larger than this, all host files together, fail with the reason (2); a
                             many-host session whose hosts are summarised (xdiag.tools.host_summary) is not bound by it
    XDIAG_MAP_HOSTS_FROM     sessions of this many host files or more are decoded one file per map_host invocation
                             (2; 0: never, collect reads them whole)
    XDIAG_MAX_HOST_FILE_GIB  the largest host file one map_host invocation decodes (2)
    XDIAG_MAX_HOSTS          host files one session may have (256)
    XDIAG_CONCURRENCY        deliveries one process works on at once (0: as many as its server threads); 1 for
                             the stages that read a profile, like a Cloud Function instance's default concurrency
    PUBSUB_EMULATOR_HOST, FIRESTORE_EMULATOR_HOST, STORAGE_EMULATOR_HOST   the emulators, where set

Capture, monitor and control plane (`capture`, `monitor`, `control_plane`):

    XDIAG_CAPTURE_COOLDOWN_S        one automatic capture per run inside this window, however many alerts (600)
    XDIAG_CAPTURE_DURATION_MS       an alert's capture, and a request's default (2000)
    XDIAG_CAPTURE_MAX_DURATION_MS   the longest capture a request may ask for (60000: the profiler's own deadline)
    XDIAG_CAPTURE_ATTEMPTS          tracing attempts per target before its session is FAILED (3)
    XDIAG_ALERT_RUN_LABEL           the incident label that names the run (run_id)
    XDIAG_ALLOW_LOOPBACK_TARGETS    1: loopback profiler targets are allowed (the local stack only; 0 in the cloud)
    XDIAG_MONITOR_MARGIN            bad when the window's median step time is this much above the baseline (0.15)
    XDIAG_MONITOR_WARMUP_POINTS     first step times left out of the baseline (5)
    XDIAG_MONITOR_BASELINE_POINTS   step times whose median is the baseline (20)
    XDIAG_MONITOR_WINDOW_S          seconds of steps whose median is judged as one window (10)
    XDIAG_MONITOR_MIN_WINDOW_POINTS fewest steps a window needs to be judged (5)
    XDIAG_MONITOR_CONSECUTIVE_WINDOWS  windows in a row above the margin before the verdict is bad (3)
    XDIAG_CONTROL_PLANE_TOKEN       the control plane's bearer token (basic auth with it as the password works too)
    XDIAG_CONTROL_PLANE_AUTH        `iam`: Cloud Functions IAM checks callers, no token; with neither set, the
                                    control plane refuses every request

What a function does with what goes wrong:
- a poison message (malformed, an unknown session, a missing object: `PoisonMessage`) is published to the
  topic's dead-letter topic with the reason, and acknowledged: no retry could help, and it blocks nothing;
- any other exception is recorded (`failures/{key}`: the last error) and raised, so Pub/Sub redelivers with
  backoff; after the subscription's maximum attempts Pub/Sub itself moves it to the dead-letter topic;
- the `dead_letter` function records every dead letter (`dead_letters/{key}`) with the reason and lets the
  analysis it belonged to finish without it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import logging
import math
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from xdiag.control.plane import MAX_BODY_BYTES, Access
from xdiag.cloud.events import PubSubDelivery, pubsub_delivery, storage_upload
from xdiag.errors import InvalidRequest, PoisonMessage
from xdiag.ids import check_name
from xdiag.handlers import HANDLERS
from xdiag.model import DeadLetter, utc_now
from xdiag.pipeline.deps import Dependencies, SessionLoader
from xdiag.pipeline.runs import CaptureSettings, MonitorSettings
from xdiag.pipeline.topics import ANALYSES, TOPIC_PROFILE_UPLOADS, letter_key
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES

log = logging.getLogger("xdiag.cloud.runtime")

FAILURES = "failures"
DEAD_LETTER_SUFFIX = "-dead-letter"
REASON_ATTRIBUTE = "xdiag_reason"


def dead_letter_topic(topic: str) -> str:
    """Each topic's dead-letter topic: where its poison messages end."""
    return topic + DEAD_LETTER_SUFFIX


def _number(name: str, raw: str | None, default: float) -> Any:
    """The setting `name` (its value `raw`, read where the variable is named) as a number of its default's type:
    finite, not negative; otherwise a ValueError that names the variable and its value (a deployment's typo says
    where it is, not "could not convert string to float")."""
    kind = type(default)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={raw!r}: not a {'whole ' if kind is int else ''}number of 0 or more")
    return value


def _gib(name: str, raw: str | None, default: float) -> int:
    """A size setting given in GiB, in bytes."""
    return int(_number(name, raw, float(default)) * 2**30)


@dataclass
class CloudConfig:
    project: str
    bucket: str
    quiet_period_s: float = 30.0
    multi_host_quiet_period_s: float = 120.0
    stage_deadline_s: float = 900.0
    max_repairs: int = 3
    investigation_deadline_s: float = 300.0
    investigator: str = "rules"
    cache_dir: Path = Path(tempfile.gettempdir()) / "xdiag-cache"
    cache_bytes: int = 4 * 2**30
    max_profile_bytes: int = DEFAULT_MAX_PROFILE_BYTES
    map_hosts_from: int = 2
    max_host_file_bytes: int = 2 * 2**30
    max_hosts: int = 256
    concurrency: int = 0
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CloudConfig:
        env = os.environ if env is None else env
        project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCLOUD_PROJECT")
        if not project and env.get("PUBSUB_EMULATOR_HOST"):
            project = "xdiag-local"
        if not project:
            raise ValueError("set GOOGLE_CLOUD_PROJECT to the project that holds the topics and Firestore")
        bucket = env.get("XDIAG_BUCKET", "").removeprefix("gs://").strip("/")
        if not bucket:
            raise ValueError("set XDIAG_BUCKET to the profile bucket (gs://BUCKET/<run>/plugins/profile/<session>/…)")
        return cls(
            project=project,
            bucket=bucket,
            quiet_period_s=_number("XDIAG_QUIET_PERIOD_S", env.get("XDIAG_QUIET_PERIOD_S"), cls.quiet_period_s),
            multi_host_quiet_period_s=_number("XDIAG_MULTI_HOST_QUIET_PERIOD_S",
                                              env.get("XDIAG_MULTI_HOST_QUIET_PERIOD_S"),
                                              cls.multi_host_quiet_period_s),
            stage_deadline_s=_number("XDIAG_STAGE_DEADLINE_S", env.get("XDIAG_STAGE_DEADLINE_S"), cls.stage_deadline_s),
            max_repairs=_number("XDIAG_MAX_REPAIRS", env.get("XDIAG_MAX_REPAIRS"), cls.max_repairs),
            investigation_deadline_s=_number("XDIAG_INVESTIGATION_DEADLINE_S",
                                             env.get("XDIAG_INVESTIGATION_DEADLINE_S"), cls.investigation_deadline_s),
            investigator=env.get("XDIAG_INVESTIGATOR", cls.investigator),
            cache_dir=Path(env.get("XDIAG_CACHE_DIR") or cls.cache_dir),
            cache_bytes=_gib("XDIAG_CACHE_GIB", env.get("XDIAG_CACHE_GIB"), 4),
            max_profile_bytes=_gib("XDIAG_MAX_PROFILE_GIB", env.get("XDIAG_MAX_PROFILE_GIB"), 2),
            map_hosts_from=_number("XDIAG_MAP_HOSTS_FROM", env.get("XDIAG_MAP_HOSTS_FROM"), cls.map_hosts_from),
            max_host_file_bytes=_gib("XDIAG_MAX_HOST_FILE_GIB", env.get("XDIAG_MAX_HOST_FILE_GIB"), 2),
            max_hosts=_number("XDIAG_MAX_HOSTS", env.get("XDIAG_MAX_HOSTS"), cls.max_hosts),
            concurrency=_number("XDIAG_CONCURRENCY", env.get("XDIAG_CONCURRENCY"), 0),
            capture=CaptureSettings(
                cooldown_s=_number("XDIAG_CAPTURE_COOLDOWN_S",
                                   env.get("XDIAG_CAPTURE_COOLDOWN_S"), CaptureSettings.cooldown_s),
                duration_ms=_number("XDIAG_CAPTURE_DURATION_MS",
                                    env.get("XDIAG_CAPTURE_DURATION_MS"), CaptureSettings.duration_ms),
                max_duration_ms=_number("XDIAG_CAPTURE_MAX_DURATION_MS",
                                        env.get("XDIAG_CAPTURE_MAX_DURATION_MS"), CaptureSettings.max_duration_ms),
                attempts=_number("XDIAG_CAPTURE_ATTEMPTS", env.get("XDIAG_CAPTURE_ATTEMPTS"), CaptureSettings.attempts),
                run_label=env.get("XDIAG_ALERT_RUN_LABEL", CaptureSettings.run_label),
                allow_loopback=env.get("XDIAG_ALLOW_LOOPBACK_TARGETS", "0").lower() in ("1", "true", "yes"),
            ),
            monitor=MonitorSettings(
                margin=_number("XDIAG_MONITOR_MARGIN", env.get("XDIAG_MONITOR_MARGIN"), MonitorSettings.margin),
                warmup_points=_number("XDIAG_MONITOR_WARMUP_POINTS",
                                      env.get("XDIAG_MONITOR_WARMUP_POINTS"), MonitorSettings.warmup_points),
                baseline_points=_number("XDIAG_MONITOR_BASELINE_POINTS",
                                        env.get("XDIAG_MONITOR_BASELINE_POINTS"), MonitorSettings.baseline_points),
                window_s=_number("XDIAG_MONITOR_WINDOW_S", env.get("XDIAG_MONITOR_WINDOW_S"), MonitorSettings.window_s),
                min_window_points=_number("XDIAG_MONITOR_MIN_WINDOW_POINTS",
                                          env.get("XDIAG_MONITOR_MIN_WINDOW_POINTS"),
                                          MonitorSettings.min_window_points),
                consecutive_windows=_number("XDIAG_MONITOR_CONSECUTIVE_WINDOWS",
                                            env.get("XDIAG_MONITOR_CONSECUTIVE_WINDOWS"),
                                            MonitorSettings.consecutive_windows),
            ),
        )

    @property
    def profile_root(self) -> str:
        return f"gs://{self.bucket}"


def firestore_client(project: str):
    from google.cloud import firestore

    return firestore.Client(project=project)


def cloud_dependencies(config: CloudConfig) -> tuple[Dependencies, Callable[[str, bytes, dict[str, str]], Any]]:
    """The stages' dependencies on Pub/Sub, Cloud Storage and Firestore, and a raw publisher for dead letters."""
    from xdiag.capture.profiler import XprofProfiler
    from xdiag.cloud.firestore import FirestoreStateStore
    from xdiag.cloud.gcs import GcsBlobStore, storage_client
    from xdiag.cloud.pubsub import PubSubBus
    from xdiag.investigators.gemini import investigators_from_env
    from xdiag.pipeline.publish_once import PublishOnce

    bus = PubSubBus(config.project)
    blobs = GcsBlobStore(storage_client(config.project), config.cache_dir, config.cache_bytes,
                         max_object_bytes=config.max_profile_bytes)
    state = FirestoreStateStore(firestore_client(config.project))
    deps = Dependencies(
        bus=PublishOnce(bus, state),  # a duplicate delivery publishes nothing twice
        blobs=blobs,
        state=state,
        sessions=SessionLoader(blobs, max_bytes=config.max_profile_bytes, prepare=True,
                               map_hosts_from=config.map_hosts_from),
        on_event=lambda stage, info: log.info("%s %s", stage, info),
        profile_root=config.profile_root,
        quiet_period_s=config.quiet_period_s,
        multi_host_quiet_period_s=config.multi_host_quiet_period_s,
        stage_deadline_s=config.stage_deadline_s,
        max_repairs=config.max_repairs,
        investigation_deadline_s=config.investigation_deadline_s,
        max_hosts=config.max_hosts,
        max_host_file_bytes=config.max_host_file_bytes,
        default_investigator=config.investigator,
        profiler=XprofProfiler(),
        capture=config.capture,
        monitor=config.monitor,
    )
    deps.investigators.update(investigators_from_env())  # Gemini where VERTEX_PROJECT or XDIAG_INVESTIGATOR asks for it
    return deps, bus.publish_raw


class Runtime:
    """What every function of one process shares: the dependencies and the dead-letter publisher."""

    def __init__(
        self, deps: Dependencies, publish_raw: Callable[[str, bytes, dict[str, str]], Any], concurrency: int = 0,
        access: Access | None = None,
    ) -> None:
        self.deps = deps
        self.publish_raw = publish_raw
        self.access = access or Access()  # who may call the control plane (nobody, unless configured)
        # Deliveries beyond the limit wait here, not in the HTTP server: gunicorn with one thread stalls a
        # kept-alive push connection for its keep-alive timeout (2 s) between deliveries.
        self.slots = threading.BoundedSemaphore(concurrency) if concurrency > 0 else contextlib.nullcontext()

    def dead_letter(self, topic: str, data: bytes, attributes: dict[str, str], reason: str) -> None:
        log.warning("dead letter on %s: %s", topic, reason)
        self.publish_raw(dead_letter_topic(topic), data, {**attributes, REASON_ATTRIBUTE: reason[:1000]})

    def record_failure(self, topic: str, data: bytes, error: BaseException) -> None:
        """The last error of a message that will be redelivered: the dead letter's reason if it never succeeds."""
        key = letter_key(topic, data)
        try:
            previous = self.deps.state.get(FAILURES, key) or {}
            self.deps.state.set(
                FAILURES,
                key,
                {
                    "topic": topic,
                    "last_error": f"{type(error).__name__}: {error}"[:1000],
                    "attempts": int(previous.get("attempts", 0)) + 1,
                    "at": utc_now(),
                },
            )
            analysis_id = _analysis_id_of(data)
            if analysis_id and self.deps.state.get(ANALYSES, analysis_id) is not None:  # the analysis says why too
                self.deps.state.update(ANALYSES, analysis_id, {"last_error": {
                    "topic": topic, "error": f"{type(error).__name__}: {error}"[:1000], "at": utc_now()}})
        except Exception:  # the state store may be what failed; the retry matters more than the record
            log.exception("could not record the failure of a message on %s", topic)


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The process's runtime, built from the environment on first use (after gunicorn forks its workers)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
            faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to the log
            config = CloudConfig.from_env()
            _runtime = Runtime(*cloud_dependencies(config), concurrency=config.concurrency,
                               access=Access.from_env(os.environ))
        return _runtime


def use_runtime(value: Runtime | None) -> None:
    """Wires the functions of this process to other dependencies (tests: the embedded adapters)."""
    global _runtime
    with _runtime_lock:
        _runtime = value


def pubsub_stage(topic: str) -> Callable[[Callable[[Any, Dependencies], None]], Callable[[Any], None]]:
    """Makes `stage(message, deps)` a CloudEvent function for messages on `topic`."""
    message_type = HANDLERS[topic][0]
    refuse_bodies_over(MAX_PUSH_BODY_BYTES)

    def wrap(stage: Callable[[Any, Dependencies], None]) -> Callable[[Any], None]:
        @functools.wraps(stage)
        def function(event: Any) -> None:
            started = time.perf_counter()
            current = runtime()
            delivery = _delivery_or_raw(event)
            try:
                try:
                    message = message_type.model_validate_json(delivery.data)
                except ValidationError as exc:
                    raise PoisonMessage(f"malformed {message_type.__name__} message: {_short(exc)}") from None
                with current.slots:
                    running = time.perf_counter()
                    stage(message, current.deps)
                done = time.perf_counter()
                log.info(
                    "%s: message %s handled in %.0f ms (%.0f ms waiting for a slot) %s",
                    topic,
                    delivery.message_id,
                    (done - started) * 1000,
                    (running - started) * 1000,
                    _ids(message),
                )
            except PoisonMessage as exc:
                current.dead_letter(topic, delivery.data, delivery.attributes, str(exc))
            except Exception as exc:
                current.record_failure(topic, delivery.data, exc)
                raise  # Pub/Sub redelivers with backoff

        return function

    return wrap


def storage_stage(stage: Callable[[Any, Dependencies], None]) -> Callable[[Any], None]:
    """Makes `stage(upload, deps)` a CloudEvent function for object-finalize events (any form); other events pass."""
    refuse_bodies_over(MAX_PUSH_BODY_BYTES)

    @functools.wraps(stage)
    def function(event: Any) -> None:
        current = runtime()
        try:
            upload = storage_upload(event)
            if upload is not None:
                with current.slots:
                    stage(upload, current.deps)
        except PoisonMessage as exc:
            delivery = _delivery_or_raw(event)
            current.dead_letter(TOPIC_PROFILE_UPLOADS, delivery.data, delivery.attributes, str(exc))
        except Exception as exc:
            current.record_failure(TOPIC_PROFILE_UPLOADS, _delivery_or_raw(event).data, exc)
            raise

    return function


MAX_LETTER_ATTRIBUTES, MAX_ATTRIBUTE_CHARS = 32, 1024
MAX_PUSH_BODY_BYTES = 14 * 2**20  # a Pub/Sub message is at most 10 MB, pushed base64-encoded in a JSON envelope


def refuse_bodies_over(max_bytes: int) -> None:
    """A request body over `max_bytes` is answered 413 at the door, before it is read, and its connection closed off
    the server's event loop (xdiag.cloud.body_limit): a client holding one open stalls nobody. functions-framework
    imports a function's source inside its Flask app's context, so the decorators below set the app's limit (the
    largest, where one app serves several functions)."""
    import flask

    from xdiag.cloud.body_limit import BodyLimit, release_refused_connections

    if flask.has_app_context():
        app = flask.current_app
        if isinstance(app.wsgi_app, BodyLimit):
            app.wsgi_app.max_bytes = max(app.wsgi_app.max_bytes, max_bytes)
        else:
            app.wsgi_app = BodyLimit(app.wsgi_app, max_bytes)
        release_refused_connections()



def dead_letter_stage(stage: Callable[[DeadLetter, Dependencies], None]) -> Callable[[Any], None]:
    """Makes `stage(letter, deps)` a CloudEvent function for the dead-letter topics (`<topic>-dead-letter`).

    A letter it cannot record is logged (its size and first bytes: the last resort) and raised, so it is retried
    up to the dead-letter subscription's own attempt limit, then parked on `dead-letters-unrecorded`."""
    refuse_bodies_over(MAX_PUSH_BODY_BYTES)

    @functools.wraps(stage)
    def function(event: Any) -> None:
        current = runtime()
        delivery = _delivery_or_raw(event)
        try:
            source = (
                delivery.topic.removesuffix(DEAD_LETTER_SUFFIX)
                if delivery.topic.endswith(DEAD_LETTER_SUFFIX) and delivery.topic.removesuffix(DEAD_LETTER_SUFFIX) in HANDLERS
                else "unknown"
            )
            reason = delivery.attributes.get(REASON_ATTRIBUTE)
            if not reason:  # moved here by Pub/Sub after its last attempt: the last recorded error says why
                failure = current.deps.state.get(FAILURES, letter_key(source, delivery.data)) or {}
                attempts = delivery.attributes.get("CloudPubSubDeadLetterSourceDeliveryCount") or failure.get(
                    "attempts", "?"
                )
                reason = f"failed {attempts} delivery attempts; last error: {failure.get('last_error', 'not recorded')}"
            attributes = {k[:MAX_ATTRIBUTE_CHARS]: v[:MAX_ATTRIBUTE_CHARS]
                          for k, v in list(delivery.attributes.items())[:MAX_LETTER_ATTRIBUTES] if k != REASON_ATTRIBUTE}
            letter = DeadLetter(
                source_topic=source,
                data=delivery.data.decode("utf-8", errors="replace"),
                attributes=attributes,
                reason=reason[:2000],
                message_id=delivery.message_id[:200],
            )
            stage(letter, current.deps)
            log.info("%s: message %s handled (recorded as dead letter %s)", delivery.topic, delivery.message_id,
                     letter_key(source, delivery.data))
        except Exception as exc:
            log.error("dead letter on %s NOT recorded (%s: %s): %d bytes, attributes %s, beginning %r", delivery.topic,
                      type(exc).__name__, str(exc)[:500], len(delivery.data), dict(list(delivery.attributes.items())[:8]),
                      delivery.data[:2000])
            raise

    return function


def http_handler(
    handle: Callable[[Dependencies, Access, str, str, dict[str, str], dict[str, str], bytes], Any],
) -> Callable[[Any], Any]:
    """Makes `handle(deps, access, method, path, query, headers, body) -> Reply` an HTTP function (a flask request
    in, a JSON response out)."""
    refuse_bodies_over(MAX_BODY_BYTES)  # the control plane's own limit, at the door

    @functools.wraps(handle)
    def function(request: Any) -> Any:
        current = runtime()
        reply = handle(current.deps, current.access, request.method, request.path, dict(request.args),
                       dict(request.headers), request.get_data(cache=False))
        if reply.status >= 500:
            log.warning("%s %s: %s %s", request.method, request.path, reply.status, reply.body)
        if isinstance(reply.body, bytes):  # an object served as it is (the local link endpoint)
            return reply.body, reply.status, {"Content-Type": reply.content_type}
        return json.dumps(reply.body, default=str), reply.status, {"Content-Type": "application/json"}

    return function


def _delivery_or_raw(event: Any) -> PubSubDelivery:
    """The Pub/Sub message of the event, or (for any other event) the event's data as the message bytes."""
    try:
        return pubsub_delivery(event)
    except PoisonMessage:
        data = event.data
        raw = data if isinstance(data, bytes) else str(data).encode() if isinstance(data, str) else _json_bytes(data)
        return PubSubDelivery(topic="", data=raw, attributes={"ce_type": str(event["type"])})


def _analysis_id_of(data: bytes) -> str | None:
    """The valid analysis id a message names, if any."""
    try:
        value = json.loads(data)
        analysis_id = value.get("analysis_id") if isinstance(value, dict) else None
        return check_name(analysis_id, "analysis id") if isinstance(analysis_id, str) else None
    except (ValueError, InvalidRequest):
        return None


def _ids(message: Any) -> str:
    """The ids a message carries, for the log line that says it was handled."""
    fields = ("analysis_id", "tool", "run_id", "session_id", "attempt")
    return " ".join(f"{k}={getattr(message, k)}" for k in fields if getattr(message, k, None) not in (None, "", 0))


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


def _short(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ())) or "message"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', str(exc))}{more}"
