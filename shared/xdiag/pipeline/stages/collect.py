"""Stage `collect` (`captures` → `host-maps` or `tool-runs`): what does an analysis cover, and can it be read?
Resolves a capture to its exact file versions, records the analysis, checks the session's limits, sends a many-host
session to the map stage first, then reads the session and fans out one ToolRun per broad tool."""

from __future__ import annotations

import time
from typing import Any

from xdiag.errors import PoisonMessage, ProfileError
from xdiag.model import Analysis, CaptureReady, HostMapRun, ToolRun, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import (
    analysis_folder,
    analysis_id_for,
    host_file_key,
    host_summary_uri,
    inputs_key,
    output_uri,
    parse_profile_uri,
    prepared_host_uri,
    session_prefix,
    state_key,
)
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.runs import run_path
from xdiag.pipeline.stages.analysis_record import (
    analysis_inputs,
    analysis_session,
    fail_analysis,
    is_current,
    live_files,
    load_analysis,
    save_analysis,
)
from xdiag.pipeline.topics import (
    ACTIVE_ANALYSES,
    ANALYSES,
    TERMINAL,
    TOPIC_HOST_MAPS,
    TOPIC_TOOL_RUNS,
    host_maps_collection,
    sessions_collection,
    tools_collection,
)
from xdiag.profile.space import Session
from xdiag.profile.trace_json import trace_format
from xdiag.sizes import readable_size
from xdiag.tools import BROAD_TOOLS, XPROF_RECORD_TOOLS


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


def _claim_session(deps: Dependencies, analysis: Analysis) -> None:
    """A manual request whose files are the session's live files (newer than its current analysis') becomes the
    session's current analysis."""
    if not deps.profile_root:
        return
    key = inputs_key(analysis_inputs(analysis))
    session = deps.state.get(sessions_collection(analysis.run_id), state_key(analysis.session_id))
    if session is None or session.get("inputs_key") in (None, key):
        return
    live = live_files(deps, deps.profile_root, run_path(deps.state, analysis.run_id), analysis.session_id)
    if inputs_key(live) == key:
        deps.state.update(sessions_collection(analysis.run_id), state_key(analysis.session_id), {
            "analysis_id": analysis.analysis_id, "inputs_key": key, "updated_at": utc_now()})


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
    inputs = analysis_inputs(analysis)
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
        save_analysis(deps, analysis)
        deps.on_event("collect", {"mapping": len(missing), "hosts": len(inputs)})
    deps.bus.publish_all(TOPIC_HOST_MAPS, [HostMapRun(analysis_id=analysis.analysis_id, uri=info.uri,
                                                      generation=info.generation, attempt=attempt) for info in missing])
    return None, True


def collect(message: CaptureReady, deps: Dependencies) -> None:
    """Fan-out: record the analysis with its exact inputs, read the session once, publish one ToolRun per tool.
    A many-host session is first mapped, one map_host per host file; the maps' fan-in announces it here again, and
    this read assembles what they decoded (the reduce)."""
    message, files = resolve_capture(message, deps)
    analysis = load_analysis(deps, message.analysis_id)
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
            analysis = load_analysis(deps, message.analysis_id)
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
        session = analysis_session(deps, analysis)
    except ProfileError as exc:
        deps.on_event("collect", {"failed": str(exc)})
        fail_analysis(deps, analysis, str(exc))
        return
    analysis.profile = describe(session)
    analysis.status = "RUNNING_TOOLS"
    analysis.timings_ms["read"] = round(deps.sessions.read_ms.get(_loader_key(analysis), 0.0), 1)
    analysis.timings_ms["collect"] = round((time.perf_counter() - started) * 1000, 1)
    analysis.timeline["collect"] = utc_now()
    save_analysis(deps, analysis)
    deps.on_event("collect", analysis.profile)
    publish_tool_runs(deps, analysis, done=set())  # none ran: tool runs are published only once RUNNING_TOOLS is saved


def _loader_key(analysis: Analysis) -> tuple[BlobInfo, ...]:
    return tuple(sorted(analysis_inputs(analysis), key=lambda i: i.uri))


def publish_tool_runs(
    deps: Dependencies, analysis: Analysis, attempt: int = 0, done: set[str] | None = None
) -> list[str]:
    """ToolRuns for the broad tools without a result (`done`: those with one, where the caller knows); returns their
    names. Those that read XProf's converted views go last (`XPROF_RECORD_TOOLS`): in one process, the others then
    run while the converter a report waits for still converts (87.6 MiB TPU v5e capture: xdiag's own tools, 1-2 s,
    no longer after its views)."""
    if done is None:
        done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    missing = sorted((tool for tool in BROAD_TOOLS if tool not in done), key=lambda tool: tool in XPROF_RECORD_TOOLS)
    deps.bus.publish_all(TOPIC_TOOL_RUNS, [ToolRun(analysis_id=analysis.analysis_id, tool=tool, attempt=attempt)
                                           for tool in missing])
    return missing
