"""The pipeline's stages: register → collect → run_tool × each broad tool → aggregate → investigate → render, and
dead_letter. A many-host session (`SessionLoader.maps_hosts`) goes collect → map_host × each host file → collect
again (the reduce) before its tools.

Each stage is a handler `(message, deps)` that reads and writes through the ports and
publishes the next message. The same handlers run in-process for `xdiag analyze` and
behind Cloud Functions in the cloud. Every handler is idempotent: Pub/Sub delivers at
least once, so a second delivery finds its work done and changes nothing.

Every derived artefact is keyed by exact inputs: an analysis records the generation and size of every file it
covers, reads exactly those versions, and keeps its own files in its own folder; only the session's current
analysis writes the session's report. A late host or a replaced file makes a newer analysis current, and the
older one stops at its next stage (SUPERSEDED).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xdiag.errors import InvalidRequest, PoisonMessage, ProfileError, UnknownTool
from xdiag.investigators import MAX_FOLLOW_UP_CALLS, checked_verdict, health_snapshot
from xdiag.sizes import readable_size
from xdiag.model import (
    Analysis,
    CaptureReady,
    DeadLetter,
    FollowUpCall,
    HostMapRun,
    InvestigationReady,
    ProfileUploaded,
    ReportReady,
    Status,
    ToolDone,
    ToolResult,
    ToolRun,
    ToolStatus,
    utc_now,
)
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import (
    ProfileObject,
    analysis_folder,
    analysis_id_for,
    check_profile_object,
    host_file_key,
    host_summary_uri,
    inputs_key,
    output_uri,
    parse_profile_uri,
    prepared_host_uri,
    recorded_input,
    session_files,
    session_prefix,
    state_key,
)
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.runs import CAPTURED_KINDS, RUNS, list_targets, run_for_path, run_path
from xdiag.pipeline.topics import (
    ACTIVE_ANALYSES,
    ANALYSES,
    CLAIMS,
    DEAD_LETTERS,
    MESSAGE_TYPES,
    TERMINAL,
    TOPIC_CAPTURES,
    TOPIC_HOST_MAPS,
    TOPIC_INVESTIGATIONS,
    TOPIC_REPORTS,
    TOPIC_TOOL_RESULTS,
    TOPIC_TOOL_RUNS,
    files_collection,
    host_maps_collection,
    letter_key,
    sessions_collection,
    tools_collection,
)
from xdiag.profile.space import Session
from xdiag.profile.trace_json import trace_format
from xdiag.tools import BROAD_TOOLS, FOLLOW_UP_TOOLS, REGISTRY
from xdiag.tools import run_tool as execute_tool
from xdiag.tools.registry import validate_args


def _join(prefix: str, name: str) -> str:
    return prefix.rstrip("/") + "/" + name


def _load_analysis(deps: Dependencies, analysis_id: str) -> Analysis | None:
    doc = deps.state.get(ANALYSES, analysis_id)
    return Analysis.model_validate(doc) if doc else None


def _save(deps: Dependencies, analysis: Analysis) -> None:
    analysis.updated_at = utc_now()
    deps.state.set(ANALYSES, analysis.analysis_id, analysis.model_dump(mode="json"))
    if analysis.status in TERMINAL:
        deps.state.delete(ACTIVE_ANALYSES, analysis.analysis_id)


def describe(session: Session) -> dict[str, Any]:
    return {
        "platform": session.platform,
        "hosts": [h.hostname for h in session.hosts],
        "files": [str(h.path.name) for h in session.hosts],
        "devices": len(session.device_planes()) or None,
        "devices_with_events": len(session.device_planes(with_events=True)) or None,
        "size_bytes": session.size_bytes,
        "events": session.event_count,
        "hlo_modules": len(session.hlo_modules),
        "warnings": [w for h in session.hosts for w in h.warnings][:5],
        "format": trace_format(session) or "XProf XSpace (*.xplane.pb)",
    }


def resolve_capture(message: CaptureReady, deps: Dependencies) -> tuple[CaptureReady, list[BlobInfo]]:
    """Completes a request (a manual one may name only the run and session) and the exact file versions it covers.

    Where a profile root is configured (the cloud), the files must lie in the session's own folder and the output
    goes beside them, derived from the run and session: a message naming other files or another output folder is
    refused. Raises PoisonMessage where no retry can help: an unknown session, a missing object, such a location.
    """
    root = deps.profile_root
    folder = run_path(deps.state, message.run_id) if root else message.run_id
    if message.profile_uris:
        infos = [(uri, deps.blobs.stat(uri)) for uri in message.profile_uris]
        missing = [uri for uri, info in infos if info is None]
        if missing:
            raise PoisonMessage(f"missing object: {', '.join(missing)}")
        files = [info for _, info in infos]
        if root:
            own = session_prefix(root, folder, message.session_id)
            for uri in message.profile_uris:
                named = parse_profile_uri(uri)
                if named is None or named.session_prefix != own:
                    raise PoisonMessage(f"profile file {uri} is not in the session's folder {own}: a capture "
                                        "analyses its own session's files only")
    elif not root:
        raise PoisonMessage("the capture names no profile files, and no profile root is configured to look them up")
    else:
        files = live_files(deps, root, folder, message.session_id)
        if not files:
            raise PoisonMessage(f"unknown session: no *.xplane.pb (nor *.pt.trace.json[.gz]) under {session_prefix(root, folder, message.session_id)}")
    if root:
        derived = output_uri(root, folder, message.session_id)
        if message.output_uri not in (None, derived):
            raise PoisonMessage(f"output_uri {message.output_uri} is not the session's output folder {derived}: "
                                "output locations are derived from the run and session, never taken from a message")
        out = derived
    elif message.output_uri:
        out = message.output_uri
    else:
        raise PoisonMessage("the capture names no output_uri, and no profile root is configured to derive it")
    analysis_id = message.analysis_id or analysis_id_for(message.run_id, message.session_id, files, message.investigator)
    resolved = message.model_copy(update={"analysis_id": analysis_id, "profile_uris": sorted(i.uri for i in files),
                                          "output_uri": out})
    return resolved, sorted(files, key=lambda i: i.uri)


def valid_profile_object(uri: str) -> ProfileObject | None:
    """The run, session and host an object names where it is a host file of a session and every id is valid."""
    named = parse_profile_uri(uri)
    try:
        return check_profile_object(named) if named is not None else None
    except InvalidRequest:
        return None


def live_files(deps: Dependencies, root: str, run_folder: str, session: str) -> list[BlobInfo]:
    """The session's host files as its folder holds them now, those whose host name is a valid id (sorted by URI)."""
    return [info for info in session_files(deps.blobs, root, run_folder, session) if valid_profile_object(info.uri)]


