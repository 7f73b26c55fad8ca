"""The control plane's endpoints for share links, run readers and monitored events (see xdiag.sharing.links and
xdiag.capture.monitored_events):

    POST /v1/runs/{run}/sessions/{session}:share   {"expires_s"} → 201 {"url", "expires_at", "link_id", "by", "at", …}
    PUT  /v1/runs/{run}/readers                    {"readers": ["user:alice@example.com", …]} (by an owner)
    GET  /v1/events[?run=R]                        the monitored events, oldest first
    GET  /v1/events/{id}                           one event with the analyser's details, its capture and report
    GET  /v1/links/<bucket>/<object>?X-Goog-…      the local stack's link endpoint: the object, if the V4 signature
                                                   and expiry hold (no token: the signature is the credential)

`route` answers the requests it knows, `(status, body)` (body bytes for the link endpoint), or None for the
others; a refusal raises ShareRefused, a bad field InvalidRequest.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from xdiag.capture.monitored_events import describe_event, list_events
from xdiag.sharing.links import (
    LINK_PATH,
    MAX_EXPIRY_S,
    MIN_EXPIRY_S,
    IamSigner,
    KeySigner,
    ShareRefused,
    check_signed_link,
    make_link,
)
from xdiag.identity import Who
from xdiag.errors import InvalidRequest
from xdiag.ids import check_name, check_run_id
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import RUNS, get_run
from xdiag.pipeline.topics import ANALYSES, sessions_collection
from xdiag.report.viewer_links import viewer_links

SHARE_KEY_ENV = "XDIAG_SHARE_KEY_FILE"  # the local stack's link-signing key; unset in the cloud (IAM signs)
LINK_BASE_ENV = "XDIAG_CONTROL_PLANE_URL"  # where the local link endpoint answers: the control plane itself
MAX_READERS = 100


def _key_file() -> Path | None:
    value = os.environ.get(SHARE_KEY_ENV)
    return Path(value) if value else None


def _local_signer() -> KeySigner | None:
    """The local stack's signer, its links on the configured link endpoint (never on the Host a request names:
    a link is only as trustworthy as its host); None in the cloud."""
    key_file = _key_file()
    if key_file is None:
        return None
    base = os.environ.get(LINK_BASE_ENV)
    if not base:
        raise ShareRefused(503, f"{SHARE_KEY_ENV} is set but {LINK_BASE_ENV} is not: no link endpoint to point at")
    return KeySigner(key_file, base)


def serve_link(deps: Dependencies, path: str, query: Mapping[str, str]) -> tuple[int, Any]:
    """The local link endpoint: checks what Cloud Storage would, then serves the object."""
    signer = _local_signer() if _key_file() else None
    if signer is None:
        raise ShareRefused(404, "no link endpoint here: in the cloud, links are Cloud Storage's own signed URLs")
    bucket, name = check_signed_link(path, query, urlsplit(signer.base_url).netloc, signer.public_key(),
                                     dt.datetime.now(dt.timezone.utc))
    if f"gs://{bucket}" != deps.profile_root:
        raise ShareRefused(404, f"bucket {bucket!r} is not xdiag's")
    try:
        return 200, deps.blobs.get(f"gs://{bucket}/{name}")
    except FileNotFoundError:
        raise ShareRefused(404, f"gs://{bucket}/{name} is gone") from None


def route(deps: Dependencies, who: Who, method: str, path: str, query: Mapping[str, str],
          body: dict[str, Any]) -> tuple[int, Any] | None:
    parts = path.strip("/").split("/")
    if parts[:2] == ["v1", "events"] and method == "GET" and len(parts) in (2, 3):
        return _events(deps, parts[2:], query, who)
    if len(parts) == 5 and parts[:2] == ["v1", "runs"] and parts[3] == "sessions" and parts[4].endswith(":share"):
        if method != "POST":
            raise ShareRefused(405, f"{method} is not allowed on {path}")
        return _share(deps, parts[2], parts[4].removesuffix(":share"), body, who)
    if len(parts) == 4 and parts[:2] == ["v1", "runs"] and parts[3] == "readers":
        if method != "PUT":
            raise ShareRefused(405, f"{method} is not allowed on {path}")
        return _set_readers(deps, parts[2], body, who)
    return None


def _readable_run(deps: Dependencies, run_id: str, who: Who) -> dict[str, Any]:
    run = get_run(deps.state, check_run_id(run_id))
    if run is None:
        raise ShareRefused(404, f"unknown run {run_id!r}")
    if not who.may_read(run):
        raise ShareRefused(403, f"{who.caller} may not read run {run_id!r}")
    return run


def _share(deps: Dependencies, run_id: str, session_id: str, body: dict[str, Any], who: Who) -> tuple[int, Any]:
    unknown = set(body) - {"expires_s"}
    if unknown:
        raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
    expires_s = body.get("expires_s", MAX_EXPIRY_S)
    if isinstance(expires_s, bool) or not isinstance(expires_s, int) or not MIN_EXPIRY_S <= expires_s <= MAX_EXPIRY_S:
        raise InvalidRequest(f"expires_s {expires_s!r} is not valid: an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}")
    run = _readable_run(deps, run_id, who)
    session = deps.state.get(sessions_collection(run_id), state_key(check_name(session_id, "session id")))
    if session is None:
        raise ShareRefused(404, f"run {run_id!r} has no session {session_id!r}")
    analysis = deps.state.get(ANALYSES, session["analysis_id"]) if session.get("analysis_id") else None
    if not analysis or not analysis.get("report_uri"):
        raise ShareRefused(404, f"session {session_id!r} of run {run_id!r} has no report yet")
    local = _local_signer()
    link = make_link(deps.state, local or IamSigner(), run_id, session_id, analysis["report_uri"], who.caller, expires_s)
    run_path = run.get("path") or run_id
    link["viewer"] = dict(viewer_links(run_path, session_id))
    link["checked_by"] = "xdiag's link endpoint (the Cloud Storage emulator does not enforce expiry)" if local \
        else "Cloud Storage (V4 signed URL)"
    return 201, link


def _set_readers(deps: Dependencies, run_id: str, body: dict[str, Any], who: Who) -> tuple[int, Any]:
    readers = body.get("readers")
    if set(body) != {"readers"} or not isinstance(readers, list) or len(readers) > MAX_READERS or not all(
            isinstance(r, str) and r.partition(":")[0] in ("user", "group", "serviceAccount", "domain") and r.partition(":")[2]
            for r in readers):
        raise InvalidRequest('readers must be {"readers": ["user:EMAIL" | "group:EMAIL" | "serviceAccount:EMAIL", …]}')
    run = _readable_run(deps, run_id, who)
    if not who.identity.may_name_readers(run, who.caller):  # a reader, or the first to ask, takes nothing over
        raise ShareRefused(403, f"{who.caller} is not an owner of run {run_id!r}: only its owners name its readers")
    deps.state.update(RUNS, state_key(run_id), {"readers": readers})
    return 200, {"run_id": run_id, "readers": readers}


def _visible(deps: Dependencies, run_id: str | None, who: Who) -> bool:
    """An event of a run the caller may read (or of no known run: an alert that named none, or an unknown one)."""
    run = get_run(deps.state, run_id) if run_id else None
    return run is None or who.may_read(run)


def _events(deps: Dependencies, rest: list[str], query: Mapping[str, str], who: Who) -> tuple[int, Any]:
    if rest:
        event = describe_event(deps.state, rest[0])
        if event is None or not _visible(deps, event.get("run_id"), who):
            raise ShareRefused(404, f"no event {rest[0]!r}")
        return 200, event
    run_id = query.get("run")
    if run_id:
        _readable_run(deps, run_id, who)
    return 200, {"events": [e for e in list_events(deps.state, run_id) if _visible(deps, e["run_id"], who)]}


LINKS_PREFIX = LINK_PATH + "/"
