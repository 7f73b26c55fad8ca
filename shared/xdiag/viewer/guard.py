"""What XProf's server may be asked: only the sessions it was started to serve, and no path from the request.

XProf 2.24.2 takes paths from its callers: `run=/any/dir/session` is joined onto its log dir (an absolute one
replaces it), `session_path=`/`run_path=` name any folder outright, and `generate_cache`/`capture_profile` write
into one; each converts the xplanes found there and writes its caches beside them. Its gRPC worker answers
`GetProfileData(session_id=<any path>)` the same way, on every interface, with no authentication.

So `xdiag.viewer.server` starts XProf with this in front of its web app, and with its worker confined to the
loopback interface (the frontend is its only client, on the same machine or Cloud Run instance):

- a request naming a session (`run`) is answered only for a session of the allowed list (`xdiag view`: the
  sessions it linked; the Cloud Run viewer: those XProf lists in its bucket), otherwise 404, whether it exists
  or not; the session list shows only allowed sessions;
- `session_path`, `run_path`, captures (they go through the control plane) and cache generation are refused;
- `module_name` (read as a file name inside the session) may not hold a path;
- on Cloud Run (xdiag.viewer.access), a session only to the readers of its run, every request from a verified
  caller.

Every answer carries `X-Xdiag-Viewer: <nonce>`, so whoever started the server knows the answer is its own and not
another process's on the same port.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable, Iterable
from http import HTTPStatus
from urllib.parse import parse_qs

from xdiag.identity import Unauthenticated
from xdiag.viewer.access import CALLER_KEY, RunReaders

IDENTITY_HEADER = "X-Xdiag-Viewer"
REFUSED_ROUTES = ("/capture_profile", "/generate_cache")
PATH_ARGS = ("session_path", "run_path")


def refusal(path: str, query_string: str, allowed: Callable[[str], bool]) -> tuple[int, str] | None:
    """(status, reason) for a request XProf must not see; None for one it may answer."""
    if path.rstrip("/").endswith(REFUSED_ROUTES):
        return 403, "captures go through xdiag's control plane; the viewer only shows stored sessions"
    query = parse_qs(query_string, keep_blank_values=True)
    named = [arg for arg in PATH_ARGS if arg in query]
    if named:
        return 403, f"{', '.join(named)}: the viewer serves its sessions by name (run=<run path>/<session>), not by path"
    for run in query.get("run", []):
        if not allowed(run):
            return 404, f"no session {run[:200]!r} here"
    for module in query.get("module_name", []):
        if "/" in module or "\\" in module or ".." in module or "\x00" in module:
            return 400, "module_name is a module's name, not a path"
    return None


def guarded_app(app, allowed: Callable[[str], bool], nonce: str, readers: RunReaders | None = None):
    """XProf's WSGI app behind `refusal`, every answer marked with the nonce. With `readers` (the viewer on Cloud
    Run), every request needs a verified caller (401) and names only sessions of runs it may read (404 otherwise);
    the caller is left in the environ (CALLER_KEY) for the session list."""

    def application(environ, start_response):
        may_see = allowed
        refused = None
        if readers is not None:
            try:
                caller = environ[CALLER_KEY] = readers.caller(environ)
                may_see = lambda run: allowed(run) and readers.may_read(caller, run)  # noqa: E731
            except Unauthenticated as why:
                refused = 401, str(why)
        refused = refused or refusal(environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""), may_see)
        marked = [(IDENTITY_HEADER, nonce)]
        if refused:
            status, reason = refused
            start_response(f"{status} {HTTPStatus(status).phrase}", [("Content-Type", "text/plain; charset=utf-8"), *marked])
            return [reason.encode()]
        return app(environ, lambda status, headers, exc_info=None: start_response(status, [*headers, *marked], exc_info))

    return application


def listed_sessions(path: str) -> frozenset[str]:
    """The sessions `xdiag view` asked for (a JSON list of `<run path>/<session>`)."""
    with open(path) as file:
        return frozenset(json.load(file))


def confine_to_loopback(port: int, fds: Iterable[int]) -> int:
    """Binds every listening socket on `port` among `fds` to the loopback device (SO_BINDTODEVICE "lo": a
    connection arriving on any other interface is refused); returns how many. XProf's worker has no bind-address
    option and listens on every interface. Unprivileged since Linux 5.7; OSError where the kernel refuses."""
    confined = 0
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
        except OSError:
            continue  # closed meanwhile
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) or sock.getsockname()[1] != port:
                continue
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
            confined += 1
    return confined
