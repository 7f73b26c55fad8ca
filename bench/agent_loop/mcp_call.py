"""Call one tool of `xdiag mcp` over stdio with the official MCP SDK's client, as a coding agent does; print the
tool's JSON answer and, on stderr, its size in bytes (what the agent reads). Each call is appended to a JSON-lines log
(tool, arguments, bytes, error or not) so that a loop's calls can be counted afterwards.

    python mcp_call.py --allow DIR [--log calls.jsonl] TOOL '{"path": "..."}'
    python mcp_call.py --allow DIR --list            # the tools and the bytes tools/list costs

The server is `<this python> -m xdiag.cli mcp --allow DIR` (the same as `xdiag mcp --allow DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import anyio
from mcp import Client, StdioServerParameters


async def _call(allow: str, tool: str | None, arguments: dict) -> tuple[str, bool]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", allow],
                                   env=dict(os.environ))  # PYTHONPATH too: the SDK passes only a few variables
    async with Client(params, read_timeout_seconds=1200, mode="legacy") as client:
        if tool is None:
            listed = await client.list_tools()
            return listed.model_dump_json(by_alias=True, exclude_none=True), False
        result = await client.call_tool(tool, arguments)
        return "".join(block.text for block in result.content if hasattr(block, "text")), bool(result.is_error)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow", required=True, help="the folder the server may read and write")
    parser.add_argument("--log", help="a JSON-lines file each call is appended to")
    parser.add_argument("--list", action="store_true", help="list the tools instead of calling one")
    parser.add_argument("tool", nargs="?")
    parser.add_argument("arguments", nargs="?", default="{}", help="the tool's arguments, a JSON object")
    args = parser.parse_args()
    if not args.list and not args.tool:
        parser.error("name a tool, or --list")
    arguments = json.loads(args.arguments)
    started = time.perf_counter()
    text, is_error = anyio.run(_call, args.allow, None if args.list else args.tool, arguments)
    seconds = time.perf_counter() - started
    size = len(text.encode())
    print(text)
    print(f"[{'tools/list' if args.list else args.tool}: {size} bytes{', ERROR' if is_error else ''}, "
          f"{seconds:.1f} s]", file=sys.stderr)
    if args.log:
        with open(args.log, "a") as log:
            log.write(json.dumps({"tool": "tools/list" if args.list else args.tool, "arguments": arguments,
                                  "bytes": size, "is_error": is_error, "seconds": round(seconds, 1)}) + "\n")
    return 1 if is_error else 0


if __name__ == "__main__":
    sys.exit(main())
