"""One call of `xdiag mcp` in a process of its own: the call as JSON on stdin, `{"answer": …}` or `{"error": reason,
"kind": bad_request | failed | unknown_tool}` as JSON on stdout. The server starts it in a session of its own, so that
a cancelled call ends with every process it started (XProf's conversion workers included)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    # The answer goes to the stdout the server reads; anything else printed (a library's logging) goes to stderr.
    answer_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.loads(sys.stdin.read())
    from xdiag.agent.mcp_server import BadRequest, ToolFailed, UnknownToolName, XdiagTools
    from xdiag.agent.result_cache import ResultCache
    from xdiag.errors import XdiagError

    cache = request["cache"]
    tools = XdiagTools(None if cache is None else ResultCache(Path(cache["root"]), cache["limit_bytes"]),
                       request["max_bytes"], Path(request["stack_dir"]))
    try:
        outcome = {"answer": tools.call(request["tool"], request["arguments"])}
    except UnknownToolName as exc:
        outcome = {"error": str(exc), "kind": "unknown_tool"}
    except ToolFailed as exc:
        outcome = {"error": str(exc), "kind": "failed"}
    except (BadRequest, XdiagError) as exc:  # the profile cannot be read (truncated, over the size limit, …)
        outcome = {"error": str(exc), "kind": "bad_request"}
    except Exception as exc:  # noqa: BLE001 - a bug of xdiag's: said as the call's error, not a crash
        outcome = {"error": f"xdiag failed: {type(exc).__name__}: {exc}", "kind": "failed"}
    answer_out.write(json.dumps(outcome, default=str))
    answer_out.close()


if __name__ == "__main__":
    main()
