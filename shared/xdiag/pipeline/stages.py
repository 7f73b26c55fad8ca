"""The pipeline's stages: collect → run_tool × each broad tool → aggregate → investigate → render.

Each stage is a handler `(message, deps)` that reads and writes through the ports and
publishes the next message. The same handlers run in-process for `xdiag analyze` and
behind Cloud Functions in the cloud. Every handler is idempotent: Pub/Sub delivers at
least once, so a second delivery finds its work done and changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

from xdiag.errors import PoisonMessage, ProfileError, UnknownTool
from xdiag.investigators import MAX_FOLLOW_UP_CALLS, health_snapshot
from xdiag.model import (
    Analysis,
    CaptureReady,
    DeadLetter,
    FollowUpCall,
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
from xdiag.pipeline.deps import PREPARED_SESSION, Dependencies
from xdiag.pipeline.layout import (
    analysis_id_for,
    output_uri,
    parse_profile_uri,
    session_files,
    session_prefix,
    state_key,
)
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.runs import CAPTURED_KINDS, RUNS, run_for_path, run_path
from xdiag.pipeline.topics import (
    ANALYSES,
    CLAIMS,
    DEAD_LETTERS,
    MESSAGE_TYPES,
    TOPIC_CAPTURES,
    TOPIC_INVESTIGATIONS,
    TOPIC_REPORTS,
    TOPIC_TOOL_RESULTS,
    TOPIC_TOOL_RUNS,
    files_collection,
    letter_key,
    sessions_collection,
    tools_collection,
)
from xdiag.profile.space import Session
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
    }


def resolve_capture(message: CaptureReady, deps: Dependencies) -> CaptureReady:
    """Completes a manual request that names only the run and session (or only the files) from the bucket.

    Raises PoisonMessage where no retry can help: an unknown session, a missing object, nowhere to write.
    """
    if message.analysis_id and message.profile_uris and message.output_uri:
        return message
    root = deps.profile_root
    if message.profile_uris:
        infos = [(uri, deps.blobs.stat(uri)) for uri in message.profile_uris]
        missing = [uri for uri, info in infos if info is None]
        if missing:
            raise PoisonMessage(f"missing object: {', '.join(missing)}")
        files = [info for _, info in infos]
        named = parse_profile_uri(message.profile_uris[0])
        root = named.root if named else root
    elif not root:
        raise PoisonMessage("the capture names no profile files, and no profile root is configured to look them up")
    else:
        files = session_files(deps.blobs, root, run_path(deps.state, message.run_id), message.session_id)
        if not files:
            folder = session_prefix(root, run_path(deps.state, message.run_id), message.session_id)
            raise PoisonMessage(f"unknown session: no *.xplane.pb under {folder}")
    if not message.output_uri and not root:
        raise PoisonMessage("the capture names no output_uri, and its files are not in the <run>/plugins/profile/<session>/ layout")
    analysis_id = message.analysis_id or analysis_id_for(message.run_id, message.session_id, files, message.investigator)
    return message.model_copy(update={
        "analysis_id": analysis_id,
        "profile_uris": [info.uri for info in files],
        "output_uri": message.output_uri or output_uri(root, run_path(deps.state, message.run_id), message.session_id),
    })


def _fail_analysis(deps: Dependencies, analysis: Analysis, reason: str) -> None:
    """Records why the analysis failed and has the report say so."""
    analysis.status, analysis.result, analysis.failure_reason = "FAILED", Status.FAILED, reason
    _save(deps, analysis)
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id))


def collect(message: CaptureReady, deps: Dependencies) -> None:
    """Fan-out: record the analysis, read the session once, publish one ToolRun per broad tool."""
    message = resolve_capture(message, deps)
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        fresh = Analysis(
            analysis_id=message.analysis_id, run_id=message.run_id, session_id=message.session_id,
            profile_uris=message.profile_uris, output_uri=message.output_uri, investigator=message.investigator,
        )
        deps.state.create(ANALYSES, message.analysis_id, fresh.model_dump(mode="json"))
        analysis = _load_analysis(deps, message.analysis_id)
    if analysis.status in ("DONE", "FAILED"):
        return
    if analysis.status != "PENDING":  # collected already: a copy must not write over a later stage's state
        if analysis.status == "RUNNING_TOOLS":
            _publish_tool_runs(deps, analysis)  # the first delivery may have died before publishing them all
        return
    started = time.perf_counter()
    try:
        session = _session(deps, analysis)
    except ProfileError as exc:
        deps.on_event("collect", {"failed": str(exc)})
        _fail_analysis(deps, analysis, str(exc))
        return
    analysis.profile = describe(session)
    analysis.status = "RUNNING_TOOLS"
    analysis.timings_ms["read"] = round(deps.sessions.read_ms.get(tuple(analysis.profile_uris), 0.0), 1)
    analysis.timings_ms["collect"] = round((time.perf_counter() - started) * 1000, 1)
    analysis.timeline["collect"] = utc_now()
    _save(deps, analysis)
    deps.on_event("collect", analysis.profile)
    _publish_tool_runs(deps, analysis)


def _session(deps: Dependencies, analysis: Analysis) -> Session:
    return deps.sessions.load(analysis.profile_uris, analysis.session_id, _join(analysis.output_uri, PREPARED_SESSION))


def _publish_tool_runs(deps: Dependencies, analysis: Analysis) -> None:
    done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    for tool in BROAD_TOOLS:
        if tool not in done:
            deps.bus.publish(TOPIC_TOOL_RUNS, ToolRun(analysis_id=analysis.analysis_id, tool=tool))


def _store_result(deps: Dependencies, analysis: Analysis, result: ToolResult, name: str) -> str:
    uri = _join(analysis.output_uri, f"tools/{name}.json")
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
    """Runs one tool on the session and stores its result; a second delivery only re-announces it."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    if deps.state.get(tools_collection(analysis.analysis_id), message.tool) is None:
        try:
            session = _session(deps, analysis)
            result = execute_tool(session, message.tool, message.args)
        except (ProfileError, UnknownTool) as exc:
            result = ToolResult(tool=message.tool, status=ToolStatus.FAILED, reason=str(exc))
        _record_tool(deps, analysis, result)
        deps.on_event("run_tool", {"tool": message.tool, "status": result.status.value, "duration_ms": result.duration_ms})
    deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=message.tool))


