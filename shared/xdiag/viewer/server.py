"""XProf's own server (`xprof.server` from the pinned `xprof` wheel), started as a child process over a logdir.

XProf always starts its gRPC worker service too (`--grpc_port`, 50051 by default), so each server gets a free one,
and its frontend sends every conversion to it. Its web server binds every interface; `xdiag view` binds the
loopback address unless asked otherwise (the profiles are the user's). Both go through `python -m
xdiag.viewer.server` (below): XProf's `main` with the bind address fixed, its worker confined to the loopback
interface, and its web app behind xdiag.viewer.guard (only the sessions asked for; no paths from requests).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xdiag.local_ports import free_ports
from xdiag.viewer.access import CALLER_KEY, RunReaders
from xdiag.viewer.guard import IDENTITY_HEADER, confine_to_loopback, guarded_app, listed_sessions

RUNS_PATH = "/data/plugin/profile/runs"
BIND_ENV = "XDIAG_VIEWER_BIND"
SESSIONS_ENV = "XDIAG_VIEWER_SESSIONS"  # a JSON file listing the sessions to serve; unset: those XProf lists
NONCE_ENV = "XDIAG_VIEWER_NONCE"  # sent back in every answer: this server's, not another's on the port
LISTING_REFRESH_S = 10.0  # without a list, an unknown session name rereads XProf's listing at most this often


@dataclass
class XprofServer:
    process: subprocess.Popen
    url: str
    logdir: str
    log: Path

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ends the server's process group (XProf's C++ threads included) and waits for it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout_s)
            except ProcessLookupError:
                pass


class ViewerError(RuntimeError):
    """XProf's server did not come up; the message says why (with the end of its log)."""


def start_xprof(logdir: str, log: Path, sessions: list[str], port: int | None = None, bind: str = "127.0.0.1",
                hide_capture_button: bool = True, timeout_s: float = 60.0, env: dict[str, str] | None = None) -> XprofServer:
    """Starts XProf's server over `logdir` (a folder, or gs://BUCKET for Cloud Storage), serving only `sessions`
    (`<run path>/<session>`), and returns once it answers its session list. ViewerError where the port is taken
    (the URL would be another process's) or the server does not come up."""
    host = "127.0.0.1" if bind in ("127.0.0.1", "0.0.0.0", "::") else bind
    if port and not _port_free(bind, port):
        raise ViewerError(f"port {port} on {bind} is taken by another process (another xdiag view?): choose one with "
                          "--port, or --port 0 for any free one")
    chosen = free_ports(3)  # three, so one differs from a `port` given
    port = port or chosen[0]
    grpc_port = next(p for p in chosen if p != port)
    argv = [sys.executable, "-m", "xdiag.viewer.server", f"--logdir={logdir}", f"--port={port}",
            f"--grpc_port={grpc_port}", f"--worker_service_address=127.0.0.1:{grpc_port}"]
    if hide_capture_button:
        argv.append("--hide_capture_profile_button")
    log.parent.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(16)
    listed = log.parent / f"sessions.{nonce}.json"  # XProf's process reads it once at start
    listed.write_text(json.dumps(sorted(sessions)))
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, **(env or {}), BIND_ENV: bind,
                                                                SESSIONS_ENV: str(listed), NONCE_ENV: nonce})
    server = XprofServer(process, f"http://{host}:{port}", logdir, log)
    try:
        _wait_until_it_answers(server, nonce, timeout_s)
    except ViewerError:
        server.stop()
        raise
    finally:
        listed.unlink(missing_ok=True)
    return server


def _wait_until_it_answers(server: XprofServer, nonce: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ViewerError(f"XProf's server exited with status {server.process.returncode}: {_tail(server.log)}")
        try:
            answer = urllib.request.urlopen(server.url + RUNS_PATH, timeout=5)
        except urllib.error.HTTPError as refused:
            answer = refused
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
            continue
        with answer:
            if answer.headers.get(IDENTITY_HEADER) != nonce:
                raise ViewerError(f"{server.url} is answered by another process (the port was taken meanwhile)")
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise ViewerError(f"XProf's server did not answer {RUNS_PATH} within {timeout_s:.0f} s: {_tail(server.log)}")


def _port_free(bind: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((bind, port))  # no SO_REUSEADDR: a port in use anywhere on this address fails
        except OSError:
            return False
    return True


def _tail(log: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _main() -> int:
    """XProf's own `main`, its web server bound to XDIAG_VIEWER_BIND instead of every interface, its worker to the
    loopback interface, its web app behind xdiag.viewer.guard (the sessions of XDIAG_VIEWER_SESSIONS, else those
    XProf lists; on Cloud Run, to the readers of their runs: xdiag.viewer.access). XProf has no option for any of
    these."""
    from xprof import server

    bind = os.environ.get(BIND_ENV)
    if bind:
        server._get_wildcard_address = lambda port: bind
    nonce = os.environ.get(NONCE_ENV, "")
    listed = os.environ.get(SESSIONS_ENV)
    start_worker, make_app = server._pywrap_profiler_plugin.start_grpc_server, server.make_wsgi_app

    def start_confined_worker(port: int, max_concurrent_requests: int) -> None:
        start_worker(port, max_concurrent_requests)
        if not confine_to_loopback(port, (int(fd) for fd in os.listdir("/proc/self/fd"))):
            raise SystemExit(f"XProf's worker on port {port} could not be confined to the loopback interface: "
                             "not serving")

    readers = RunReaders.from_env(os.environ)

    def make_guarded_app(plugin):
        every_session = plugin.runs_imp
        allowed = listed_sessions(listed).__contains__ if listed else _listing(every_session)

        def sessions(request=None) -> list[str]:
            caller = getattr(request, "environ", {}).get(CALLER_KEY)
            return [run for run in every_session(request) if allowed(run) and
                    (readers is None or (caller is not None and readers.may_read(caller, run)))]

        plugin.runs_imp = sessions
        return guarded_app(make_app(plugin), allowed, nonce, readers)

    server._pywrap_profiler_plugin.start_grpc_server = start_confined_worker
    server.make_wsgi_app = make_guarded_app
    return server.main(sys.argv[1:])


def _listing(every_session: Callable[..., list[str]]) -> Callable[[str], bool]:
    """Whether XProf lists a session; an unknown name rereads the listing at most every LISTING_REFRESH_S."""
    known: dict[str, object] = {"sessions": frozenset(), "at": -LISTING_REFRESH_S}

    def allowed(run: str) -> bool:
        if run not in known["sessions"] and time.monotonic() - known["at"] >= LISTING_REFRESH_S:
            known.update(sessions=frozenset(every_session(None)), at=time.monotonic())
        return run in known["sessions"]

    return allowed


if __name__ == "__main__":
    sys.exit(_main())
