"""`xdiag mcp`: xdiag's tools for the user's own coding agent, over the Model Context Protocol (stdio, or streamable
HTTP on loopback).

A thin adapter: every registered tool (its question and argument schema from the registry, `xdiag.tools.describe`,
plus the profile's `path`), answered through the local result cache as `xdiag tool` is; `analyze` (the whole
analysis, as `xdiag analyze`); `list_sessions` (a log dir's sessions, or the local stack's); `explain_finding` (one
finding of an analysis with the tool outputs its evidence quotes). A result is the JSON the CLI prints; bad input (a
missing path, an unknown tool, a bad argument) and a failed tool are MCP errors with the reason.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any

from xdiag.agent.result_cache import ResultCache, answer_tool
from xdiag.errors import XdiagError

PATH_DESCRIPTION = ("An *.xplane.pb file, a folder of one session's *.xplane.pb (one per host), a PyTorch/Chrome "
                    "trace (*.json[.gz]), or an XProf log dir (…/plugins/profile/<session>/; the newest session "
                    "unless `session` names one). Absolute, or relative to the server's working folder.")
PROFILE_ARGS = {
    "path": {"type": "string", "description": PATH_DESCRIPTION},
    "session": {"type": "string", "description": "A session's name inside a log dir (default: the newest)."},
}

ANALYZE = {
    "name": "analyze",
    "description": "The whole analysis of a profile session, as `xdiag analyze`: the 17 broad tools, the "
                   "investigation and summary.html. Returns the diagnosis (OPTIMAL or NEEDS_ATTENTION, a summary, the "
                   "findings ranked P0-P2 with their expected impact), the report's path and the analysis folder "
                   "(give it to explain_finding). Takes seconds on a large profile.",
    "inputSchema": {
        "type": "object",
        "properties": {
            **PROFILE_ARGS,
            "out": {"type": "string", "description": "The analysis folder (default ./xdiag-out/<session>)."},
            "investigator": {"type": "string", "enum": ["rules", "gemini"], "default": "rules",
                             "description": "rules (built in, no network) or gemini (Vertex AI, configured by "
                                            "VERTEX_PROJECT / VERTEX_LOCATION / VERTEX_MODEL)."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
}
LIST_SESSIONS = {
    "name": "list_sessions",
    "description": "The profile sessions one can analyse: those of an XProf log dir (`path`: name, files, bytes, "
                   "and the analysis folder where ./xdiag-out holds one), or, without `path`, the local stack's "
                   "(`xdiag up`) runs and their sessions with status and report.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "An XProf log dir (…/plugins/profile/<session>/ below it)."},
            "run": {"type": "string", "description": "Without path: only this run of the local stack."},
        },
        "additionalProperties": False,
    },
}
EXPLAIN_FINDING = {
    "name": "explain_finding",
    "description": "One finding of an analysis in full: what is happening, its evidence with the tool output "
                   "each number comes from (the tool's question, the field and its reported value), the expected "
                   "impact and the fix.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "analysis": {"type": "string", "description": "The analysis folder `analyze` returned (or its "
                                                          "analysis.json)."},
            "finding": {"type": "string", "description": "The finding's key (e.g. input_bound) or its rank "
                                                         "(1 = the first listed)."},
        },
        "required": ["analysis", "finding"],
        "additionalProperties": False,
    },
}


class BadRequest(XdiagError):
    """The call cannot be answered as asked: the message says why (an MCP invalid-params error)."""


class ToolFailed(XdiagError):
    """The tool ran and failed: the message is its reason, `result` its JSON (an MCP internal error)."""

    def __init__(self, reason: str, result: dict[str, Any]) -> None:
        super().__init__(reason)
        self.result = result


class XdiagTools:
    """What the server answers, without the protocol: `listed()` and `call(name, arguments)` → a JSON-able dict."""

    def __init__(self, cache: ResultCache | None, max_bytes: int, stack_dir: Path) -> None:
        self.cache, self.max_bytes, self.stack_dir = cache, max_bytes, stack_dir
        self._lock = threading.Lock()  # one call at a time: each may use every core and much memory

    @functools.cached_property
    def _registry(self) -> dict[str, Any]:
        from xdiag.tools import REGISTRY

        return REGISTRY

    def listed(self) -> list[dict[str, Any]]:
        """Every tool as MCP lists it: name, description, inputSchema."""
        from xdiag.tools.describe import describe_all, input_schema

        tools = []
        for described in describe_all():
            fields = ", ".join(described["returns"]["summary_fields"])
            tools.append({
                "name": described["name"],
                "description": f"{described['question']}\n\nReturns JSON: status (ok | not_available, with the "
                               f"reason), summary ({fields}), detail ({described['returns']['detail'] or 'none'}).",
                "inputSchema": input_schema(self._registry[described["name"]], PROFILE_ARGS, ("path",)),
            })
        return [*tools, ANALYZE, LIST_SESSIONS, EXPLAIN_FINDING]

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if name == "analyze":
                return self._analyze(**_known(arguments, ANALYZE))
            if name == "list_sessions":
                return self._list_sessions(**_known(arguments, LIST_SESSIONS))
            if name == "explain_finding":
                return self._explain_finding(**_known(arguments, EXPLAIN_FINDING))
            return self._tool(name, dict(arguments))

    def _tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from xdiag.tools.registry import validate_args

        spec = self._registry.get(name)
        if spec is None:
            raise BadRequest(f"unknown tool {name!r}; the tools are {', '.join(sorted(self._registry))}")
        located = _located(arguments.pop("path", None), arguments.pop("session", None))
        try:
            validate_args(spec, arguments)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        text, status = answer_tool(located.files, located.name, name, arguments, self.cache, self.max_bytes)
        result = json.loads(text)
        if status == "failed":
            raise ToolFailed(result.get("reason") or "the tool failed", result)
        return result

    def _analyze(self, path: str | None = None, session: str | None = None, out: str | None = None,
                 investigator: str = "rules") -> dict[str, Any]:
        from xdiag.cloud.embedded import analyze_session, build_embedded

        located = _located(path, session)
        investigators = {}
        if investigator == "gemini":
            from xdiag.investigators.gemini import gemini_factory
            from xdiag.investigators.gemini.config import GeminiConfig

            try:
                investigators["gemini"] = gemini_factory(GeminiConfig.from_env())
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        elif investigator != "rules":
            raise BadRequest(f"unknown investigator {investigator!r}; use rules or gemini")
        target = (Path(out) if out else Path("xdiag-out") / located.name).absolute()
        analysis = analyze_session(located, target, investigator=investigator,
                                   deps_and_bus=build_embedded(max_bytes=self.max_bytes, investigators=investigators))
        report = analysis.report_uri or str(target / "summary.html")
        if analysis.status == "FAILED":
            raise ToolFailed(analysis.failure_reason or "the analysis failed", {"status": "FAILED", "report": report})
        diagnosis = analysis.diagnosis
        return {
            "status": analysis.result.value if analysis.result else analysis.status,
            "summary": diagnosis.summary if diagnosis else "",
            "findings": [{"rank": i, "key": f.key, "priority": f.priority, "title": f.title,
                          "expected_impact": f.expected_impact}
                         for i, f in enumerate(diagnosis.findings if diagnosis else [], 1)],
            "report": report,
            "analysis": str(target),
            "investigator": diagnosis.investigator if diagnosis else investigator,
        }

    def _list_sessions(self, path: str | None = None, run: str | None = None) -> dict[str, Any]:
        if path is not None:
            from xdiag.profile.locate import log_dir_sessions

            if not Path(path).exists():
                raise BadRequest(f"{path}: no such file or directory")
            found = log_dir_sessions(Path(path))
            if not found:
                raise BadRequest(f"{path}: no sessions under plugins/profile/<session>/ (an xplane file or a session "
                                 "folder is given to the tools as it is)")
            return {"log_dir": str(Path(path).absolute()), "sessions": [_session_row(s) for s in found]}
        return {"local_stack": str(self.stack_dir.absolute()), "runs": self._stack_sessions(run)}

    def _stack_sessions(self, run: str | None) -> list[dict[str, Any]]:
        from xdiag.control.client import ControlPlaneClient, ControlPlaneError
        from xdiag.cloud.localstack import load_stack_env

        env = load_stack_env(self.stack_dir)
        url = env.get("XDIAG_CONTROL_PLANE_URL")
        if not url:
            raise BadRequest(f"no local stack in {self.stack_dir.absolute()} (start one with `xdiag up`, or give "
                             "list_sessions a log dir as `path`)")
        try:
            client = ControlPlaneClient(url, env.get("XDIAG_CONTROL_PLANE_TOKEN"), timeout_s=30.0)
            runs = [r["run_id"] for r in client.runs() if run in (None, r["run_id"], r.get("display_name"))]
            if run is not None and not runs:
                raise BadRequest(f"the local stack has no run {run!r}")
            return [{"run": r, "sessions": client.sessions(r)} for r in runs]
        except ControlPlaneError as exc:
            raise BadRequest(str(exc)) from None

    def _explain_finding(self, analysis: str, finding: str) -> dict[str, Any]:
        from xdiag.tools.describe import field_patterns, returns

        folder = Path(analysis)
        recorded = folder if folder.is_file() else folder / "analysis.json"
        try:
            stored = json.loads(recorded.read_text())
        except (OSError, ValueError) as exc:
            raise BadRequest(f"{analysis}: no analysis there ({exc}); `analyze` returns the folder") from None
        findings = (stored.get("diagnosis") or {}).get("findings") or []
        chosen = [f for i, f in enumerate(findings, 1) if finding in (f["key"], str(i))]
        if not chosen:
            listed = ", ".join(f"{i} {f['key']}" for i, f in enumerate(findings, 1)) or "none"
            raise BadRequest(f"no finding {finding!r} in {recorded}; its findings: {listed}")
        found = dict(chosen[0])
        outputs = recorded.parent / "tools"
        for evidence in found["evidence"]:
            spec = self._registry.get(evidence["tool"])
            if spec is None:
                continue
            evidence["tool_question"] = spec.question
            fields = returns(spec).fields
            evidence["documented_field"] = any(p.match(evidence["metric"]) for p in field_patterns(fields))
            try:
                summary = json.loads((outputs / f"{evidence['tool']}.json").read_text()).get("summary") or {}
            except (OSError, ValueError):
                continue
            if evidence["metric"] in summary:
                evidence["reported"] = summary[evidence["metric"]]
        follow_ups = (stored.get("diagnosis") or {}).get("follow_up_calls") or []
        return {**found, "session": stored.get("session_id"), "status": stored.get("result") or stored.get("status"),
                "follow_up_calls": follow_ups, "report": stored.get("report_uri"),
                "tool_outputs": str(outputs)}


def _known(arguments: dict[str, Any], tool: dict[str, Any]) -> dict[str, Any]:
    """The arguments of one of the server's own tools, checked against its schema's names and required ones."""
    schema = tool["inputSchema"]
    unknown = set(arguments) - set(schema["properties"])
    if unknown:
        raise BadRequest(f"{tool['name']} takes no argument(s) {sorted(unknown)}; it takes {sorted(schema['properties'])}")
    missing = [arg for arg in schema.get("required", []) if arg not in arguments]
    if missing:
        raise BadRequest(f"{tool['name']} needs argument(s) {missing}")
    wrong = [arg for arg, value in arguments.items() if not isinstance(value, str)]
    if wrong:
        raise BadRequest(f"{tool['name']}: argument(s) {wrong} must be strings")
    return arguments


def _located(path: str | None, session: str | None):
    from xdiag.profile.locate import locate_session

    if not path:
        raise BadRequest("argument 'path' is missing: the profile (an *.xplane.pb, a session folder or a log dir)")
    try:
        return locate_session(Path(path), session)
    except XdiagError as exc:
        raise BadRequest(str(exc)) from None


def _session_row(located) -> dict[str, Any]:
    analysed = Path("xdiag-out") / located.name / "analysis.json"
    return {"session": located.name, "run": located.run, "path": str(located.files[0].parent),
            "files": [{"name": f.name, "bytes": f.stat().st_size} for f in located.files],
            "analysis": str(analysed.parent.absolute()) if analysed.exists() else None}


def build_server(tools: XdiagTools):
    """The MCP server (the SDK's low-level server: the schemas are the registry's, not inferred from signatures)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError

    listed = tools.listed()

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=t["name"], description=t["description"],
                                                       input_schema=t["inputSchema"]) for t in listed])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        call = functools.partial(tools.call, params.name, dict(params.arguments or {}))
        try:
            result = await anyio.to_thread.run_sync(call)
        except BadRequest as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None
        except ToolFailed as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=str(exc), data=exc.result) from None
        except XdiagError as exc:  # the profile cannot be read (truncated, over the size limit, …)
            raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None
        text = json.dumps(result, indent=2, default=str)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=json.loads(text))

    return Server("xdiag", version=_version(),
                  instructions="Diagnose ML profiles (XProf *.xplane.pb, PyTorch traces): call analyze first, then "
                               "explain_finding or the tools for the questions it leaves open. `xdiag skill` prints "
                               "the full guide.",
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xdiag")
    except PackageNotFoundError:  # run from a checkout's shared/ without installing
        return "0"


def serve_stdio(tools: XdiagTools) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(tools)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


def serve_http(tools: XdiagTools, port: int, on_ready=None) -> None:
    """Streamable HTTP at http://127.0.0.1:PORT/mcp, loopback only (the SDK's DNS-rebinding protection on)."""
    import uvicorn

    app = build_server(tools).streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    if on_ready is not None:
        original = server.startup

        async def startup(sockets=None) -> None:
            await original(sockets)
            on_ready(server.servers[0].sockets[0].getsockname()[1] if server.servers else port)

        server.startup = startup
    server.run()
