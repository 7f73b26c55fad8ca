"""XProf's own server (`xprof.server` from the pinned `xprof` wheel), started as a child process over a logdir.

XProf always starts its gRPC worker service too (`--grpc_port`, 50051 by default), so each server gets a free one.
Its web server binds every interface; `xdiag view` binds the loopback address unless asked otherwise (the profiles
are the user's), by starting the server through `python -m xdiag.viewer.server` (below), which is XProf's `main`
with the bind address fixed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from xdiag.local_ports import free_ports

RUNS_PATH = "/data/plugin/profile/runs"
BIND_ENV = "XDIAG_VIEWER_BIND"


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


def start_xprof(logdir: str, log: Path, port: int | None = None, bind: str = "127.0.0.1",
                hide_capture_button: bool = True, timeout_s: float = 60.0, env: dict[str, str] | None = None) -> XprofServer:
    """Starts XProf's server over `logdir` (a folder, or gs://BUCKET for Cloud Storage) and returns once it
    answers its session list."""
    chosen = free_ports(3)  # three, so one differs from a `port` given
    port = port or chosen[0]
    grpc_port = next(p for p in chosen if p != port)
    argv = [sys.executable, "-m", "xdiag.viewer.server", f"--logdir={logdir}", f"--port={port}",
            f"--grpc_port={grpc_port}"]
    if hide_capture_button:
        argv.append("--hide_capture_profile_button")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, **(env or {}), BIND_ENV: bind})
    host = "127.0.0.1" if bind in ("127.0.0.1", "0.0.0.0", "::") else bind
    server = XprofServer(process, f"http://{host}:{port}", logdir, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ViewerError(f"XProf's server exited with status {process.returncode}: {_tail(log)}")
        try:
            with urllib.request.urlopen(server.url + RUNS_PATH, timeout=5) as answer:
                if answer.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    server.stop()
    raise ViewerError(f"XProf's server did not answer {RUNS_PATH} within {timeout_s:.0f} s: {_tail(log)}")


def _tail(log: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _main() -> int:
    """XProf's own `main`, bound to XDIAG_VIEWER_BIND instead of every interface."""
    from xprof import server

    bind = os.environ.get(BIND_ENV)
    if bind:
        server._get_wildcard_address = lambda port: bind  # XProf has no flag for it
    return server.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_main())