def aggregate(message: ToolDone, deps: Dependencies) -> None:
    """Fan-in: when every broad tool has a result, claim the investigation exactly once."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None or analysis.status in ("DONE", "FAILED"):
        return
    done = {key for key, _ in deps.state.list(tools_collection(analysis.analysis_id))}
    if not set(BROAD_TOOLS) <= done:
        return
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.investigate", {"at": utc_now()}):
        deps.on_event("aggregate", {"tools": len(done)})
        deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=analysis.analysis_id))


def load_results(deps: Dependencies, analysis: Analysis) -> dict[str, ToolResult]:
    results = {}
    for tool, doc in deps.state.list(tools_collection(analysis.analysis_id)):
        if doc.get("uri") and deps.blobs.exists(doc["uri"]):
            results[tool] = ToolResult.model_validate_json(deps.blobs.get(doc["uri"]))
    return results


def investigate(message: InvestigationReady, deps: Dependencies) -> None:
    """Health snapshot → OPTIMAL, or hypotheses with at most MAX_FOLLOW_UP_CALLS follow-up tools → findings."""
    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.diagnosis is None and analysis.status != "FAILED":
        started = time.perf_counter()
        results = load_results(deps, analysis)
        health = health_snapshot(results)
        session = _session(deps, analysis)
        refused: list[FollowUpCall] = []
        made: list[int] = [0]

        def call_tool(name: str, args: dict[str, Any], hypothesis: str) -> ToolResult | None:
            if name not in FOLLOW_UP_TOOLS:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: {name!r} is not a follow-up tool"))
                return ToolResult(tool=name, status=ToolStatus.FAILED, reason=refused[-1].reason)
            try:  # a call with bad arguments is refused before it spends any of the budget
                validate_args(REGISTRY[name], args)
            except ValueError as exc:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: bad arguments: {exc}"))
                return ToolResult(tool=name, status=ToolStatus.FAILED, reason=refused[-1].reason)
            if made[0] >= MAX_FOLLOW_UP_CALLS:
                refused.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis, status=ToolStatus.FAILED,
                                            reason=f"refused: the limit of {MAX_FOLLOW_UP_CALLS} follow-up calls is reached"))
                return None
            made[0] += 1
            result = execute_tool(session, name, args)
            _store_result(deps, analysis, result, f"followup-{made[0]}-{name}")
            deps.on_event("follow_up", {"tool": name, "status": result.status.value})
            return result

        chosen = analysis.investigator if analysis.investigator in deps.investigators else "rules"
        investigator = deps.investigators[chosen]()
        diagnosis = investigator.investigate(health, results, call_tool)
        diagnosis.follow_up_calls.extend(refused)
        if chosen != analysis.investigator and not diagnosis.investigator_note:
            diagnosis.investigator_note = f"investigator {analysis.investigator!r} is not configured; used the rule engine"
        analysis.health = health
        analysis.diagnosis = diagnosis
        analysis.result = diagnosis.status
        analysis.status = "RENDERING"
        analysis.tools = {t: {"status": r.status.value, "reason": r.reason, "duration_ms": round(r.duration_ms, 2)} for t, r in results.items()}
        analysis.timings_ms["tools"] = round(sum(r.duration_ms for r in results.values()), 1)
        analysis.timings_ms["investigate"] = round((time.perf_counter() - started) * 1000, 1)
        analysis.timeline["investigate"] = utc_now()
        _save(deps, analysis)
        deps.on_event("investigate", {"status": diagnosis.status.value, "findings": len(diagnosis.findings)})
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id))


def render(message: ReportReady, deps: Dependencies) -> None:
    """Writes summary.html and analysis.json next to the profile; marks the analysis DONE (or FAILED)."""
    from xdiag.pipeline.previous import compare_with_previous
    from xdiag.report import render_summary_html

    analysis = _load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.status in ("DONE", "FAILED") and analysis.report_uri and deps.blobs.exists(analysis.report_uri):
        return  # rendered already: a redelivery writes no second report
    started = time.perf_counter()
    results = load_results(deps, analysis)
    report_uri = _join(analysis.output_uri, "summary.html")
    analysis.report_uri = report_uri
    if analysis.status != "FAILED":
        analysis.status = "DONE"
    previous = compare_with_previous(deps, analysis, results) if analysis.status == "DONE" else None
    html = render_summary_html(analysis, results, previous=previous)
    deps.blobs.put(report_uri, html.encode(), "text/html; charset=utf-8")
    analysis.timings_ms["render"] = round((time.perf_counter() - started) * 1000, 1)
    analysis.timeline["render"] = utc_now()
    deps.blobs.put(_join(analysis.output_uri, "analysis.json"), analysis.model_dump_json(indent=2).encode(), "application/json")
    _save(deps, analysis)
    deps.on_event("render", {"report": report_uri, "status": analysis.status})


def register(message: ProfileUploaded, deps: Dependencies) -> None:
    """Records one host's file of a session; once no newer file has come for the quiet period, announces the
    session on `captures` (all its hosts in one CaptureReady). Objects outside the profile layout are ignored.

    Only the delivery of the newest file waits out the quiet period; the others return at once. Announcing
    is at-least-once (a crash between publish and record re-announces), which collect absorbs: the same
    file versions always name the same analysis.
    """
    named = parse_profile_uri(message.uri)
    if named is None:
        deps.on_event("register", {"ignored": message.uri})
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
    record = {"uri": info.uri, "host": named.host, "size": info.size, "generation": info.generation,
              "registered_at": time.time()}
    known = deps.state.get(files, state_key(named.host))
    if known is None or known.get("generation") != info.generation:  # a new file, or a new version of one
        deps.state.set(files, state_key(named.host), record)
        deps.state.update(RUNS, state_key(run), {
            "run_id": run, "base_uri": f"{named.root}/{named.run}", "last_upload_at": utc_now()})
        deps.state.update(sessions_collection(run), session_key, {
            "run_id": run, "session_id": named.session, "kind": "programmatic", "status": "UPLOADING",
            "updated_at": utc_now()})
        deps.on_event("register", {"uri": info.uri, "host": named.host})
    else:
        record = known
    while True:
        registered = [doc for _, doc in deps.state.list(files)]
        newest = max(doc["registered_at"] for doc in registered)
        if record["registered_at"] < newest:
            return  # a newer file arrived: its delivery announces the session
        remaining = newest + deps.quiet_period_s - time.time()
        if remaining <= 0:
            break
        deps.sleep(min(remaining, 1.0))
    hosts = [BlobInfo(uri=doc["uri"], size=doc["size"], generation=doc["generation"]) for doc in registered]
    capture = CaptureReady(
        analysis_id=analysis_id_for(run, named.session, hosts, deps.default_investigator),
        run_id=run, session_id=named.session, profile_uris=sorted(h.uri for h in hosts),
        output_uri=output_uri(named.root, named.run, named.session), investigator=deps.default_investigator,
    )
    current = deps.state.get(sessions_collection(run), session_key) or {}
    if current.get("status") == "COMPLETE" and current.get("analysis_id") == capture.analysis_id:
        return  # announced already
    deps.bus.publish(TOPIC_CAPTURES, capture)
    deps.state.update(sessions_collection(run), session_key, {
        "status": "COMPLETE", "analysis_id": capture.analysis_id, "hosts": sorted(doc["host"] for doc in registered),
        "files": capture.profile_uris, "completed_at": utc_now(), "updated_at": utc_now()})
    deps.on_event("register", {"complete": capture.session_id, "hosts": len(hosts), "analysis_id": capture.analysis_id})


def dead_letter(message: DeadLetter, deps: Dependencies) -> None:
    """Records a message that ended on a dead-letter topic; where it belonged to an analysis, lets that
    analysis finish without it (a tool run becomes a failed tool, a lost stage fails the analysis)."""
    key = letter_key(message.source_topic, message.data)
    deps.state.set(DEAD_LETTERS, key, {**message.model_dump(), "at": utc_now()})
    deps.on_event("dead_letter", {"topic": message.source_topic, "reason": message.reason})
    message_type = MESSAGE_TYPES.get(message.source_topic)
    try:
        original = message_type.model_validate_json(message.data) if message_type else None
    except ValueError:
        return  # malformed: it belonged to nothing
    analysis = _load_analysis(deps, original.analysis_id) if getattr(original, "analysis_id", None) else None
    if analysis is None or analysis.status in ("DONE", "FAILED"):
        return
    if isinstance(original, ToolRun):
        if deps.state.get(tools_collection(analysis.analysis_id), original.tool) is None:
            reason = f"the tool's run was dead-lettered: {message.reason}"
            _record_tool(deps, analysis, ToolResult(tool=original.tool, status=ToolStatus.FAILED, reason=reason))
        deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=original.tool))
    elif isinstance(original, (CaptureReady, InvestigationReady)):
        _fail_analysis(deps, analysis, f"stage for {message.source_topic} was dead-lettered: {message.reason}")
    elif isinstance(original, ReportReady):
        analysis.status, analysis.result = "FAILED", Status.FAILED
        analysis.failure_reason = f"rendering failed: {message.reason}"
        _save(deps, analysis)