def _inputs(analysis: Analysis) -> list[BlobInfo]:
    return [recorded_input(i) for i in analysis.inputs]


def _work(analysis: Analysis) -> str:
    return analysis.work_uri or analysis.output_uri


def is_current(deps: Dependencies, analysis: Analysis) -> bool:
    """False (and the analysis marked SUPERSEDED, once) where its session has moved on to other files: a host
    arrived late, or a file was replaced, and a newer analysis covers them. Its stages then stop, and it never
    writes the session's report."""
    if analysis.status == "SUPERSEDED":
        return False
    session = deps.state.get(sessions_collection(analysis.run_id), state_key(analysis.session_id)) or {}
    newer = session.get("analysis_id")
    if not newer or newer == analysis.analysis_id or session.get("inputs_key") in (None, inputs_key(_inputs(analysis))):
        return True
    if analysis.status not in TERMINAL:
        analysis.status, analysis.superseded_by = "SUPERSEDED", newer
        analysis.failure_reason = (f"superseded by analysis {newer}: the session's files changed (a host arrived late "
                                   "or a file was replaced) and the newer analysis covers them")
        _save(deps, analysis)
        deps.on_event("superseded", {"analysis_id": analysis.analysis_id, "by": newer})
    return False


def _claim_session(deps: Dependencies, analysis: Analysis) -> None:
    """A manual request whose files are the session's live files (newer than its current analysis') becomes the
    session's current analysis."""
    if not deps.profile_root:
        return
    key = inputs_key(_inputs(analysis))
    session = deps.state.get(sessions_collection(analysis.run_id), state_key(analysis.session_id))
    if session is None or session.get("inputs_key") in (None, key):
        return
    live = live_files(deps, deps.profile_root, run_path(deps.state, analysis.run_id), analysis.session_id)
    if inputs_key(live) == key:
        deps.state.update(sessions_collection(analysis.run_id), state_key(analysis.session_id), {
            "analysis_id": analysis.analysis_id, "inputs_key": key, "updated_at": utc_now()})


def fail_analysis(deps: Dependencies, analysis: Analysis, reason: str) -> None:
    """Records why the analysis failed and has the report say so."""
    analysis.status, analysis.result, analysis.failure_reason = "FAILED", Status.FAILED, reason
    _save(deps, analysis)
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id, attempt=analysis.repairs))


def beyond_limits(deps: Dependencies, files: list[BlobInfo]) -> str | None:
    """Why a session the map stage would decode cannot be analysed, where it is over a limit: more host files than
    `max_hosts`, or a file over `max_host_file_bytes` (what one map invocation decodes). Its size all files together
    binds only where it is assembled from its hosts' columns (deps.SessionLoader, after the maps: its hosts cannot
    be summarised); a session read whole (`xdiag analyze`, one host) has only that limit, which its reader checks."""
    if not deps.sessions.maps_hosts(files):
        return None
    if len(files) > deps.max_hosts:
        return (f"the session has {len(files)} host files, over the limit of {deps.max_hosts} hosts per session "
                "(XDIAG_MAX_HOSTS); analyse a subset of its hosts in a session of their own")
    big = [info for info in files if info.size > deps.max_host_file_bytes]
    if big:
        return (f"{big[0].uri.rsplit('/', 1)[-1]} is {readable_size(big[0].size)}, over the limit of "
                f"{readable_size(deps.max_host_file_bytes)} per host file (XDIAG_MAX_HOST_FILE_GIB); capture a shorter "
                "window, or raise the limit with the memory of map_host")
    return None


