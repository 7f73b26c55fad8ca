"""The analysis record every stage reads and writes: loading and saving it, its exact inputs and its own folder,
whether it is still its session's current analysis (else SUPERSEDED), failing it; the session it reads, and a
session folder's host files as they are now."""

from __future__ import annotations

from xdiag.errors import InvalidRequest
from xdiag.model import Analysis, ReportReady, Status, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import (
    ProfileObject,
    check_profile_object,
    inputs_key,
    parse_profile_uri,
    recorded_input,
    session_files,
    state_key,
)
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.topics import ACTIVE_ANALYSES, ANALYSES, TERMINAL, TOPIC_REPORTS, sessions_collection
from xdiag.profile.space import Session


def join_uri(prefix: str, name: str) -> str:
    """`name` inside the folder `prefix` (with or without its trailing slash)."""
    return prefix.rstrip("/") + "/" + name


def load_analysis(deps: Dependencies, analysis_id: str) -> Analysis | None:
    """The analysis' record, or None where none was recorded."""
    doc = deps.state.get(ANALYSES, analysis_id)
    return Analysis.model_validate(doc) if doc else None


def save_analysis(deps: Dependencies, analysis: Analysis) -> None:
    """Writes the record; a finished, failed or superseded analysis leaves the active ones."""
    analysis.updated_at = utc_now()
    deps.state.set(ANALYSES, analysis.analysis_id, analysis.model_dump(mode="json"))
    if analysis.status in TERMINAL:
        deps.state.delete(ACTIVE_ANALYSES, analysis.analysis_id)


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


def analysis_inputs(analysis: Analysis) -> list[BlobInfo]:
    """The exact file versions the analysis covers."""
    return [recorded_input(i) for i in analysis.inputs]


def work_folder(analysis: Analysis) -> str:
    """The analysis' own folder (its tools' results, its report), or the output folder where it has none."""
    return analysis.work_uri or analysis.output_uri


def is_current(deps: Dependencies, analysis: Analysis) -> bool:
    """False (and the analysis marked SUPERSEDED, once) where its session has moved on to other files: a host
    arrived late, or a file was replaced, and a newer analysis covers them. Its stages then stop, and it never
    writes the session's report."""
    if analysis.status == "SUPERSEDED":
        return False
    session = deps.state.get(sessions_collection(analysis.run_id), state_key(analysis.session_id)) or {}
    newer = session.get("analysis_id")
    if (not newer or newer == analysis.analysis_id
            or session.get("inputs_key") in (None, inputs_key(analysis_inputs(analysis)))):
        return True
    if analysis.status not in TERMINAL:
        analysis.status, analysis.superseded_by = "SUPERSEDED", newer
        analysis.failure_reason = (f"superseded by analysis {newer}: the session's files changed (a host arrived late "
                                   "or a file was replaced) and the newer analysis covers them")
        save_analysis(deps, analysis)
        deps.on_event("superseded", {"analysis_id": analysis.analysis_id, "by": newer})
    return False


def fail_analysis(deps: Dependencies, analysis: Analysis, reason: str) -> None:
    """Records why the analysis failed and has the report say so."""
    analysis.status, analysis.result, analysis.failure_reason = "FAILED", Status.FAILED, reason
    save_analysis(deps, analysis)
    deps.bus.publish(TOPIC_REPORTS, ReportReady(analysis_id=analysis.analysis_id, attempt=analysis.repairs))


def analysis_session(deps: Dependencies, analysis: Analysis, events: bool = False) -> Session:
    """The analysis' session; with `events` its hosts' events too (the follow-ups), where the broad tools read a
    many-host session from its hosts' summaries."""
    if not analysis.inputs:  # recorded before inputs were: the files as they are now
        analysis.inputs = [{"uri": i.uri, "generation": i.generation, "size": i.size}
                           for i in (deps.blobs.stat(uri) for uri in analysis.profile_uris) if i is not None]
    return deps.sessions.load(analysis_inputs(analysis), analysis.session_id, analysis.output_uri, events)
