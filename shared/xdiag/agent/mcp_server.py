"""`xdiag mcp`: xdiag's tools for the user's own coding agent, over the Model Context Protocol (stdio, or streamable
HTTP on loopback).

A thin adapter: every registered tool (its question and argument schema from the registry, `xdiag.tools.describe`,
plus the profile's `path`), answered through the local result cache as `xdiag tool` is; `analyze` (the whole
analysis, as `xdiag analyze`); `list_sessions` (a log dir's sessions, or the local stack's); `explain_finding` (one
finding of an analysis with the tool outputs its evidence quotes).

How agents call it shapes the server:
- An answer is compact JSON sized for a model's context: every list cut to the call's `max_rows` (or the tool's
  `top_n`) from `offset`, the whole under 30,000 bytes at the default bounds and 96,000 at any (`agent.bounded`),
  with what was cut and how to get it said in the answer.
- A call that cannot be answered (a missing or unreadable profile, a bad argument, a failed tool, a path outside the
  client's roots) is a result with `isError` and the reason, which the model reads; only protocol errors (an unknown
  tool) are JSON-RPC errors.
- A call that needs a profile decoded or a tool run runs in a worker process of its own (`agent.mcp_worker`): calls
  run side by side, an analysis in a lane of its own so that a short call never waits behind one, at most
  `workers` tool calls and one analysis at once (each may hold a decoded profile: that bounds the memory); one
  worker is kept started ahead with its imports done, and a cached answer is read without a worker. `notifications/cancelled` kills the call's worker and the processes it started,
  frees its lane, and no answer is sent.
- The roots the client declares and the `--allow` folders bound the files a call may read or write.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from xdiag.agent.bounded import bound_answer
from xdiag.agent.result_cache import ResultCache
from xdiag.errors import XdiagError
from xdiag.tools.registry import ToolSpec

PATH_DESCRIPTION = ("`path` (every profile tool takes it): an *.xplane.pb file, a folder of one session's *.xplane.pb "
                    "(one per host), a PyTorch/Chrome trace (*.json[.gz]), or an XProf log dir "
                    "(…/plugins/profile/<session>/; the newest session unless `session` names one). Absolute, or "
                    "relative to the server's working folder.")
"""Said once, in the server's instructions; each tool's `path` points there (22 copies were 7.5 KB of tools/list)."""
PROFILE_PARAMS: dict[str, dict[str, Any]] = {
    "path": {"type": "string", "description": "the profile", "required": True, "max_length": 4096},
    "session": {"type": "string"},
}
DEFAULT_ROWS, MAX_ROWS = 20, 200
ROWS_PARAM = {"max_rows": {"type": "integer", "minimum": 1, "maximum": MAX_ROWS, "default": DEFAULT_ROWS}}
OFFSET_PARAM = {"offset": {"type": "integer", "minimum": 0, "default": 0}}
"""session, max_rows and offset are said once, in the server's instructions (ANSWERS_SAY)."""
ANSWERS_SAY = ("Every profile tool answers JSON: status (ok | not_available with the reason), summary (the numbers, "
               "each field named for what it holds, with its unit), detail (tables), source. Lists hold max_rows rows (or the "
               "tool's top_n) from offset; `truncated` names each cut list and its next_offset.")
TOOLS_LIST_BYTES = 20_000
"""What tools/list may weigh (~5k tokens, paid by every session of a client)."""
DEFAULT_CEILING_BYTES = 30_000
"""An answer at the default bounds fits ~8k tokens, well inside one MCP answer of any client (Claude Code: 25k)."""
MAX_CEILING_BYTES = 96_000
"""Whatever the arguments ask, an answer fits ~25k tokens."""

ANALYSES = "analyses"
"""The folder below the result cache's where `analyze` writes when no folder bounds the server and no `out` is named."""
READ_ONLY = {"read_only_hint": True, "open_world_hint": False}
"""MCP reads destructive_hint and idempotent_hint only where read_only_hint is false (the spec's ToolAnnotations)."""
WRITES = {"read_only_hint": False, "idempotent_hint": True, "destructive_hint": False, "open_world_hint": True}
ANALYSING = {"analyze", "diff_sessions"}
"""The tools that may analyse a profile: they write its analysis folder and run in the analysis lane."""
DIFF_TOP = 5
"""Ops and kernels `diff_sessions` lists per group (slower, faster, appeared, gone)."""