def _map_hosts(deps: Dependencies, analysis: Analysis, attempt: int) -> tuple[str | None, bool]:
    """The map stage of a many-host session: a HostMapRun per host file without a map record (a file whose version
    was decoded for an earlier analysis is recorded at once, not decoded again). Returns (why the analysis fails,
    where a host could not be decoded; whether maps are outstanding, the analysis then MAPPING_HOSTS)."""
    inputs = _inputs(analysis)
    records = dict(deps.state.list(host_maps_collection(analysis.analysis_id)))
    for info in inputs:
        record = records.get(host_file_key(info))
        if record is not None and record.get("status") == "FAILED":
            return record["reason"], False
    missing = [info for info in inputs if host_file_key(info) not in records]
    for info in list(missing):
        if (deps.blobs.exists(prepared_host_uri(analysis.output_uri, info))  # mapped for an earlier analysis
                and deps.blobs.exists(host_summary_uri(analysis.output_uri, info))):
            deps.state.create(host_maps_collection(analysis.analysis_id), host_file_key(info), {
                "status": "DONE", "uri": info.uri, "host": info.uri.rsplit("/", 1)[-1], "reused": True,
                "duration_ms": 0.0, "finished_at": utc_now()})
            missing.remove(info)
    if not missing:
        return None, False
    if analysis.status == "PENDING":
        analysis.status = "MAPPING_HOSTS"
        analysis.timeline["map"] = utc_now()
        _save(deps, analysis)
        deps.on_event("collect", {"mapping": len(missing), "hosts": len(inputs)})
    deps.bus.publish_all(TOPIC_HOST_MAPS, [HostMapRun(analysis_id=analysis.analysis_id, uri=info.uri,
                                                      generation=info.generation, attempt=attempt) for info in missing])
    return None, True


def collect(message: CaptureReady, deps: Dependencies) -> None:
    """Fan-out: record the analysis with its exact inputs, read the session once, publish one ToolRun per tool.
    A many-host session is first mapped, one map_host per host file; the maps' fan-in announces it here again, and
    this read assembles what they decoded (the reduce)."""
    message, files = resolve_capture(message, deps)
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        fresh = Analysis(
            analysis_id=message.analysis_id, run_id=message.run_id, session_id=message.session_id,
            profile_uris=message.profile_uris, output_uri=message.output_uri, investigator=message.investigator,
            inputs=[{"uri": i.uri, "generation": i.generation, "size": i.size} for i in files],
            work_uri=analysis_folder(message.output_uri, message.analysis_id) if deps.profile_root else "",
        )
        if deps.state.create(ANALYSES, message.analysis_id, fresh.model_dump(mode="json")):
            deps.state.set(ACTIVE_ANALYSES, fresh.analysis_id, {"at": utc_now()})
            _claim_session(deps, fresh)
            analysis = fresh
        else:  # another delivery recorded it first: its record is the one
            analysis = _load_analysis(deps, message.analysis_id)
    if analysis.status in TERMINAL or not is_current(deps, analysis):
        return
    if analysis.status not in ("PENDING", "MAPPING_HOSTS"):  # collected already: a copy must not write over a
        if analysis.status == "RUNNING_TOOLS":  # later stage's state
            publish_tool_runs(deps, analysis)  # the first delivery may have died before publishing them all
        return
    started = time.perf_counter()
    over = beyond_limits(deps, files)
    if over:
        deps.on_event("collect", {"failed": over})
        fail_analysis(deps, analysis, over)
        return
    if deps.sessions.maps_hosts(files):
        failed, waiting = _map_hosts(deps, analysis, message.attempt)
        if failed:
            deps.on_event("collect", {"failed": failed})
            fail_analysis(deps, analysis, failed)
            return
        if waiting:
            return  # the maps' fan-in announces the session again once every host is in
    try:
        session = _session(deps, analysis)
    except ProfileError as exc:
        deps.on_event("collect", {"failed": str(exc)})
        fail_analysis(deps, analysis, str(exc))
        return
    analysis.profile = describe(session)
    analysis.status = "RUNNING_TOOLS"
    analysis.timings_ms["read"] = round(deps.sessions.read_ms.get(_loader_key(analysis), 0.0), 1)
    analysis.timings_ms["collect"] = round((time.perf_counter() - started) * 1000, 1)
    analysis.timeline["collect"] = utc_now()
    _save(deps, analysis)
    deps.on_event("collect", analysis.profile)
    publish_tool_runs(deps, analysis, done=set())  # none ran: tool runs are published only once RUNNING_TOOLS is saved


def _loader_key(analysis: Analysis) -> tuple[BlobInfo, ...]:
    return tuple(sorted(_inputs(analysis), key=lambda i: i.uri))


