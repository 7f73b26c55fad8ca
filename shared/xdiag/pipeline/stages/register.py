"""Stage `register` (`profile-uploads` → `captures`): when has a session finished uploading? Records each host
file as it lands and, once the session's folder has been quiet for the quiet period (on the store's clock),
announces the whole session in one CaptureReady."""

from __future__ import annotations

import time

from xdiag.errors import InvalidRequest, PoisonMessage
from xdiag.model import CaptureReady, ProfileUploaded, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import (
    ProfileObject,
    analysis_id_for,
    check_profile_object,
    inputs_key,
    output_uri,
    parse_profile_uri,
    state_key,
)
from xdiag.pipeline.ports import BlobInfo
from xdiag.pipeline.runs import CAPTURED_KINDS, RUNS, list_targets, run_for_path
from xdiag.pipeline.stages.analysis_record import live_files
from xdiag.pipeline.topics import TOPIC_CAPTURES, files_collection, sessions_collection


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