class BadRequest(XdiagError):
    """The call cannot be answered as asked: the message says why and what to do (an `isError` result)."""


class ToolFailed(XdiagError):
    """The tool ran and failed: the message is its reason (an `isError` result)."""


class UnknownToolName(XdiagError):
    """No tool of that name: a protocol error (JSON-RPC invalid params), as the MCP spec has it."""


class XdiagTools:
    """What the server answers, without the protocol: `specs` (every tool and its arguments) and
    `call(name, arguments)` → a JSON-able dict, run in a worker process (`mcp_worker`) by the server."""

    def __init__(self, cache: ResultCache | None, max_bytes: int, stack_dir: Path,
                 folders: list[Path] | None = None) -> None:
        self.cache, self.max_bytes, self.stack_dir = cache, max_bytes, stack_dir
        self.folders = list(folders or [])  # the folders the call is bounded to (where `analyze` writes by default)

    @functools.cached_property
    def _registry(self) -> dict[str, ToolSpec]:
        from xdiag.tools import REGISTRY

        return REGISTRY

    @functools.cached_property
    def specs(self) -> dict[str, ToolSpec]:
        """Every tool the server lists, with all the arguments an MCP call may give it (the profile's path, the
        answer's bounds): the registry's tools, then the server's own."""
        specs = {}
        for name, spec in self._registry.items():
            bound = {} if "top_n" in spec.parameters else ROWS_PARAM
            specs[name] = dataclasses.replace(spec, parameters={**PROFILE_PARAMS, **spec.parameters, **bound,
                                                                **OFFSET_PARAM})
        paging = {**ROWS_PARAM, **OFFSET_PARAM}
        own = (
            ("analyze", ANALYZE_QUESTION, XdiagTools._analyze, {
                **PROFILE_PARAMS,
                "out": {"type": "string", "description": "the analysis folder, new or an earlier analysis's "
                                                         "(default: below the cache)", "max_length": 4096},
                "investigator": {"type": "string", "enum": ["rules", "gemini"],
                                 "description": "rules (built in, offline) or gemini (Vertex AI: VERTEX_PROJECT, "
                                                "VERTEX_LOCATION, VERTEX_MODEL)"},
                "source_root": {"type": "string", "max_length": 4096,
                                "description": "the checkout holding the profiled program, for each finding's code "
                                               "(as get_line_view's)"},
                **paging}),
            ("list_sessions", LIST_SESSIONS_QUESTION, XdiagTools._list_sessions, {
                "path": {"type": "string", "description": "An XProf log dir (…/plugins/profile/<session>/ below "
                                                          "it).", "max_length": 4096},
                "run": {"type": "string", "description": "Without path: only this run of the local stack."},
                **paging}),
            ("explain_finding", EXPLAIN_QUESTION, XdiagTools._explain_finding, {
                "analysis": {"type": "string", "required": True, "max_length": 4096,
                             "description": "The analysis folder `analyze` returned (or its analysis.json)."},
                "finding": {"type": ["string", "integer"], "required": True,
                            "description": "The finding's key (e.g. input_bound) or its rank (1 = the first "
                                           "listed)."},
                **paging}),
            ("diff_sessions", DIFF_QUESTION, XdiagTools._diff_sessions, {
                "before": {"type": "string", "required": True, "max_length": 4096,
                           "description": "An analysis folder (from analyze) or a profile."},
                "after": {"type": "string", "required": True, "max_length": 4096,
                          "description": "The same, after the change."},
                **paging}),
        )
        for name, question, func, parameters in own:
            specs[name] = ToolSpec(name=name, question=question, func=func, parameters=parameters, broad=False,
                                   follow_up=False)
        return specs

    def listed(self) -> list[dict[str, Any]]:
        """Every tool as MCP lists it: name, description, inputSchema, annotations."""
        from xdiag.tools.describe import input_schema

        tools = []
        for name, spec in self.specs.items():
            description = spec.question  # the answer names its fields; `xdiag tool NAME --help` says each one
            hints = WRITES if name in ANALYSING else READ_ONLY
            tools.append({"name": name, "description": description,
                          "inputSchema": input_schema(spec, None, ()), "annotations": hints})
        return tools

    def check(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments checked against the tool's (names, types, ranges, choices, patterns): BadRequest
        with the reason; UnknownToolName for a tool the server does not have."""
        from xdiag.tools.registry import validate_args

        spec = self.specs.get(name)
        if spec is None:
            raise UnknownToolName(f"unknown tool {name!r}; the tools are {', '.join(self.specs)}")
        try:
            return validate_args(spec, dict(arguments))
        except ValueError as exc:
            raise BadRequest(f"{exc} (tools/list has the schema)") from None

    def answer_text(self, name: str, arguments: dict[str, Any], answer: dict[str, Any]) -> str:
        """A checked call's answer as the agent reads it: compact JSON, every list cut to the tool's `top_n` where
        it has one, else `max_rows`, from `offset`, under the byte ceiling (the smaller one while that bound is at
        its default), with what was cut and how to get it said in the answer."""
        from xdiag.tools.describe import arguments as described

        bound = "top_n" if "top_n" in self.specs[name].parameters else "max_rows"
        default = described(self.specs[name])[bound].get("default", DEFAULT_ROWS)
        rows = arguments.get(bound, default)
        ceiling = DEFAULT_CEILING_BYTES if rows <= default else MAX_CEILING_BYTES
        paging = "call again with offset=next_offset for the next rows" + (
            f", or a larger {bound} (up to {MAX_ROWS})" if rows < MAX_ROWS else "")
        return bound_answer(answer, rows, arguments.get("offset", 0), ceiling, paging)

    def paths(self, name: str, arguments: dict[str, Any]) -> list[Path]:
        """The files and folders a checked call reads or writes (what the client's roots must hold)."""
        named = [(key, arguments[key]) for key in ("path", "analysis", "source_root", "before", "after")
                 if key in arguments]
        if name == "analyze" and arguments.get("out"):  # the default is chosen inside the bounds (default_out)
            named.append(("out", arguments["out"]))
        elif name == "list_sessions" and "path" not in arguments:
            named.append(("stack_dir", str(self.stack_dir)))
        return [_path_named(key, text) for key, text in named]

    def default_out(self, arguments: dict[str, Any], folders: list[Path]) -> Path:
        """Where `analyze` writes when the call names no `out`: below the allowed folder that holds the profile (or
        the first one), else below the result cache's folder; never the server's working folder, which the client
        may not have allowed (nor expect files in); never over another profile's analysis (`analysis_folder`)."""
        from xdiag.cloud.embedded import analysis_folder

        located = _located(arguments["path"], arguments.get("session"))
        return analysis_folder(self._default_out(located.name, Path(arguments["path"]), folders).parent, located)

    def _default_out(self, name: str, path: Path, folders: list[Path]) -> Path:
        profile = path.absolute().resolve()
        for folder in sorted(folders, key=lambda f: not profile.is_relative_to(f)):
            return folder / "xdiag-out" / name
        root = self.cache.root if self.cache is not None else ResultCache.from_env().root
        return root.absolute() / ANALYSES / name

    def cached(self, name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """A registry tool's answer the result cache holds for this call (no worker needed), or None."""
        if self.cache is None or name not in self._registry:
            return None
        try:
            located = _located(arguments["path"], arguments.get("session"))
            kept = self.cache.answer(located.files, name, _tool_args(arguments))
        except (BadRequest, OSError):
            return None
        return json.loads(kept) if kept is not None else None

    def profile_key(self, name: str, arguments: dict[str, Any]) -> tuple | None:
        """The profile's file versions a call decodes (two first calls on one profile decode it once), or None."""
        if name not in self._registry:
            return None
        try:
            located = _located(arguments["path"], arguments.get("session"))
            return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in located.files)
        except (BadRequest, OSError):
            return None

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One checked call's answer (unbounded): BadRequest, ToolFailed or XdiagError where there is none."""
        if name in self._registry:
            return self._tool(name, arguments)
        own = {key: value for key, value in arguments.items() if key not in ("max_rows", "offset")}
        return getattr(self, f"_{name}")(**own)

    def _tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from xdiag.agent.result_cache import answer_tool

        located = _located(arguments["path"], arguments.get("session"))
        text, status = answer_tool(located.files, located.name, name, _tool_args(arguments), self.cache,
                                   self.max_bytes)
        result = json.loads(text)
        if status == "failed":
            raise ToolFailed(result.get("reason") or "the tool failed")
        return result

    def _analyze(self, path: str, session: str | None = None, out: str | None = None,
                 investigator: str = "rules", source_root: str | None = None) -> dict[str, Any]:
        from xdiag.analysis.source_code import SOURCE_ROOT_ENV
        from xdiag.cloud.embedded import analyze_session, build_embedded
        from xdiag.profile.confined import resolved

        located = _located(path, session)
        if source_root is not None:  # inside the roots (paths): the analysis reads the code there, as the CLI's does
            root = resolved(Path(source_root).absolute())  # where reads are bounded: every link on the way inside
            if not root.is_dir():
                raise BadRequest(f"source_root {source_root}: not a folder")
            before = os.environ.get(SOURCE_ROOT_ENV)
            os.environ[SOURCE_ROOT_ENV] = str(root)
            try:
                return self._analyze(path, session, out, investigator)
            finally:  # a worker makes one call; in process, the next call must not read this one's root
                if before is None:
                    del os.environ[SOURCE_ROOT_ENV]
                else:
                    os.environ[SOURCE_ROOT_ENV] = before
        investigators = {}
        if investigator == "gemini":
            from xdiag.investigators.gemini import gemini_factory
            from xdiag.investigators.gemini.config import GeminiConfig

            try:
                investigators["gemini"] = gemini_factory(GeminiConfig.from_env())
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        # where reads are bounded: the folder written is the one its links lead to, and that inside them
        target = resolved((Path(out) if out else Path("xdiag-out") / located.name).absolute())
        _check_out_folder(target)
        analysis = analyze_session(located, target, investigator=investigator,
                                   deps_and_bus=build_embedded(max_bytes=self.max_bytes, investigators=investigators))
        report = analysis.report_uri or str(target / "summary.html")
        if analysis.status == "FAILED":
            raise ToolFailed(f"{analysis.failure_reason or 'the analysis failed'} (report: {report})")
        from xdiag.agent.result_cache import keep_analysis_answers

        keep_analysis_answers(self.cache, located.files, target)  # the tools asked next answer from these
        diagnosis = analysis.diagnosis
        return {
            "status": analysis.result.value if analysis.result else analysis.status,
            "summary": diagnosis.summary if diagnosis else "",
            "findings": [{"rank": i, "key": f.key, "priority": f.priority, "title": f.title,
                          "expected_impact": f.expected_impact, "source_lines": [_line_said(line) for line in
                                                                                  f.source_lines]}
                         for i, f in enumerate(diagnosis.findings if diagnosis else [], 1)],
            "report": report,
            "analysis": str(target),
            "investigator": diagnosis.investigator if diagnosis else investigator,
        }

    def _list_sessions(self, path: str | None = None, run: str | None = None) -> dict[str, Any]:
        if path is not None:
            from xdiag.profile.confined import resolved
            from xdiag.profile.locate import log_dir_sessions

            resolved(Path(path))  # where reads are bounded: the log dir and every link on the way inside them
            if not Path(path).exists():
                raise BadRequest(f"{path}: no such file or directory")
            found = log_dir_sessions(Path(path)) if Path(path).is_dir() else []
            if not found:
                raise BadRequest(f"{path}: no sessions under plugins/profile/<session>/ (an xplane file or a session "
                                 "folder is given to the tools as it is)")
            return {"log_dir": str(Path(path).absolute()), "sessions": [
                _session_row(s, self._default_out(s.name, Path(path), self.folders)) for s in found]}
        return {"local_stack": str(self.stack_dir.absolute()), "runs": self._stack_sessions(run)}

    def _stack_sessions(self, run: str | None) -> list[dict[str, Any]]:
        from xdiag.cloud.stack_config import load_stack_env
        from xdiag.control.client import ControlPlaneClient, ControlPlaneError

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

    def _explain_finding(self, analysis: str, finding: str | int) -> dict[str, Any]:
        from xdiag.tools.describe import field_patterns, returns

        from xdiag.profile import confined

        folder = confined.resolved(Path(analysis))  # where reads are bounded: every link on the way inside them
        recorded = folder if folder.is_file() else folder / "analysis.json"
        try:
            stored = json.loads(confined.read_text(recorded))
        except confined.OutsideRoots:
            raise
        except (OSError, ValueError) as exc:  # the reason, never the bytes read
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise BadRequest(f"{analysis}: no analysis there ({reason}); `analyze` returns the folder") from None
        if not isinstance(stored, dict):
            raise BadRequest(f"{analysis}: no analysis there (not an analysis.json); `analyze` returns the folder")
        findings = (stored.get("diagnosis") or {}).get("findings") or []
        chosen = [f for i, f in enumerate(findings, 1) if str(finding) in (f["key"], str(i))]
        if not chosen:
            listed = ", ".join(f"{i} {f['key']}" for i, f in enumerate(findings, 1)) or "none"
            raise BadRequest(f"no finding {finding!r} in {recorded}; its findings: {listed}")
        found = dict(chosen[0])
        outputs = recorded.parent / "tools"
        questions: dict[str, str] = {}  # each evidence tool's question, said once (not beside each of its numbers)
        for evidence in found["evidence"]:
            spec = self._registry.get(evidence["tool"])
            if spec is None:
                continue
            questions[spec.name] = spec.question
            fields = returns(spec).fields
            evidence["documented_field"] = any(p.match(evidence["metric"]) for p in field_patterns(fields))
            try:
                summary = json.loads(confined.read_text(outputs / f"{evidence['tool']}.json")).get("summary") or {}
            except (OSError, ValueError, AttributeError, confined.OutsideRoots):  # a link out is not read: no number
                continue
            if evidence["metric"] in summary:
                evidence["reported"] = summary[evidence["metric"]]
        follow_ups = (stored.get("diagnosis") or {}).get("follow_up_calls") or []
        return {**found, "session": stored.get("session_id"), "status": stored.get("result") or stored.get("status"),
                "follow_up_calls": follow_ups, "report": stored.get("report_uri"),
                "tool_questions": questions, "tool_outputs": str(outputs)}

    def _diff_sessions(self, before: str, after: str) -> dict[str, Any]:
        from xdiag.compare.answer import agent_answer
        from xdiag.compare.outputs import compare_outputs

        diff = compare_outputs(self._analysed(before), self._analysed(after), top=DIFF_TOP)
        if diff.refused_because:
            raise BadRequest(f"not compared: {diff.refused_because}; a verdict compares two captures of one program "
                             "on one kind of device")
        return agent_answer(diff)

    def _analysed(self, path: str):
        """An analysis folder (or its analysis.json) as it is; a profile analysed first, as `analyze` does, into
        the folder `analyze` chooses where no `out` is named (never over another profile's analysis)."""
        from xdiag.compare.outputs import ANALYSIS_FILE, load_folder

        given = Path(path)
        folder = given.parent if given.name == ANALYSIS_FILE else given
        if (folder / ANALYSIS_FILE).is_file():  # read bounded as every read is (a link out is refused there)
            return load_folder(folder, path)
        target = self.default_out({"path": path}, self.folders)
        self._analyze(path=path, out=str(target))
        return load_folder(target, path)


ANALYZE_QUESTION = ("The whole analysis of a profile session (`xdiag analyze`: the 19 broad tools, the "
                    "investigation, summary.html): the diagnosis (OPTIMAL or NEEDS_ATTENTION, the findings ranked "
                    "P0-P2 with their expected impact and the lines of the program that hold them, with their "
                    "code), the report and the analysis folder (for explain_finding). Writes only that folder; the "
                    "tools then answer from what it computed.")
LIST_SESSIONS_QUESTION = ("The profile sessions one can analyse: those of an XProf log dir (`path`: name, files, "
                          "bytes, and its analysis folder where there is one), or, without `path`, the "
                          "local stack's (`xdiag up`) runs and their sessions with status and report.")
DIFF_QUESTION = ("Did a change work? Two captures of one program: the step-time verdict with its 95% interval, each "
                 "finding's predicted gain beside the realized one, the lines that moved. Refused across platforms "
                 "or programs.")
EXPLAIN_QUESTION = ("One finding of an analysis in full: what is happening, its evidence with the tool output each "
                    "number comes from (the field and its reported value; each tool's question once), the expected "
                    "impact and the fix.")


INSTRUCTIONS = ("Diagnose ML profiles (XProf *.xplane.pb, PyTorch traces): call analyze first, then explain_finding "
                "or the tools for the questions it leaves open. `xdiag skill` prints the full guide, `xdiag tool NAME "
                f"--help` every field.\n{PATH_DESCRIPTION}\n{ANSWERS_SAY}")


_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's (limits.h), as every file system it mounts for profiles takes


def _path_named(key: str, text: str) -> Path:
    """A path a call names, absolute; BadRequest where no file can have that name (a NUL byte, a name longer than
    the system takes), said from the text alone: nothing is looked up before the roots are checked."""
    if "\0" in text:
        raise BadRequest(f"{key} {text!r}: not a path (it holds a NUL byte)")
    path = Path(text).absolute()
    if len(os.fsencode(path)) >= _PATH_MAX or any(len(os.fsencode(part)) > _NAME_MAX for part in path.parts):
        raise BadRequest(f"{key} {text}: a name longer than the system takes ({_NAME_MAX} bytes a name, "
                         f"{_PATH_MAX} a path)")
    return path


def _tool_args(arguments: dict[str, Any]) -> dict[str, Any]:
    """A registry tool's own arguments (the profile's path and the answer's bounds are the server's)."""
    return {k: v for k, v in arguments.items() if k not in ("path", "session", "max_rows", "offset")}


def _located(path: str, session: str | None):
    from xdiag.profile.locate import locate_session

    try:
        return locate_session(Path(path), session)
    except XdiagError as exc:
        raise BadRequest(str(exc)) from None
    except OSError as exc:  # a device, a folder one may not list
        raise BadRequest(f"{path}: not a profile ({exc.strerror or exc})") from None


def _line_said(line) -> dict[str, Any]:
    """A finding's source line as `analyze` answers it: where, how much, and its code (explain_finding has the
    rest)."""
    return line.model_dump(include={"line", "function", "library", "share_percent", "host_ms", "code"},
                           exclude_defaults=True)


def _check_out_folder(target: Path) -> None:
    """An analysis folder is written only where nothing but an earlier analysis would be replaced: one that holds an
    analysis.json, or the lock an analysis takes first (one cancelled or killed before its end: the next takes over;
    one still running refuses it while it holds the lock)."""
    from xdiag.cloud.embedded import OUT_LOCK

    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise BadRequest(f"out {target}: not a folder; name a new folder (or an earlier analysis) as `out`")
    if target.is_dir() and any(target.iterdir()) and not any((target / name).is_file()
                                                             for name in ("analysis.json", OUT_LOCK)):
        raise BadRequest(f"out {target}: a folder that holds files but no analysis; name a new folder as `out`")


def _session_row(located, analysis_folder: Path) -> dict[str, Any]:
    """A log dir's session, and its analysis where `analyze` writes one by default (or `xdiag analyze` did)."""
    analysed = next((folder / "analysis.json" for folder in (analysis_folder, Path("xdiag-out") / located.name)
                     if (folder / "analysis.json").exists()), analysis_folder / "analysis.json")
    return {"session": located.name, "run": located.run, "path": str(located.files[0].parent),
            "files": [{"name": f.name, "bytes": f.stat().st_size} for f in located.files],
            "analysis": str(analysed.parent.absolute()) if analysed.exists() else None}


# --- the protocol --------------------------------------------------------------------------------------------


class Lanes:
    """Where calls wait for a worker: one analysis at a time (it may use every core and the most memory), at most
    `workers` tool calls beside it; and the first calls on a profile one at a time, so that it is decoded once."""

    def __init__(self, workers: int) -> None:
        import anyio

        self.analysis = anyio.CapacityLimiter(1)
        self.tools = anyio.CapacityLimiter(workers)
        self.decoding: dict[tuple, Any] = defaultdict(anyio.Lock)
        self.decoded: set[tuple] = set()


class Allowed:
    """The folders a call may touch: the client's roots (asked per call, they may change) and `--allow`; no bound
    where there are neither."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders = [Path(f).resolve() for f in folders]

    async def check(self, ctx, paths: list[Path]) -> list[Path]:
        """The folders the call is bounded to ([] where it is not); BadRequest where a path it names is outside
        (the files it reads are checked where they are opened: xdiag.profile.confined)."""
        folders = [*self.folders, *await _client_roots(ctx)]
        if not folders:
            return []
        for path in paths:
            resolved = path.resolve()
            if not any(resolved.is_relative_to(folder) for folder in folders):
                raise BadRequest(f"{path} is outside the folders this server may use ({', '.join(map(str, folders))}"
                                 "): the client's roots and `xdiag mcp --allow DIR` set them")
        return folders


async def _client_roots(ctx) -> list[Path]:
    """The client's roots (file:// URIs) where it declares the capability; none where it does not or cannot say."""
    import anyio

    session = getattr(ctx, "session", None)
    capabilities = session.client_capabilities if session is not None else None
    if capabilities is None or capabilities.roots is None or not session.can_send_request:
        return []
    try:
        with anyio.fail_after(10):
            listed = await session.list_roots()
    except Exception:  # noqa: BLE001 - a client that declares roots and fails to list them bounds nothing
        return []
    roots = []
    for root in listed.roots:
        uri = urlparse(str(root.uri))
        if uri.scheme == "file":
            roots.append(Path(unquote(uri.path)).resolve())
    return roots


class Dispatcher:
    """tools/call: checks, roots, the cache, a worker in its lane, the bounded answer; errors as results."""

    def __init__(self, tools: XdiagTools, workers: int, allowed: Allowed) -> None:
        self.tools, self.allowed, self.lanes, self.workers = tools, allowed, Lanes(workers), Workers(tools)

    async def answer(self, ctx, name: str, arguments: dict[str, Any]):
        import mcp_types as types

        from xdiag.profile.confined import within

        checked = self.tools.check(name, arguments)  # UnknownToolName goes on: a protocol error
        try:
            folders = await self.allowed.check(ctx, self.tools.paths(name, checked))
            with within(folders):  # the cache's look-up reads the files, bounded as the worker's reads are
                if name == "analyze" and not checked.get("out"):
                    checked["out"] = str(self.tools.default_out(checked, folders))
                result = self.tools.cached(name, checked)
                if result is None:
                    result = await self._in_worker(name, checked, folders)
        except XdiagError as exc:  # a path outside the folders, a profile that cannot be read, a failed tool
            return _error_result(str(exc))
        text = self.tools.answer_text(name, checked, result)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def _in_worker(self, name: str, arguments: dict[str, Any], folders: list[Path]) -> dict[str, Any]:
        lanes = self.lanes
        if name in ANALYSING:
            async with lanes.analysis:
                return await self.workers.run(name, arguments, folders)
        key = self.tools.profile_key(name, arguments)
        if key is not None and key not in lanes.decoded:
            async with lanes.decoding[key]:  # the others wait for the first call to decode (and cache) the profile
                if key not in lanes.decoded:
                    async with lanes.tools:
                        result = await self.workers.run(name, arguments, folders)
                    lanes.decoded.add(key)
                    return result
        async with lanes.tools:
            return await self.workers.run(name, arguments, folders)


def _error_result(reason: str):
    import mcp_types as types

    return types.CallToolResult(content=[types.TextContent(type="text", text=reason)], is_error=True)


class Workers:
    """The worker processes calls run in (`python -m xdiag.agent.mcp_worker`, each a session of its own, killed with
    every process it started where its call is cancelled); one is kept started ahead, its imports done, so that a
    call does not wait for an interpreter to start and import the tools (0.6 s alone, more on a loaded machine)."""

    def __init__(self, tools: XdiagTools) -> None:
        self.tools = tools
        self._spare, self._starting = None, False

    async def _start(self):
        import anyio

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH"))
                                                           if p)}
        return await anyio.open_process([sys.executable, "-m", "xdiag.agent.mcp_worker", str(os.getpid())],
                                        stdin=-1, stdout=-1, stderr=None, env=env, start_new_session=True)

    async def run(self, name: str, arguments: dict[str, Any], folders: list[Path] | None = None) -> dict[str, Any]:
        """The call's answer from a worker: the one started ahead where it is still there, and another ahead. The
        worker's reads, and those of the processes it starts, are bounded to `folders` where there are any."""
        import anyio

        process, self._spare = self._spare, None
        with anyio.CancelScope(shield=True):  # a process started is always one the server holds (and kills)
            if process is None or process.returncode is not None:
                process = await self._start()
            if self._spare is None and not self._starting:  # one ahead, however many calls arrive together
                self._starting = True
                try:
                    self._spare = await self._start()
                finally:
                    self._starting = False
        tools = self.tools
        request = {"tool": name, "arguments": arguments, "max_bytes": tools.max_bytes,
                   "roots": [str(folder) for folder in folders or []],
                   "stack_dir": str(tools.stack_dir),
                   "cache": None if tools.cache is None else {"root": str(tools.cache.root),
                                                              "limit_bytes": tools.cache.limit_bytes}}
        try:
            async with process:
                await process.stdin.send(json.dumps(request).encode())
                await process.stdin.aclose()
                chunks = [chunk async for chunk in process.stdout]
                await process.wait()
        finally:
            _kill_group(process.pid)  # ended or cancelled: nothing it started outlives the call
            if process.returncode is None or process.returncode < 0:  # killed: what it left in TMPDIR goes
                from xdiag.profile.scratch import sweep

                sweep()
        try:
            outcome = json.loads(b"".join(chunks))
        except ValueError:
            raise ToolFailed(f"the worker process ended without an answer (exit status {process.returncode})") from None
        if "error" in outcome:
            raise ToolFailed(outcome["error"])
        return outcome["answer"]