def _session(deps: Dependencies, analysis: Analysis, events: bool = False) -> Session:
    """The analysis' session; with `events` its hosts' events too (the follow-ups), where the broad tools read a
    many-host session from its hosts' summaries."""
    if not analysis.inputs:  # recorded before inputs were: the files as they are now
        analysis.inputs = [{"uri": i.uri, "generation": i.generation, "size": i.size}
                           for i in (deps.blobs.stat(uri) for uri in analysis.profile_uris) if i is not None]
    return deps.sessions.load(_inputs(analysis), analysis.session_id, analysis.output_uri, events)


def publish_tool_runs(
    deps: Dependencies, analysis: Analysis, attempt: int = 0, done: set[str] | None = None
) -> list[str]:
    """ToolRuns for the broad tools without a result (`done`: those with one, where the caller knows); returns their
    names."""
    if done is None:
        done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    missing = [tool for tool in BROAD_TOOLS if tool not in done]
    deps.bus.publish_all(TOPIC_TOOL_RUNS, [ToolRun(analysis_id=analysis.analysis_id, tool=tool, attempt=attempt)
                                           for tool in missing])
    return missing


def _store_result(deps: Dependencies, analysis: Analysis, result: ToolResult, name: str) -> str:
    uri = _join(_work(analysis), f"tools/{name}.json")
    deps.blobs.put(uri, result.model_dump_json(indent=2).encode(), "application/json")
    return uri


def _record_tool(deps: Dependencies, analysis: Analysis, result: ToolResult) -> None:
    """The tool's full output to the blob store, its status and summary to its own document."""
    uri = _store_result(deps, analysis, result, result.tool)
    deps.state.set(
        tools_collection(analysis.analysis_id),
        result.tool,
        {"status": result.status.value, "reason": result.reason, "summary": result.summary, "uri": uri,
         "duration_ms": round(result.duration_ms, 2), "source": result.source, "finished_at": utc_now()},
    )


def run_tool(message: ToolRun, deps: Dependencies) -> None:
    """Runs one broad tool on the session and stores its result; a second delivery only re-announces it (which the
    fan-in takes as it took the first). The analysis and the tool's record come in one read, the fan-out's cost
    being its round trips; whether a newer analysis superseded this one is the fan-in's check once every tool is in
    (`aggregate` marks it SUPERSEDED; the tool runs of a repair after that see the status and stop)."""
    if message.tool not in BROAD_TOOLS:
        raise PoisonMessage(f"tool {message.tool!r} is not one of the broad tools an analysis runs")
    analysis_doc, recorded = deps.state.get_many(
        [(ANALYSES, message.analysis_id), (tools_collection(message.analysis_id), message.tool)])
    if analysis_doc is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    analysis = Analysis.model_validate(analysis_doc)
    if analysis.status in TERMINAL:
        return  # finished, failed or superseded: nothing waits for this tool any more
    if recorded is None:
        try:
            session = _session(deps, analysis)
            result = execute_tool(session, message.tool, message.args)
        except (ProfileError, UnknownTool) as exc:
            result = ToolResult(tool=message.tool, status=ToolStatus.FAILED, reason=str(exc))
        _record_tool(deps, analysis, result)
        deps.on_event("run_tool", {"tool": message.tool, "status": result.status.value, "duration_ms": result.duration_ms})
    deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=message.tool,
                                                 attempt=message.attempt))


def _input_of(analysis: Analysis, message: HostMapRun) -> BlobInfo | None:
    """The analysis' input a map run names (that URI at that generation), or None."""
    return next((i for i in _inputs(analysis) if (i.uri, i.generation) == (message.uri, message.generation)), None)


def map_host(message: HostMapRun, deps: Dependencies) -> None:
    """The map stage: decodes one host file of a many-host session into its prepared columns and records it; the
    delivery that finds every host of the analysis recorded announces the session again on `captures`, once (a
    create-if-absent claim), for collect to assemble. A file that cannot be read is recorded FAILED with the reason
    (collect then fails the analysis, naming it); a second delivery decodes nothing again."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    if analysis.status != "MAPPING_HOSTS":
        return  # reduced already, finished, failed or superseded: nothing waits for this host any more
    info = _input_of(analysis, message)
    if info is None:
        raise PoisonMessage(f"{message.uri} (generation {message.generation!r}) is not a file of analysis "
                            f"{analysis.analysis_id}")
    collection, key = host_maps_collection(analysis.analysis_id), host_file_key(info)
    if deps.state.get(collection, key) is None:
        started = time.perf_counter()
        record: dict[str, Any] = {"uri": info.uri, "host": info.uri.rsplit("/", 1)[-1], "input_bytes": info.size}
        try:
            prepared, size = deps.sessions.map_host_file(info, analysis.output_uri)
            record.update(status="DONE", prepared_uri=prepared, prepared_bytes=size)
        except ProfileError as exc:
            record.update(status="FAILED", reason=str(exc))
        except FileNotFoundError:
            record.update(status="FAILED", reason=f"{record['host']}: profile object missing or replaced since the "
                                                  "analysis began")
        record.update(duration_ms=round((time.perf_counter() - started) * 1000, 1), finished_at=utc_now())
        deps.state.set(collection, key, record)
        deps.on_event("map_host", {k: record.get(k) for k in ("host", "status", "duration_ms", "reason")})
    _reduce_when_mapped(deps, analysis, message.attempt)


def _reduce_when_mapped(deps: Dependencies, analysis: Analysis, attempt: int) -> None:
    """The maps' fan-in: with every host file recorded, the session announced again for collect, once."""
    done = {key for key, _ in deps.state.list(host_maps_collection(analysis.analysis_id))}
    if not {host_file_key(info) for info in _inputs(analysis)} <= done:
        return  # more hosts to come: the last one's delivery goes on
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.reduce", {"at": utc_now()}):
        deps.bus.publish(TOPIC_CAPTURES, CaptureReady(
            analysis_id=analysis.analysis_id, run_id=analysis.run_id, session_id=analysis.session_id,
            profile_uris=analysis.profile_uris, output_uri=analysis.output_uri, investigator=analysis.investigator,
            hosts_mapped=True, attempt=attempt))


