"""The control plane (HTTP function `control_plane`): the run registry, over the state store.

The ML Diagnostics SDK's self-hosted contract (`machinelearning_run(..., base_url=URL)`):

    PATCH /v1/machineLearningRuns?update_mask=…&allow_missing=true        create (upsert; the id is `logicalId`)
    PATCH /v1/machineLearningRuns/{id}?update_mask=…&allow_missing=false  partial update by mask; unknown id → 404
    GET   /v1/machineLearningRuns/{id}

Fields as the SDK sends them (`logicalId`, `displayName`, `creator`, `clusterId`, `workload.workloadId`,
`workload.displayName`, `workload.state`, `baseBlobPath`, `labels`); `update_mask` names them in snake case
(`workload.state`), `*` or none means every field the body has. The answer is the stored run, named
`machineLearningRuns/{id}`.

xdiag's own endpoints (JSON in and out):

    GET    /v1/runs                                 runs
    GET    /v1/runs/{run}                           one run (targets, continuous profiling, last capture)
    GET    /v1/runs/{run}/targets                   profiler targets
    POST   /v1/runs/{run}/targets                   {"name", "host", "port"}: register one (what xdiag.sdk.workload does)
    DELETE /v1/runs/{run}/targets/{name}
    GET    /v1/runs/{run}/sessions                  sessions (kind, status, analysis, report, baseline)
    GET    /v1/runs/{run}/sessions/{session}
    GET    /v1/runs/{run}/analyses
    POST   /v1/runs/{run}/sessions/{session}:share  {"expires_s"} → a V4 signed link to the report (xdiag.sharing.links)
    PUT    /v1/runs/{run}/readers                   {"readers": [principals]}: who may read the run ([]: every caller)
    GET    /v1/events[?run=R], /v1/events/{id}      monitored events (xdiag.capture.monitored_events)
    GET    /v1/links/<bucket>/<object>?X-Goog-…     the local stack's link endpoint (no token: the signature is it)
    POST   /v1/runs/{run}/captures                  {"duration_ms", "hosts", "host_tracer_level", …} → 202, on `alerts`
    POST   /v1/runs/{run}/continuous:start          {"hosts", "device_tracer_level"}
    POST   /v1/runs/{run}/continuous:stop           {"hosts"}
    POST   /v1/runs/{run}/continuous:snapshot       {"name", "hosts"} → 202, on `alerts`
    POST   /v1/runs/{run}/steps                     {"target", "points": [{"step", "step_time_ms", "at"}]} → `step-times`

Every id, address, duration and tracer level is checked before anything is stored or published; a bad request
gets a 4xx with the reason (`{"error": {"code", "status", "message"}}`). Ids are single path segments of a
limited alphabet, so none escapes its document or its folder; a run's folder is inside xdiag's bucket.

Access: with `XDIAG_CONTROL_PLANE_TOKEN` set, every request carries `Authorization: Bearer TOKEN` (or HTTP basic
auth with the token as the password: the SDK sends that for `base_url=http://xdiag:TOKEN@HOST:PORT`). With
`XDIAG_CONTROL_PLANE_AUTH=iam` Cloud Functions IAM lets invokers in and every request's ID token is verified here
(xdiag.identity). With neither, every request is refused: the control plane is never open by accident.
A run is read (and captured, and changed) only by its owners, its readers and the administrators.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from xdiag.sharing import routes as sharing_routes
from xdiag.identity import Identity, Unauthenticated, Who
from xdiag.sharing.links import ShareRefused
from xdiag.capture.stage import new_session_id, set_continuous
from xdiag.model import Alert, StepTimes, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import state_key
from xdiag.errors import InvalidRequest
from xdiag.ids import check_name, check_run_id
from xdiag.pipeline.runs import (
    KIND_ON_DEMAND,
    KIND_SNAPSHOT,
    RUNS,
    check_address,
    check_duration_ms,
    check_hosts,
    check_prefix,
    check_tracer_levels,
    get_run,
    list_targets,
    targets_collection,
)
from xdiag.pipeline.topics import ANALYSES, TOPIC_ALERTS, TOPIC_STEP_TIMES, sessions_collection

MAX_BODY_BYTES = 64 * 1024
MAX_TARGETS = 1024
MAX_POINTS = 1000
RUN_PREFIX = "machineLearningRuns/"
WORKLOAD_STATES = {"STATE_UNSPECIFIED", "STATE_PENDING", "STATE_RUNNING", "STATE_SUCCEEDED", "STATE_FAILED",
                   "STATE_CANCELLED"}
# update_mask path -> the field's place in the JSON resource
MASK_FIELDS = {
    "logical_id": ("logicalId",),
    "display_name": ("displayName",),
    "creator": ("creator",),
    "cluster_id": ("clusterId",),
    "base_blob_path": ("baseBlobPath",),
    "labels": ("labels",),
    "workload.workload_id": ("workload", "workloadId"),
    "workload.display_name": ("workload", "displayName"),
    "workload.state": ("workload", "state"),
}
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,512}")


@dataclass(frozen=True)
class Access:
    """Who may call: a shared token, verified ID tokens behind IAM, or (neither) nobody; and who the caller is."""

    token: str | None = None
    iam: bool = False
    identity: Identity | None = None  # None: Identity.from_env({}, iam)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Access:
        iam = env.get("XDIAG_CONTROL_PLANE_AUTH", "").lower() == "iam"
        return cls(token=env.get("XDIAG_CONTROL_PLANE_TOKEN") or None, iam=iam, identity=Identity.from_env(env, iam))

    def who(self, headers: Mapping[str, str]) -> Who:
        identity = self.identity or Identity.from_env({}, self.iam)
        return Who(identity, identity.caller(headers))


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | bytes  # bytes: an object served as it is (the local link endpoint)
    content_type: str = "application/json"


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                405: "METHOD_NOT_ALLOWED", 409: "ALREADY_EXISTS", 410: "EXPIRED", 413: "INVALID_ARGUMENT",
                502: "UNAVAILABLE", 503: "UNAVAILABLE"}


def _error(status: int, message: str) -> Reply:
    return Reply(status, {"error": {"code": status, "status": STATUS_NAMES.get(status, "UNKNOWN"), "message": message}})


def handle(
    deps: Dependencies, access: Access, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str],
    body: bytes,
) -> Reply:
    """One request → one reply; never raises for a bad request."""
    try:
        if method == "GET" and path.startswith(sharing_routes.LINKS_PREFIX):  # its signature is the credential
            status, content = sharing_routes.serve_link(deps, path, query)
            return Reply(status, content, "text/html; charset=utf-8")
    except ShareRefused as exc:
        return _error(exc.status, str(exc))
    denied = _check_access(access, headers)
    if denied:
        return denied
    try:
        who = access.who(headers)
    except Unauthenticated as exc:
        return _error(401, str(exc))
    try:
        if len(body) > MAX_BODY_BYTES:
            raise RequestError(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        parsed = _json(body) if method in ("PATCH", "POST", "PUT") else {}
        answered = sharing_routes.route(deps, who, method, path, query, parsed)
        if answered is not None:
            return Reply(*answered)
        route, args = _route(method, path)
        return route(deps, args, query, parsed, who)
    except ShareRefused as exc:
        return _error(exc.status, str(exc))
    except RequestError as exc:
        return _error(exc.status, str(exc))
    except InvalidRequest as exc:
        return _error(400, str(exc))
    except LookupError as exc:
        return _error(404, str(exc).strip("'\""))


def _check_access(access: Access, headers: Mapping[str, str]) -> Reply | None:
    if access.iam:
        return None
    if not access.token:
        return _error(503, "the control plane has no access control configured: set XDIAG_CONTROL_PLANE_TOKEN, or "
                           "XDIAG_CONTROL_PLANE_AUTH=iam behind Cloud Functions IAM")
    scheme, _, credential = (headers.get("Authorization") or headers.get("authorization") or "").partition(" ")
    given = credential.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            given = ""
    elif scheme.lower() != "bearer":
        given = ""
    if not given or not hmac.compare_digest(given.encode(), access.token.encode()):
        return _error(401, "missing or wrong credentials: send Authorization: Bearer <XDIAG_CONTROL_PLANE_TOKEN>")
    return None


def _json(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise RequestError(400, "the body must be a JSON object")
    return value


def _route(method: str, path: str):
    parts = path.strip("/").split("/")
    if len(parts) < 2 or parts[0] != "v1" or any(p in ("", ".", "..") for p in parts):
        raise RequestError(404, f"no endpoint {method} {path}")
    rest = parts[1:]
    table = {
        ("PATCH", "machineLearningRuns"): _patch_run,
        ("PATCH", "machineLearningRuns", "*"): _patch_run,
        ("GET", "machineLearningRuns", "*"): _get_sdk_run,
        ("GET", "runs"): _list_runs,
        ("GET", "runs", "*"): _get_run,
        ("GET", "runs", "*", "targets"): _list_targets,
        ("POST", "runs", "*", "targets"): _add_target,
        ("DELETE", "runs", "*", "targets", "*"): _delete_target,
        ("GET", "runs", "*", "sessions"): _list_sessions,
        ("GET", "runs", "*", "sessions", "*"): _get_session,
        ("GET", "runs", "*", "analyses"): _list_analyses,
        ("POST", "runs", "*", "captures"): _request_capture,
        ("POST", "runs", "*", "continuous:start"): _continuous_start,
        ("POST", "runs", "*", "continuous:stop"): _continuous_stop,
        ("POST", "runs", "*", "continuous:snapshot"): _snapshot,
        ("POST", "runs", "*", "steps"): _report_steps,
    }
    shape = tuple("*" if i in (1, 3) else p for i, p in enumerate(rest))
    if (method, *shape) in table:
        return table[(method, *shape)], [p for i, p in enumerate(rest) if i in (1, 3)]
    if any(key[1:] == shape for key in table):
        raise RequestError(405, f"{method} is not allowed on {path}")
    raise RequestError(404, f"no endpoint {method} {path}")


def _known_run(deps: Dependencies, run_id: str, who: Who) -> dict[str, Any]:
    run = get_run(deps.state, check_run_id(run_id))
    if run is None:
        raise RequestError(404, f"unknown run {run_id!r}")
    if not who.may_read(run):
        raise RequestError(403, f"{who.caller} may not read run {run_id!r}")
    return run


# --- the SDK's contract --------------------------------------------------------------------------------------


def _mask(query: Mapping[str, str], body: dict[str, Any]) -> list[str]:
    raw = query.get("update_mask") or query.get("updateMask") or "*"
    if raw.strip() == "*":
        return [name for name, place in MASK_FIELDS.items() if _lookup(body, place) is not _MISSING]
    fields = [f.strip() for f in raw.split(",") if f.strip()]
    unknown = [f for f in fields if f not in MASK_FIELDS]
    if unknown:
        raise InvalidRequest(f"update_mask names unknown field(s): {', '.join(unknown)}; known: {', '.join(MASK_FIELDS)}")
    return fields


_MISSING = object()


def _lookup(body: dict[str, Any], place: tuple[str, ...]) -> Any:
    value: Any = body
    for key in place:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _check_field(name: str, value: Any, run_id: str, bucket: str) -> Any:
    if name == "logical_id":
        if value != run_id:
            raise InvalidRequest(f"logicalId {value!r} does not match the run id {run_id!r}")
    elif name == "workload.state":
        if value not in WORKLOAD_STATES:
            raise InvalidRequest(f"workload.state {value!r} is not one of {', '.join(sorted(WORKLOAD_STATES))}")
    elif name == "cluster_id":
        if value not in ("", None):
            check_name(value, "clusterId")
    elif name == "base_blob_path":
        check_prefix(value, bucket)
    elif name == "labels":
        if not isinstance(value, dict) or len(value) > 64 or not all(
            isinstance(k, str) and isinstance(v, str) and _TEXT.fullmatch(k) and _TEXT.fullmatch(v)
            for k, v in value.items()
        ):
            raise InvalidRequest("labels must be an object of at most 64 string keys and values")
    elif not isinstance(value, str) or not _TEXT.fullmatch(value):
        raise InvalidRequest(f"{name} must be a string of at most 512 printable characters")
    return value


def _patch_run(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
               who: Who) -> Reply:
    allow = (query.get("allow_missing") or query.get("allowMissing") or "false").lower()
    if allow not in ("true", "false"):
        raise InvalidRequest(f"allow_missing {allow!r} is not true or false")
    run_id = args[0] if args else body.get("logicalId")
    if args and body.get("name") not in (None, RUN_PREFIX + args[0]):
        raise InvalidRequest(f"name {body.get('name')!r} does not match the path's run {args[0]!r}")
    if not run_id:
        raise InvalidRequest("the run has no id: PATCH /v1/machineLearningRuns/{id}, or send a logicalId")
    check_run_id(run_id)
    bucket = deps.profile_root.removeprefix("gs://")
    changes = {name: _check_field(name, _lookup(body, MASK_FIELDS[name]), run_id, bucket)
               for name in _mask(query, body) if _lookup(body, MASK_FIELDS[name]) is not _MISSING}
    existing = get_run(deps.state, run_id)
    if existing is None and allow != "true":
        raise RequestError(404, f"unknown run {run_id!r} (allow_missing is false)")
    if existing is not None and not who.may_read(existing):
        raise RequestError(403, f"{who.caller} may not change run {run_id!r}")
    now = utc_now()
    resource = dict((existing or {}).get("resource") or {})
    for name, value in changes.items():
        place = MASK_FIELDS[name]
        holder = resource
        for key in place[:-1]:
            holder = holder.setdefault(key, {})
        holder[place[-1]] = value
    resource["logicalId"] = run_id
    prefix = check_prefix(resource["baseBlobPath"], bucket) if resource.get("baseBlobPath") else ""
    doc = {
        "run_id": run_id,
        "display_name": resource.get("displayName") or (existing or {}).get("display_name") or run_id,
        "path": f"{prefix}/{run_id}" if prefix else run_id,
        "resource": resource,
        "updated_at": now,
    }
    doc["base_uri"] = f"{deps.profile_root}/{doc['path']}"
    if existing is None:
        doc["created_at"] = now
        doc["owners"] = [who.caller]  # the creator names the run's readers
    deps.state.update(RUNS, state_key(run_id), doc)
    return Reply(200, _sdk_resource(get_run(deps.state, run_id)))


def _sdk_resource(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": RUN_PREFIX + run["run_id"],
        **(run.get("resource") or {"logicalId": run["run_id"], "displayName": run.get("display_name", run["run_id"])}),
        "createTime": run.get("created_at"),
        "updateTime": run.get("updated_at"),
        "xdiag": {"profileUri": f"{run.get('base_uri')}/plugins/profile/"},
    }


def _get_sdk_run(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                 who: Who) -> Reply:
    return Reply(200, _sdk_resource(_known_run(deps, args[0], who)))


# --- xdiag's endpoints -----------------------------------------------------------------------------------


def _run_summary(key: str, run: dict[str, Any]) -> dict[str, Any]:
    resource = run.get("resource") or {}
    return {
        "id": key,
        "run_id": run.get("run_id", key),
        "display_name": run.get("display_name") or run.get("run_id", key),
        "base_uri": run.get("base_uri"),
        "state": (resource.get("workload") or {}).get("state"),
        "continuous": (run.get("continuous") or {}).get("state", "off"),
        "last_capture_at": run.get("last_capture_at"),
        "created_at": run.get("created_at"),
    }


def _list_runs(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
               who: Who) -> Reply:
    return Reply(200, {"runs": [_run_summary(key, run) for key, run in deps.state.list(RUNS)
                                if who.may_read(run)]})


def _get_run(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
             who: Who) -> Reply:
    run = _known_run(deps, args[0], who)
    return Reply(200, {**_run_summary(state_key(args[0]), run), "path": run.get("path"),
                       "resource": run.get("resource"), "continuous": run.get("continuous") or {"state": "off"},
                       "targets": list_targets(deps.state, args[0])})


def _list_targets(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                  who: Who) -> Reply:
    _known_run(deps, args[0], who)
    return Reply(200, {"targets": list_targets(deps.state, args[0])})


def _add_target(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                who: Who) -> Reply:
    unknown = set(body) - {"name", "host", "port"}
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    name = check_name(body.get("name"), "target name")
    host, port = check_address(body.get("host"), body.get("port"), deps.capture.allow_loopback)
    _known_run(deps, args[0], who)
    targets = {doc["name"]: doc for doc in list_targets(deps.state, args[0])}
    if name not in targets and len(targets) >= MAX_TARGETS:
        raise InvalidRequest(f"run {args[0]!r} has {MAX_TARGETS} targets already")
    target = {"name": name, "host": host, "port": port, "registered_at": targets.get(name, {}).get("registered_at")
              or utc_now(), "updated_at": utc_now()}
    deps.state.set(targets_collection(args[0]), name, target)
    return Reply(200, target)


def _delete_target(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                   who: Who) -> Reply:
    _known_run(deps, args[0], who)
    name = check_name(args[1], "target name")
    if deps.state.get(targets_collection(args[0]), name) is None:
        raise RequestError(404, f"run {args[0]!r} has no target {name!r}")
    deps.state.delete(targets_collection(args[0]), name)
    return Reply(200, {"deleted": name})


def _session_view(deps: Dependencies, session: dict[str, Any]) -> dict[str, Any]:
    analysis = deps.state.get(ANALYSES, session["analysis_id"]) if session.get("analysis_id") else None
    view = {k: v for k, v in session.items() if k != "tracers"}
    if analysis:
        view["analysis"] = {k: analysis.get(k) for k in ("analysis_id", "status", "result", "failure_reason",
                                                          "report_uri", "baseline")}
    return view


def _list_sessions(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                   who: Who) -> Reply:
    _known_run(deps, args[0], who)
    return Reply(200, {"sessions": [_session_view(deps, doc) for _, doc in deps.state.list(sessions_collection(args[0]))]})


def _get_session(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                 who: Who) -> Reply:
    _known_run(deps, args[0], who)
    session = deps.state.get(sessions_collection(args[0]), state_key(check_name(args[1], "session id")))
    if session is None:
        raise RequestError(404, f"run {args[0]!r} has no session {args[1]!r}")
    return Reply(200, _session_view(deps, session))


def _list_analyses(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                   who: Who) -> Reply:
    run = _known_run(deps, args[0], who)
    keep = ("analysis_id", "session_id", "status", "result", "failure_reason", "report_uri", "created_at")
    analyses = [{k: doc.get(k) for k in keep} for _, doc in deps.state.list(ANALYSES) if doc.get("run_id") == run["run_id"]]
    return Reply(200, {"analyses": analyses})


def _selection(deps: Dependencies, run_id: str, body: dict[str, Any]) -> list[str]:
    hosts = check_hosts(body.get("hosts"))
    registered = {doc["name"] for doc in list_targets(deps.state, run_id)}
    unknown = [h for h in hosts if h not in registered]
    if unknown:
        raise InvalidRequest(f"not registered target(s) of run {run_id!r}: {', '.join(unknown)}")
    if not registered:
        raise InvalidRequest(f"run {run_id!r} has no registered profiler targets (xdiag.sdk.workload.attach registers them)")
    return hosts


def _new_session(deps: Dependencies, run_id: str, requested: Any, kind: str) -> str:
    """Records the requested session (so it can be polled at once, and register leaves its files to capture)."""
    session_id = check_name(requested, "session id") if requested is not None else new_session_id(kind)
    record = {"run_id": run_id, "session_id": session_id, "kind": kind, "status": "REQUESTED",
              "requested_at": utc_now(), "updated_at": utc_now()}
    if not deps.state.create(sessions_collection(run_id), state_key(session_id), record):
        raise RequestError(409, f"run {run_id!r} has a session {session_id!r} already")
    return session_id


def _request_capture(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                     who: Who) -> Reply:
    known = {"duration_ms", "hosts", "session_id", "host_tracer_level", "device_tracer_level", "python_tracer_level"}
    unknown = set(body) - known
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    run_id = check_run_id(args[0])
    duration_ms = check_duration_ms(body.get("duration_ms", deps.capture.duration_ms), deps.capture)
    levels = check_tracer_levels(body)
    _known_run(deps, run_id, who)
    hosts = _selection(deps, run_id, body)
    session_id = _new_session(deps, run_id, body.get("session_id"), KIND_ON_DEMAND)
    alert = Alert(source="manual", run_id=run_id, session_id=session_id, hosts=hosts or None, duration_ms=duration_ms,
                  **levels)
    deps.bus.publish(TOPIC_ALERTS, alert)
    return Reply(202, {"run_id": run_id, "session_id": session_id, "kind": KIND_ON_DEMAND, "status": "REQUESTED",
                       "duration_ms": duration_ms, "hosts": hosts or "all"})


def _continuous(deps: Dependencies, args: list[str], body: dict[str, Any], start: bool, who: Who) -> Reply:
    allowed = {"hosts", "device_tracer_level"} if start else {"hosts"}
    unknown = set(body) - allowed
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    run_id = check_run_id(args[0])
    level = check_tracer_levels({"device_tracer_level": body.get("device_tracer_level", 1)})["device_tracer_level"]
    _known_run(deps, run_id, who)
    hosts = _selection(deps, run_id, body)
    state = set_continuous(deps, run_id, start, hosts or None, level)
    if not any(answer["status"] == "ok" for answer in state["answers"].values()):
        reasons = "; ".join(f"{name}: {a.get('error')}" for name, a in state["answers"].items())
        return _error(502, f"no target answered: {reasons}")
    return Reply(200, {"run_id": run_id, **state})


def _continuous_start(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                      who: Who) -> Reply:
    return _continuous(deps, args, body, start=True, who=who)


def _continuous_stop(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                     who: Who) -> Reply:
    return _continuous(deps, args, body, start=False, who=who)


def _snapshot(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
              who: Who) -> Reply:
    unknown = set(body) - {"name", "hosts"}
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    run_id = check_run_id(args[0])
    _known_run(deps, run_id, who)
    hosts = _selection(deps, run_id, body)
    session_id = _new_session(deps, run_id, body.get("name"), KIND_SNAPSHOT)
    deps.bus.publish(TOPIC_ALERTS, Alert(source="snapshot", run_id=run_id, session_id=session_id, hosts=hosts or None))
    return Reply(202, {"run_id": run_id, "session_id": session_id, "kind": KIND_SNAPSHOT, "status": "REQUESTED"})


def _report_steps(deps: Dependencies, args: list[str], query: Mapping[str, str], body: dict[str, Any],
                  who: Who) -> Reply:
    run_id = check_run_id(args[0])
    points = body.get("points")
    if not isinstance(points, list) or not 0 < len(points) <= MAX_POINTS:
        raise InvalidRequest(f"points must be a list of 1 to {MAX_POINTS} step times")
    target = check_name(body.get("target") or "workload", "target name")
    try:
        message = StepTimes(run_id=run_id, target=target, points=points)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(f"points: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    _known_run(deps, run_id, who)
    deps.bus.publish(TOPIC_STEP_TIMES, message)
    return Reply(202, {"run_id": run_id, "accepted": len(message.points)})