def _package_root() -> str:
    """The folder xdiag is imported from here: the worker imports the same code (a checkout's shared/ too)."""
    return str(Path(__file__).resolve().parents[2])


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def build_server(tools: XdiagTools, workers: int = 2, allow: list[Path] | None = None):
    """The MCP server (the SDK's low-level server: the schemas are the registry's, not inferred from signatures)."""
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError

    listed = [types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"],
                         annotations=types.ToolAnnotations(**t["annotations"])) for t in tools.listed()]
    dispatcher = Dispatcher(tools, workers, Allowed(allow or []))

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            return await dispatcher.answer(ctx, params.name, dict(params.arguments or {}))
        except UnknownToolName as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None
        except BadRequest as exc:  # an argument the schema does not allow
            return _error_result(str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug of xdiag's: the model reads it as the call's error
            return _error_result(f"xdiag failed: {type(exc).__name__}: {exc}")

    return Server("xdiag", version=_version(),
                  instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xdiag")
    except PackageNotFoundError:  # run from a checkout's shared/ without installing
        return "0"


def serve_stdio(tools: XdiagTools, workers: int = 2, allow: list[Path] | None = None) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(tools, workers, allow)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


class StaticToken:
    """The SDK's TokenVerifier for one bearer token given at start (`xdiag mcp --http --token-file`)."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def verify_token(self, token: str):
        import hmac

        from mcp.server.auth.provider import AccessToken

        if hmac.compare_digest(token.encode(), self.token.encode()):
            return AccessToken(token=token, client_id="xdiag-mcp-client", scopes=[])
        return None


def serve_http(tools: XdiagTools, port: int, on_ready=None, workers: int = 2, allow: list[Path] | None = None,
               token: str | None = None) -> None:
    """Streamable HTTP at http://127.0.0.1:PORT/mcp, loopback only (the SDK's DNS-rebinding protection on); with
    `token`, every request must carry `Authorization: Bearer <token>` (401 otherwise)."""
    import uvicorn

    auth = {}
    if token:
        from mcp.server.auth.settings import AuthSettings

        auth = {"auth": AuthSettings(issuer_url=f"http://127.0.0.1:{port or 8792}", resource_server_url=None),
                "token_verifier": StaticToken(token)}
    from xdiag.agent.http_guard import SESSION_IDLE_S, GuardedH11, bound_sessions, idle_cap

    protocol = build_server(tools, workers, allow)
    app = protocol.streamable_http_app(host="127.0.0.1", session_idle_timeout=SESSION_IDLE_S, max_sessions=None, **auth)
    bound_sessions(protocol.session_manager)  # a flood of sessions ends the least recently used, never locks one out
    GuardedH11.cap = idle_cap()  # idle connections closed by time and count: a call still answers (issue 62)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=GuardedH11,
                            timeout_keep_alive=5, limit_concurrency=2 * GuardedH11.cap)
    server = uvicorn.Server(config)
    if on_ready is not None:
        original = server.startup

        async def startup(sockets=None) -> None:
            await original(sockets)
            on_ready(server.servers[0].sockets[0].getsockname()[1] if server.servers else port)

        server.startup = startup
    server.run()