def aggregate(message: ToolDone, deps: Dependencies) -> None:
    """Fan-in: when every broad tool has a result, claim the investigation exactly once. The tools' records are read
    first: every delivery but the last ends there, in one round trip (three before), and only the last reads the
    analysis and whether a newer one superseded it."""
    if message.tool not in BROAD_TOOLS:
        raise PoisonMessage(f"tool {message.tool!r} is not one of the broad tools an analysis runs")
    done = {key for key, _ in deps.state.list(tools_collection(message.analysis_id))}
    if done and not set(BROAD_TOOLS) <= done:
        return  # more results to come: the last one's delivery goes on
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise PoisonMessage(f"unknown analysis {message.analysis_id!r}: no analysis was recorded, so no tool of it ran")
    if not done or analysis.status != "RUNNING_TOOLS" or not is_current(deps, analysis):
        return  # a stray message (no result), an investigation claimed already (or finished), or a superseded analysis
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.investigate", {"at": utc_now()}):
        deps.state.update(ANALYSES, analysis.analysis_id, {"status": "INVESTIGATING", "updated_at": utc_now()})
        deps.on_event("aggregate", {"tools": len(done)})
        deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=analysis.analysis_id,
                                                                  attempt=message.attempt))


def load_results(deps: Dependencies, analysis: Analysis) -> dict[str, ToolResult]:
    """Every recorded tool result whose output is still in the blob store, fetched at once (a round trip each)."""

    def fetch(uri: str) -> ToolResult | None:
        try:
            return ToolResult.model_validate_json(deps.blobs.get(uri))
        except FileNotFoundError:
            return None

    stored = [(tool, doc["uri"]) for tool, doc in deps.state.list(tools_collection(analysis.analysis_id))
              if doc.get("uri")]
    with ThreadPoolExecutor(max_workers=max(1, min(len(stored), 16))) as pool:
        fetched = pool.map(fetch, [uri for _, uri in stored])
        return {tool: result for (tool, _), result in zip(stored, fetched) if result is not None}


class FollowUps:
    """The follow-up calls of one investigation: unknown tools and bad arguments refused before they are charged,
    at most MAX_FOLLOW_UP_CALLS run, each inside what is left of the investigation's deadline."""

    def __init__(self, deps: Dependencies, analysis: Analysis, session: Session, deadline_s: float) -> None:
        self.deps, self.analysis, self.session = deps, analysis, session
        self.deadline_s, self.started = deadline_s, time.monotonic()
        self.refused: list[FollowUpCall] = []
        self.made = 0

    def _refuse(self, name: str, args: dict[str, Any], hypothesis: str, reason: str) -> ToolResult:
        self.refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                         reason=reason))
        return ToolResult(tool=name, status=ToolStatus.FAILED, reason=reason)

    def __call__(self, name: str, args: dict[str, Any], hypothesis: str) -> ToolResult | None:
        if name not in FOLLOW_UP_TOOLS:
            return self._refuse(name, args, hypothesis, f"refused: {name!r} is not a follow-up tool")
        try:  # a call with bad arguments is refused before it spends any of the budget
            validate_args(REGISTRY[name], args)
        except ValueError as exc:
            return self._refuse(name, args, hypothesis, f"refused: bad arguments: {exc}")
        if self.made >= MAX_FOLLOW_UP_CALLS:
            self._refuse(name, args, hypothesis, f"refused: the limit of {MAX_FOLLOW_UP_CALLS} follow-up calls is reached")
            return None
        left = self.deadline_s - (time.monotonic() - self.started)
        if left <= 0:
            return self._refuse(name, args, hypothesis,
                                f"refused: the investigation's deadline of {self.deadline_s:g} s has passed")
        self.made += 1
        result = self._run_within(name, args, left)
        _store_result(self.deps, self.analysis, result, f"followup-{self.made}-{name}")
        self.deps.on_event("follow_up", {"tool": name, "status": result.status.value})
        return result

    def _run_within(self, name: str, args: dict[str, Any], left: float) -> ToolResult:
        """The tool in a worker thread, waited for no longer than the deadline allows; past it the call is answered
        as failed and the investigation goes on without it (the thread finishes on its own, its result unused)."""
        outcome: list[ToolResult] = []
        worker = threading.Thread(target=lambda: outcome.append(execute_tool(self.session, name, args)),
                                  name=f"follow-up {name}", daemon=True)
        worker.start()
        worker.join(left)
        if outcome:
            return outcome[0]
        return ToolResult(tool=name, status=ToolStatus.FAILED, args=args, duration_ms=left * 1000,
                          reason=f"stopped: still running at the investigation's deadline of {self.deadline_s:g} s")


