"""One call of `xdiag mcp` in a process of its own (`python -m xdiag.agent.mcp_worker SERVER_PID`): the call as JSON
on stdin, `{"answer": …}` or `{"error": reason}` as JSON on stdout. The server starts it in a session of its own, so
that a cancelled call ends with every process it started (XProf's conversion workers included); it ends itself, with
what it started, where the server dies."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path


def _end_with_the_server(server: int) -> None:
    """A server killed outright cannot kill its workers: each ends with it instead of running its call to the end
    for nobody. On Linux the kernel kills the worker when the server dies (PR_SET_PDEATHSIG, set from the main
    thread: the signal is the forked thread's; at once, even inside a long C call); a thread then kills what the
    worker started (its process group) once the server is gone. `server` is its process id, as the server gave it
    (the parent read here would be whoever adopted the worker, were the server gone already)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the thread alone
        pass
    if os.getppid() != server:  # gone before the signal was set
        os.killpg(0, signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == server:
            time.sleep(0.5)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main() -> None:
    _end_with_the_server(int(sys.argv[1]))
    # The answer goes to the stdout the server reads; anything else printed (a library's logging) goes to stderr.
    answer_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from xdiag import tools as _  # noqa: F401  (the imports every call needs, done before the call comes)
    from xdiag.agent.mcp_server import XdiagTools
    from xdiag.agent.result_cache import ResultCache
    from xdiag.errors import XdiagError

    request = json.loads(sys.stdin.read())
    if request.get("roots"):  # the call's reads, and those of what it starts, bounded to the server's folders
        from xdiag.profile.confined import bound_environment

        bound_environment([Path(folder) for folder in request["roots"]])

    cache = request["cache"]
    tools = XdiagTools(None if cache is None else ResultCache(Path(cache["root"]), cache["limit_bytes"]),
                       request["max_bytes"], Path(request["stack_dir"]),
                       [Path(folder) for folder in request.get("roots") or []])
    try:
        outcome = {"answer": tools.call(request["tool"], request["arguments"])}
    except XdiagError as exc:  # a bad request, a failed tool, a profile that cannot be read (truncated, too large…)
        outcome = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a bug of xdiag's: said as the call's error, not a crash
        outcome = {"error": f"xdiag failed: {type(exc).__name__}: {exc}"}
    answer_out.write(json.dumps(outcome, default=str))
    answer_out.close()


if __name__ == "__main__":
    main()