def investigate(message: InvestigationReady, deps: Dependencies) -> None:
    """Health snapshot → OPTIMAL, or hypotheses with at most MAX_FOLLOW_UP_CALLS follow-up tools → findings."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.status == "SUPERSEDED" or not is_current(deps, analysis):
        return
    if analysis.diagnosis is None and analysis.status != "FAILED":
        started = time.perf_counter()
        results = load_results(deps, analysis)
        health = health_snapshot(results)
        follow_ups = FollowUps(deps, analysis, _session(deps, analysis, events=True), deps.investigation_deadline_s)
        chosen = analysis.investigator if analysis.investigator in deps.investigators else "rules"
        investigator = deps.investigators[chosen]()
        diagnosis = checked_verdict(investigator.investigate(health, results, follow_ups), health, results)
        diagnosis.follow_up_calls.extend(follow_ups.refused)
        if chosen != analysis.investigator and not diagnosis.investigator_note:
            diagnosis.investigator_note = f"investigator {analysis.investigator!r} is not configured; used the rule engine"
        analysis.health = health.as_dict()
        analysis.diagnosis = diagnosis
        analysis.result = diagnosis.status
        analysis.status = "RENDERING"
        analysis.tools = {t: {"status": r.status.value, "reason": r.reason, "duration_ms": round(r.duration_ms, 2)} for t, r in results.items()}
        analysis.timings_ms["tools"] = round(sum(r.duration_ms for r in results.values()), 1)
        analysis.timings_ms["investigate"] = round((time.perf_counter() - started) * 1000, 1)
        analysis.timeline["investigate"] = utc_now()
        _save(deps, analysis)
        deps.on_event("investigate", {"status": diagnosis.status.value, "findings": len(diagnosis.findings)})
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id, attempt=message.attempt))


def render(message: ReportReady, deps: Dependencies) -> None:
    """Writes summary.html and analysis.json into the analysis' own folder and, for the session's current analysis,
    beside the profile; marks the analysis DONE (or FAILED). One render per report request."""
    from xdiag.pipeline.previous import compare_with_previous
    from xdiag.report import render_summary_html

    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.status in ("DONE", "FAILED") and analysis.report_uri and deps.blobs.exists(analysis.report_uri):
        return  # rendered already: a redelivery writes no second report
    if not is_current(deps, analysis):
        return
    if not deps.state.create(CLAIMS, f"{analysis.analysis_id}.render.{message.attempt}", {"at": utc_now()}):
        return  # a copy delivered at the same time renders it; a lost render is the sweeper's to repeat
    started = time.perf_counter()
    results = load_results(deps, analysis)
    if analysis.status != "FAILED":
        analysis.status = "DONE"
    own, beside = _work(analysis), analysis.output_uri
    analysis.report_uri = _join(beside, "summary.html")
    analysis.timeline["render"] = utc_now()
    previous = compare_with_previous(deps, analysis, results) if analysis.status == "DONE" else None
    html = render_summary_html(analysis, results, previous=previous)
    analysis.timings_ms["render"] = round((time.perf_counter() - started) * 1000, 1)
    assembling = _being_assembled(deps, analysis)
    if assembling and own != beside:
        analysis.report_uri = _join(own, "summary.html")  # its own report only: the session's waits for its files
    folders = [own] if assembling and own != beside else [own, beside] if own != beside else [beside]
    for folder in folders:
        if folder == beside and not is_current(deps, analysis):
            return  # superseded meanwhile: the session's report is the newer analysis'
        deps.blobs.put(_join(folder, "summary.html"), html.encode(), "text/html; charset=utf-8")
        deps.blobs.put(_join(folder, "analysis.json"), analysis.model_dump_json(indent=2).encode(), "application/json")
    _save(deps, analysis)
    deps.on_event("render", {"report": analysis.report_uri, "status": analysis.status})


def _being_assembled(deps: Dependencies, analysis: Analysis) -> bool:
    """True where the session's folder holds other files than the analysis covers (a host uploaded after its
    announcement, a replaced file): a newer analysis of them is coming, and the session's report is that one's."""
    if not deps.profile_root or not analysis.inputs:
        return False
    live = live_files(deps, deps.profile_root, run_path(deps.state, analysis.run_id), analysis.session_id)
    return bool(live) and inputs_key(live) != inputs_key(_inputs(analysis))


def _expected_hosts(deps: Dependencies, run: str) -> int:
    """How many hosts the run's sessions have, as far as the run says: its registered profiler targets (one per
    host of an attached workload) and the most hosts an earlier session of it had. 1 where nothing says more."""
    run_doc = deps.state.get(RUNS, state_key(run)) or {}
    return max(1, len(list_targets(deps.state, run)), int(run_doc.get("max_hosts") or 0),
               int(run_doc.get("expected_hosts") or 0))


def store_clock(deps: Dependencies):
    """This process's clock set to the state store's (one read): times the stores wrote (objects' upload times, the
    stages' records) are compared with it, never with a local clock that may be off."""
    offset = deps.state.now() - time.time()
    return lambda: time.time() + offset


def _newest(files: list[BlobInfo]) -> BlobInfo:
    """The session's newest file by the store's upload time (its URI breaks ties, so every delivery agrees)."""
    return max(files, key=lambda info: (info.updated or 0.0, info.uri))


def _prepare_during_quiet_period(deps: Dependencies, hosts: list[BlobInfo], named: ProfileObject) -> None:
    """The session read and stored prepared (xdiag.profile.compact) under the key of exactly these files, so collect
    and the tools map it instead of reading the profile after the quiet period. Best effort: whatever goes wrong
    here, collect reads the files itself and records the precise reason where they cannot be read."""
    try:
        done = deps.sessions.prepare(hosts, named.session, output_uri(named.root, named.run, named.session))
    except Exception as exc:  # noqa: BLE001 - an optimisation must never cost the announcement
        deps.on_event("register", {"not prepared": f"{type(exc).__name__}: {exc}"[:300]})
        return
    deps.on_event("register", {"prepared": named.session, "files": len(hosts)} if done else
                  {"not prepared": named.session})


def register(message: ProfileUploaded, deps: Dependencies) -> None:
    """Records one host's file of a session; once no file of the session has been uploaded for the quiet period,
    announces the session on `captures` (every file in its folder, in one CaptureReady). Objects outside the profile
    layout, or whose run, session or host is not a valid id, are ignored.

    The session is what its folder in the bucket holds, and the quiet period counts from the newest file's upload
    time (the store's, compared with the store's clock), not from when its notification was handled: notifications
    handled seconds or minutes late (a busy register, a backlog) neither split a session nor wait twice. Only the
    delivery of the session's newest file waits (and announces); the others return at once. The period is
    `quiet_period_s`, or `multi_host_quiet_period_s` while fewer files are in than the run has hosts (its registered
    targets, its earlier sessions). A file uploaded after the announcement (a late host, a replaced file) announces
    the session again with all its files: that analysis supersedes the earlier one, which stops and never writes the
    session's report. While it waits with every host in, it reads the session and stores it prepared, so collect and
    the tools start from the decoded columns. Announcing is at-least-once, which collect absorbs: the same file
    versions always name the same analysis.
    """
    named = parse_profile_uri(message.uri)
    if named is None:
        deps.on_event("register", {"ignored": message.uri})
        return
    try:
        check_profile_object(named)
    except InvalidRequest as exc:
        deps.on_event("register", {"ignored": message.uri, "why": str(exc)})
        return
    run = run_for_path(deps.state, named.run)  # a run registered through the SDK lives in PREFIX/<run>
    session_key = state_key(named.session)
    if (deps.state.get(sessions_collection(run), session_key) or {}).get("kind") in CAPTURED_KINDS:
        deps.on_event("register", {"ignored": message.uri, "why": "captured by xdiag: the capture announces it"})
        return
    info = deps.blobs.stat(message.uri)
    if info is None:
        raise PoisonMessage(f"missing object: {message.uri} (deleted, or never written)")
    files = files_collection(run, named.session)
    known = deps.state.get(files, state_key(named.host))
    if known is None or known.get("generation") != info.generation:  # a new file, or a new version of one
        deps.state.set(files, state_key(named.host), {
            "uri": info.uri, "host": named.host, "size": info.size, "generation": info.generation,
            "uploaded_at": info.updated, "registered_at": time.time()})
        deps.state.update(RUNS, state_key(run), {
            "run_id": run, "base_uri": f"{named.root}/{named.run}", "last_upload_at": utc_now()})
        deps.state.update(sessions_collection(run), session_key, {
            "run_id": run, "session_id": named.session, "kind": "programmatic", "status": "UPLOADING",
            "updated_at": utc_now()})
        deps.on_event("register", {"uri": info.uri, "host": named.host})
    expected = _expected_hosts(deps, run)
    now = store_clock(deps)
    prepared = False
    while True:
        hosts = live_files(deps, named.root, named.run, named.session)
        newest = _newest(hosts) if hosts else None
        if newest is None or (newest.uri, newest.generation) != (info.uri, info.generation):
            return  # a newer file is in the folder (or this one is gone): that file's delivery announces the session
        quiet = deps.quiet_period_s if len(hosts) >= expected else deps.multi_host_quiet_period_s
        remaining = (newest.updated if newest.updated is not None else now()) + quiet - now()
        if remaining <= 0:
            break
        if not prepared and len(hosts) >= expected:  # every host is in: read the session while the period runs
            prepared = True
            _prepare_during_quiet_period(deps, hosts, named)
            continue
        deps.sleep(min(remaining, 1.0))
    capture = CaptureReady(
        analysis_id=analysis_id_for(run, named.session, hosts, deps.default_investigator),
        run_id=run, session_id=named.session, profile_uris=[h.uri for h in hosts],
        output_uri=output_uri(named.root, named.run, named.session), investigator=deps.default_investigator,
    )
    current = deps.state.get(sessions_collection(run), session_key) or {}
    if current.get("status") == "COMPLETE" and current.get("analysis_id") == capture.analysis_id:
        return  # announced already
    # The session's current analysis first (a stage of the one it replaces then stops), the announcement after.
    deps.state.update(sessions_collection(run), session_key, {
        "status": "COMPLETE", "analysis_id": capture.analysis_id, "inputs_key": inputs_key(hosts),
        "hosts": sorted(parse_profile_uri(h.uri).host for h in hosts), "files": capture.profile_uris,
        "completed_at": utc_now(), "updated_at": utc_now(),
        **({"previous_analysis_id": current["analysis_id"]} if current.get("analysis_id") else {})})
    if len(hosts) > expected:  # the next session of the run waits for this many hosts
        deps.state.update(RUNS, state_key(run), {"max_hosts": len(hosts)})
    deps.bus.publish(TOPIC_CAPTURES, capture)
    deps.on_event("register", {"complete": capture.session_id, "hosts": len(hosts), "analysis_id": capture.analysis_id})


DEAD_LETTER_EXCERPT_BYTES = 8 * 1024  # what a dead letter keeps in Firestore; the whole payload goes to the bucket
DEAD_LETTER_FOLDER = "xdiag-dead-letters"  # gs://BUCKET/xdiag-dead-letters/<topic>/<key>: outside any run's folder


def dead_letter(message: DeadLetter, deps: Dependencies) -> None:
    """Records a message that ended on a dead-letter topic (a bounded excerpt in Firestore, the whole payload in the
    bucket); where it belonged to an analysis, lets that analysis finish without it (a tool run becomes a failed
    tool, a lost stage fails the analysis). The letter's own ids are checked before they are used."""
    key = letter_key(message.source_topic, message.data)
    raw = message.data.encode("utf-8", errors="replace")
    record = {**message.model_dump(), "data": raw[:DEAD_LETTER_EXCERPT_BYTES].decode("utf-8", errors="replace"),
              "size_bytes": len(raw), "truncated": len(raw) > DEAD_LETTER_EXCERPT_BYTES, "at": utc_now()}
    if deps.profile_root:
        record["payload_uri"] = deps.blobs.put(
            f"{deps.profile_root}/{DEAD_LETTER_FOLDER}/{state_key(message.source_topic)}/{key}", raw,
            "application/octet-stream")
    deps.state.set(DEAD_LETTERS, key, record)
    deps.on_event("dead_letter", {"topic": message.source_topic, "reason": message.reason[:300]})
    message_type = MESSAGE_TYPES.get(message.source_topic)
    try:
        original = message_type.model_validate_json(message.data) if message_type else None
    except ValueError:
        return  # malformed, or an id outside the grammar: it belonged to nothing
    analysis = _load_analysis(deps, original.analysis_id) if getattr(original, "analysis_id", None) else None
    if analysis is None or analysis.status in TERMINAL:
        return
    if isinstance(original, ToolRun):
        if original.tool not in BROAD_TOOLS:
            return
        if deps.state.get(tools_collection(analysis.analysis_id), original.tool) is None:
            reason = f"the tool's run was dead-lettered: {message.reason}"
            _record_tool(deps, analysis, ToolResult(tool=original.tool, status=ToolStatus.FAILED, reason=reason))
        deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=original.tool,
                                                     attempt=original.attempt))
    elif isinstance(original, HostMapRun):
        info = _input_of(analysis, original)
        if info is None or analysis.status != "MAPPING_HOSTS":
            return
        deps.state.create(host_maps_collection(analysis.analysis_id), host_file_key(info), {
            "status": "FAILED", "uri": info.uri, "host": info.uri.rsplit("/", 1)[-1], "finished_at": utc_now(),
            "reason": f"{info.uri.rsplit('/', 1)[-1]}: its map was dead-lettered: {message.reason}"})
        _reduce_when_mapped(deps, analysis, original.attempt)
    elif isinstance(original, (CaptureReady, InvestigationReady)):
        fail_analysis(deps, analysis, f"stage for {message.source_topic} was dead-lettered: {message.reason}")
    elif isinstance(original, ReportReady):
        analysis.status, analysis.result = "FAILED", Status.FAILED
        analysis.failure_reason = f"rendering failed: {message.reason}"
        _save(deps, analysis)
