"""The `xdiag` command line."""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from xdiag.errors import XdiagError

app = typer.Typer(
    help="xdiag: capture ML workload profiles and diagnose them (OPTIMAL, or prioritised findings with evidence and fixes).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class _Console:
    """A rich Console made on first use: `xdiag analyze` starts XProf's conversions of a device session before it
    imports rich (or pydantic, which xdiag.ids needs), so that they start that much sooner (bench/README.md,
    fifteenth round)."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    @functools.cached_property
    def _console(self) -> Any:
        from rich.console import Console

        return Console(**self._options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console, name)


err = _Console(stderr=True)
out = _Console()

_OWN_PROCESS = False
"""True where xdiag runs as its own console script (`main`): only then does it freeze the garbage collector (a program
that calls the commands in-process keeps its collector as it was)."""


def _freeze_collector() -> None:
    """Puts every object alive now out of the collector's reach for the rest of the process: the modules imported
    for a command live as long as the process, and at exit the interpreter's shutdown would otherwise collect over
    everything still alive (0.13 s after analysing the 85 MiB bench profile; bench/README.md, ninth round)."""
    if _OWN_PROCESS:
        gc.freeze()


PATH_HELP = "An *.xplane.pb file, a folder of one session's *.xplane.pb (one per host), or an XProf log dir (…/plugins/profile/<session>/)."


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]xdiag:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _checked(check, *args) -> None:
    """An id from the command line through the one id grammar (xdiag.ids); exits 2 with the reason otherwise."""
    try:
        check(*args)
    except XdiagError as exc:
        _fail(str(exc))


def _progress_printer(quiet: bool):
    from xdiag.tools import BROAD_TOOLS

    started = time.perf_counter()
    state = {"tools": 0, "last_read": 0.0}

    def on_event(stage: str, info: dict[str, Any]) -> None:
        if quiet:
            return
        elapsed = f"[dim]{time.perf_counter() - started:6.2f}s[/]"
        if stage == "collect" and "failed" in info:
            err.print(f"{elapsed} [red]read failed[/]: {info['failed']}", highlight=False)
        elif stage == "collect" and "mapping" in info:
            err.print(f"{elapsed} map    {info['mapping']} of {info['hosts']} host file(s), one invocation each", highlight=False)
        elif stage == "map_host":
            err.print(f"{elapsed} map    {info['host']} {info['status'].lower()} [dim]{info['duration_ms']:.0f} ms[/]", highlight=False)
        elif stage == "collect":
            err.print(
                f"{elapsed} read   {info['platform']} profile: {len(info['hosts'])} host(s), "
                f"{info['events']:,} events, {info['size_bytes'] / 2**20:.1f} MiB, {info['hlo_modules']} HLO modules",
                highlight=False,
            )
        elif stage == "run_tool":
            state["tools"] += 1
            colour = {"ok": "green", "not_available": "yellow", "failed": "red"}[info["status"]]
            err.print(
                f"{elapsed} tool   {state['tools']:2d}/{len(BROAD_TOOLS)} {info['tool']:<36} [{colour}]{info['status']}[/] "
                f"[dim]{info['duration_ms']:.0f} ms[/]",
                highlight=False,
            )
        elif stage == "follow_up":
            err.print(f"{elapsed} follow-up {info['tool']} [dim]{info['status']}[/]", highlight=False)
        elif stage == "investigate":
            err.print(f"{elapsed} investigate → {info['status']} ({info['findings']} finding(s))", highlight=False)
        elif stage == "render":
            err.print(f"{elapsed} render {info['report']}", highlight=False)

    def on_read(what: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if not quiet and total > 50 * 2**20 and (now - state["last_read"] > 1.0 or done == total):
            state["last_read"] = now
            err.print(f"[dim]{now - started:6.2f}s[/] {what}: {100 * done / total:.0f}%", highlight=False)

    return on_event, on_read


@app.command()
def analyze(
    path: Annotated[Path, typer.Argument(help=PATH_HELP)],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default ./xdiag-out/<session>).")] = None,
    investigator: Annotated[str, typer.Option(envvar="XDIAG_INVESTIGATOR", help="rules (built-in, no network) or gemini (Vertex AI).")] = "rules",
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir (default: the newest).")] = None,
    max_profile_gib: Annotated[float, typer.Option(help="Refuse sessions larger than this.")] = 2.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines; print only the report path.")] = False,
    no_xprof_views: Annotated[bool, typer.Option("--no-xprof-views", help="Skip XProf's own converters on TPU/GPU profiles (they take seconds per view on large profiles); the tools that need them say so.")] = False,
    project: Annotated[Optional[str], typer.Option(help="Google Cloud project for Gemini on Vertex AI (env VERTEX_PROJECT).")] = None,
    location: Annotated[Optional[str], typer.Option(help="Vertex AI location (env VERTEX_LOCATION; default us-central1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Gemini model (env VERTEX_MODEL; default gemini-2.5-flash).")] = None,
) -> None:
    """Analyse one profile session: the broad tools, an investigation, and summary.html.

    With --investigator gemini, Gemini on Vertex AI investigates (Application Default Credentials; VERTEX_BASE_URL
    points it at a private endpoint); if it fails, the rule engine does, and the report says why.
    """
    from xdiag.profile.locate import locate_session

    if investigator not in ("rules", "gemini"):
        _fail(f"unknown investigator {investigator!r}; use rules or gemini")
    if no_xprof_views:
        from xdiag.analysis.xprof import XPROF_VIEWS_ENV

        os.environ[XPROF_VIEWS_ENV] = "0"
    investigators = {}
    if investigator == "gemini":
        from xdiag.investigators.gemini import GeminiConfig, gemini_factory

        try:
            investigators["gemini"] = gemini_factory(GeminiConfig.from_env(project=project, location=location, model=model))
        except ValueError as exc:
            _fail(str(exc))
    try:
        located = locate_session(path, session)
    except XdiagError as exc:
        _fail(str(exc))
    from xdiag.analysis.xprof import start_views

    max_bytes = int(max_profile_gib * 2**30)
    started_views = start_views(located.files, max_bytes)  # before the pipeline's imports, on the core they leave idle
    from xdiag.cloud.embedded import analyze_session, build_embedded

    _freeze_collector()
    target = out_dir or Path("xdiag-out") / located.name
    on_event, on_read = _progress_printer(quiet)
    deps = build_embedded(max_bytes=max_bytes, on_event=on_event, read_progress=on_read,
                          investigators=investigators, started_views=(located.files, started_views))
    analysis = analyze_session(located, target, investigator=investigator, deps_and_bus=deps)
    report = Path(analysis.report_uri) if analysis.report_uri else target / "summary.html"
    if analysis.status == "FAILED":
        err.print(f"[dim]report with the reason: {report}[/]", highlight=False)
        _fail(analysis.failure_reason or "analysis failed")
    status = analysis.result.value if analysis.result else analysis.status
    if not quiet:
        colour = "green" if status == "OPTIMAL" else "yellow"
        err.print(f"[bold {colour}]{status}[/]: {analysis.diagnosis.summary if analysis.diagnosis else ''}", highlight=False)
        for finding in (analysis.diagnosis.findings if analysis.diagnosis else [])[:5]:
            err.print(f"  [bold]{finding.priority}[/] {finding.title}", highlight=False)
    out.print(str(report), highlight=False, soft_wrap=True)


@app.command("tools")
def list_tools(
    as_json: Annotated[bool, typer.Option("--json", help="Every tool as JSON: question, arguments (type, default, limits), the fields its summary returns.")] = False,
) -> None:
    """List the tools: the broad ones every analysis runs, and the follow-ups."""
    from xdiag.tools.describe import describe_all

    described = describe_all()
    if as_json:
        sys.stdout.write(json.dumps(described, indent=2, default=str) + "\n")
        return
    for tool in described:
        kind = "broad" if tool["broad"] else "follow-up"
        args = ", ".join(f"{a}{'*' if p['required'] else ''}" for a, p in tool["arguments"].items())
        out.print(f"[bold]{tool['name']}[/] [dim]({kind}{'; args: ' + args if args else ''})[/]\n    {tool['question']}",
                  highlight=False)
    err.print("[dim]`xdiag tool NAME --help`: a tool's arguments and the fields it returns[/]", highlight=False)


@app.command("tool", context_settings={"help_option_names": []})
def one_tool(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(help="Tool name (see `xdiag tools`).", show_default=False)] = None,
    path: Annotated[Optional[Path], typer.Argument(help=PATH_HELP, show_default=False)] = None,
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="Tool argument as key=value (repeatable), typed and checked as the tool declares.")] = None,
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Decode the profile and run the tool afresh, keeping nothing (XDIAG_LOCAL_CACHE_DIR, ~/.cache/xdiag).")] = False,
    max_profile_gib: Annotated[float, typer.Option(help="Refuse sessions larger than this.")] = 2.0,
    show_help: Annotated[bool, typer.Option("--help", "-h", help="This help; with NAME, the tool's arguments and the fields it returns.")] = False,
) -> None:
    """Run one tool on a session and print its JSON result. The decoded profile and the answer are kept per file
    version (a second call answers from the cache); a failed answer is never kept."""
    if show_help or name is None:
        if name is None:
            out.print(ctx.get_help(), highlight=False)
            return
        from xdiag.tools import REGISTRY
        from xdiag.tools.describe import help_text

        if name not in REGISTRY:
            _fail(f"unknown tool {name!r}; `xdiag tools` lists them")
        sys.stdout.write(help_text(REGISTRY[name]) + "\n")
        return
    if path is None:
        _fail(f"xdiag tool {name}: PATH is missing (`xdiag tool {name} --help`)")
    from xdiag.agent.result_cache import ResultCache
    from xdiag.profile.locate import locate_session

    try:
        located = locate_session(path, session)
    except XdiagError as exc:
        _fail(str(exc))
    cache = None if no_cache else ResultCache.from_env()
    given = dict(item.partition("=")[::2] for item in arg or [])  # the arguments as typed: what answers are kept by
    kept = cache.answer(located.files, name, given) if cache is not None else None
    if kept is not None:  # only a tool that exists, called with arguments that passed, has an answer kept
        sys.stdout.write(kept)
        return
    from xdiag.agent.result_cache import answer_tool
    from xdiag.tools import REGISTRY
    from xdiag.tools.describe import parse_cli_args

    if name not in REGISTRY:
        _fail(f"unknown tool {name!r}; `xdiag tools` lists them")
    try:
        args = parse_cli_args(REGISTRY[name], arg or [])
    except ValueError as exc:
        _fail(f"{exc} (`xdiag tool {name} --help`)")
    try:
        text, status = answer_tool(located.files, located.name, name, args, cache, int(max_profile_gib * 2**30),
                                   key_args=given)
    except XdiagError as exc:
        _fail(str(exc))
    sys.stdout.write(text)
    if status == "failed":
        raise typer.Exit(1)


@app.command()
def mcp(
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio.")] = False,
    port: Annotated[int, typer.Option(help="With --http: the port (0: any free one; the URL is printed on stderr).")] = 8792,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every tool afresh, keeping nothing.")] = False,
    max_profile_gib: Annotated[float, typer.Option(help="Refuse sessions larger than this.")] = 2.0,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Serve xdiag to a coding agent over MCP (Gemini CLI, Claude Code, Cursor): every tool with its schema,
    analyze, list_sessions and explain_finding. stdio by default (the agent starts `xdiag mcp`); --http serves
    http://127.0.0.1:PORT/mcp. The README's "xdiag in your coding agent" has the configuration."""
    try:
        import mcp as _  # noqa: F401
    except ImportError:
        _fail("xdiag mcp needs the MCP SDK: pip install 'xdiag[mcp]'", 1)
    from xdiag.agent.mcp_server import XdiagTools, serve_http, serve_stdio
    from xdiag.agent.result_cache import ResultCache

    tools = XdiagTools(None if no_cache else ResultCache.from_env(), int(max_profile_gib * 2**30), stack_dir)
    if not http:
        serve_stdio(tools)
        return

    def ready(bound: int) -> None:
        err.print(f"xdiag MCP server at http://127.0.0.1:{bound}/mcp", highlight=False, soft_wrap=True)

    serve_http(tools, port, on_ready=ready)


@app.command()
def skill() -> None:
    """Print the agent skill (SKILL.md, the Agent Skills format Gemini CLI and Claude Code read): how to diagnose a
    profile with xdiag, which tool answers which question, in which order, what the fields mean."""
    from importlib.resources import files

    sys.stdout.write(files("xdiag.agent").joinpath("SKILL.md").read_text())


@app.command()
def demo(
    workload: Annotated[str, typer.Option(help="Bundled workload to profile (see `python -m xdiag.examples --list`).")] = "input_bound",
    out_dir: Annotated[Path, typer.Option("--out", help="Where the profile and the analysis go.")] = Path("xdiag-out/demo"),
) -> None:
    """Run a bundled JAX example on this machine, capture a real profile, analyse it."""
    from xdiag.examples import WORKLOADS
    from xdiag.examples.capture import capture_workload

    if workload not in WORKLOADS:
        _fail(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    err.print(f"profiling the bundled workload [bold]{workload}[/]: {WORKLOADS[workload].problem}", highlight=False)
    try:
        xplane = capture_workload(workload, out_dir / "profiles")
    except Exception as exc:  # the capture runs a subprocess: its failure is the user's answer
        _fail(f"capturing {workload} failed: {exc}", 1)
    err.print(f"captured {xplane} ({xplane.stat().st_size / 2**20:.2f} MiB)", highlight=False)
    analyze(xplane, out_dir=out_dir / "analysis")


# --- the event-driven pipeline: the local stack, uploads, status ------------------------------------------

STACK_DIR = typer.Option("--stack-dir", envvar="XDIAG_STACK_DIR", help="Where the local stack keeps its state and logs.")
STATUS_PROBE_S = 5.0  # `xdiag status` waits this long for one document before it calls Firestore unresponsive


def _cloud_config(stack_dir: Path, bucket: Optional[str] = None):
    """The pipeline's configuration: the environment, or else the local stack that `xdiag up` started."""
    from xdiag.cloud.localstack import load_stack_env
    from xdiag.cloud.operations import client_config

    load_stack_env(stack_dir)
    try:
        return client_config(bucket)
    except ValueError as exc:
        _fail(f"{exc} (or start the local stack: `xdiag up`)")


@app.command()
def up(
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
    quiet_period: Annotated[float, typer.Option(help="Seconds without a new file before register declares a session complete.")] = 3.0,
    bucket: Annotated[str, typer.Option(help="The profile bucket in the Cloud Storage emulator.")] = "xdiag-profiles",
    project: Annotated[str, typer.Option(help="The project id the emulators use.")] = "xdiag-local",
) -> None:
    """Start the local stack: Pub/Sub and Firestore emulators, a Cloud Storage emulator, every function, topics and
    push subscriptions, bucket notifications; the bucket and Firestore's documents of the last stack in this folder are
    there again. Where a stack is up already, starts again only its services that are down (a crashed emulator or
    function). Prints the environment that reaches it (`eval "$(xdiag up)"`)."""
    from xdiag.cloud.localstack import STATE_FILE, LocalStack, StackError, StackSettings

    started = time.perf_counter()
    try:
        running = LocalStack.attach(stack_dir) if (stack_dir / STATE_FILE).exists() else None
        if running is not None and running.alive():
            restarted = running.restart_down()
            stack = running
            err.print(f"local stack in {stack.state_dir} is up; restarted {', '.join(restarted)}" if restarted else
                      f"local stack in {stack.state_dir} is up; nothing of it is down", highlight=False, soft_wrap=True)
        else:
            stack = LocalStack(stack_dir, StackSettings(project=project, bucket=bucket,
                                                        quiet_period_s=quiet_period)).start()
            err.print(f"local stack up in {time.perf_counter() - started:.1f} s (state and logs: {stack.state_dir})",
                      highlight=False, soft_wrap=True)
    except StackError as exc:
        _fail(str(exc), 1)
    for name, port in stack.ports.items():
        err.print(f"  [dim]{name:<12}[/] 127.0.0.1:{port}", highlight=False, soft_wrap=True)
    for key, value in stack.env.items():
        out.print(f"export {key}={value}", highlight=False, soft_wrap=True)


@app.command()
def down(stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack")) -> None:
    """Stop the local stack: every process group it started (the emulators' Java children too)."""
    from xdiag.cloud.localstack import LocalStack, StackError

    try:
        stack = LocalStack.attach(stack_dir)
    except StackError as exc:
        err.print(str(exc), highlight=False, soft_wrap=True)
        return
    busy = stack.stop()
    if busy:
        _fail(f"still listening after the stop: {', '.join(busy)}", 1)
    err.print("local stack stopped; nothing of it is listening", highlight=False, soft_wrap=True)


@app.command()
def upload(
    path: Annotated[Path, typer.Argument(help=PATH_HELP)],
    run: Annotated[str, typer.Option(help="The run the session belongs to: gs://BUCKET/<run>/plugins/profile/<session>/.")],
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir (default: the newest).")] = None,
    bucket: Annotated[Optional[str], typer.Option(envvar="XDIAG_BUCKET", help="The profile bucket (default: the local stack's).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for summary.html and print where the time went.")] = False,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600.0,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Upload a session's files to the profile bucket; its object-finalize notifications start the analysis."""
    from xdiag.cloud.operations import stage_breakdown, state_store, upload_session, wait_for_analysis
    from xdiag.ids import check_name, check_run_id
    from xdiag.pipeline.layout import output_uri
    from xdiag.profile.locate import locate_session

    config = _cloud_config(stack_dir, bucket)
    try:
        check_run_id(run)
        located = locate_session(path, session)
        check_name(located.name, "session id")
    except XdiagError as exc:
        _fail(str(exc))
    started = time.time()
    for uri in upload_session(located, run, config):
        err.print(f"uploaded {uri}", highlight=False, soft_wrap=True)
    report = output_uri(config.profile_root, run, located.name) + "/summary.html"
    if wait:
        state = state_store(config)
        try:
            analysis = wait_for_analysis(state, run, located.name, timeout, since=started)
        except TimeoutError as exc:
            _fail(str(exc), 1)
        for stage in stage_breakdown(state, analysis, uploaded_at=started):
            err.print(f"  {stage.name:<16} {stage.seconds:6.2f} s  [dim]{stage.note}[/]", highlight=False, soft_wrap=True)
        err.print(f"{analysis['status']} {analysis.get('result') or ''} in {time.time() - started:.1f} s after the upload began",
                  highlight=False, soft_wrap=True)
        if analysis["status"] == "FAILED":
            out.print(analysis.get("report_uri") or report, highlight=False, soft_wrap=True)
            _fail(f"the analysis FAILED: {analysis.get('failure_reason')}", 1)
    out.print(report, highlight=False, soft_wrap=True)


HOST_MAP_ROWS = 32
"""Up to this many hosts `xdiag status` lists every map invocation; beyond, the counts and the slowest."""


def _print_host_maps(maps: list[dict[str, Any]]) -> None:
    """The map stage of a many-host analysis: one line per host file's invocation (status, time, sizes)."""
    if not maps:
        return
    counts: dict[str, int] = {}
    for row in maps:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    out.print(f"      host maps: {len(maps)} host file(s): " + ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items())),
              highlight=False, soft_wrap=True)
    shown = maps if len(maps) <= HOST_MAP_ROWS else sorted(maps, key=lambda r: -(r["duration_ms"] or 0))[:5]
    if len(maps) > HOST_MAP_ROWS:
        out.print("        the 5 slowest:", highlight=False)
    for row in shown:
        took = f" {row['duration_ms'] / 1000:.2f} s" if row["duration_ms"] is not None else ""
        size = f", {row['input_bytes'] / 2**20:.1f} MiB" + (
            f" → {row['prepared_bytes'] / 2**20:.1f} MiB prepared" if row.get("prepared_bytes") else "")
        note = " (decoded for an earlier analysis)" if row["reused"] else ""
        out.print(f"        map {row['host']}: {row['status'].lower()}{took}{size}{note}"
                  + (f": {row['reason']}" if row.get("reason") else ""), highlight=False, soft_wrap=True)


@app.command()
def status(
    run: Annotated[Optional[str], typer.Option(help="Only this run.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The status as JSON on stdout.")] = False,
    timeout: Annotated[float, typer.Option(help="Give up, saying so, when Firestore has not answered in this many seconds.")] = 60.0,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Runs, sessions and analyses with their stage and tool status, read from Firestore; exits 1 naming the service
    that is down where one does not answer."""
    from xdiag.cloud.operations import read_status, state_store, unreachable_emulators, within
    from xdiag.ids import check_run_id
    from xdiag.pipeline.run_index import RUNS

    config = _cloud_config(stack_dir)
    if run is not None:
        _checked(check_run_id, run)
    down = unreachable_emulators()
    if down:
        _fail("; ".join(down) + " (`xdiag up` starts again what of the local stack is down)", 1)
    what = f"Firestore (project {config.project})"
    try:
        state = state_store(config)
        # One document first: a Firestore that takes connections and never answers (frozen) is told in seconds.
        within(min(timeout, STATUS_PROBE_S), what, lambda: state.get(RUNS, "xdiag-status-probe"))
        report = within(timeout, what, lambda: read_status(state, run, config.stage_deadline_s))
    except TimeoutError as exc:
        _fail(f"{exc}: it is down, frozen or unreachable", 1)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
        return
    if not report["runs"]:
        out.print(f"no runs{f' named {run!r}' if run else ''} yet", highlight=False, soft_wrap=True)
    for run_doc in report["runs"]:
        out.print(f"[bold]{run_doc['run_id']}[/] [dim]{run_doc['base_uri']}[/]", highlight=False, soft_wrap=True)
        for session_doc in run_doc["sessions"]:
            hosts = ", ".join(session_doc.get("hosts") or [])
            out.print(f"  session {session_doc['session_id']}: {session_doc['status']}{f' ({hosts})' if hosts else ''}", highlight=False, soft_wrap=True)
            analysis = session_doc["analysis"]
            if analysis is None:
                continue
            counts: dict[str, int] = {}
            for tool_status in analysis["tools"].values():
                counts[tool_status] = counts.get(tool_status, 0) + 1
            out.print(f"    analysis {analysis['analysis_id']}: {analysis['status']} {analysis['result'] or ''}", highlight=False, soft_wrap=True)
            _print_host_maps(analysis.get("host_maps") or [])
            out.print("      tools: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), highlight=False, soft_wrap=True)
            if analysis["stages"]:
                out.print("      stages: " + " · ".join(f"{s['name']} {s['seconds']:.1f} s" for s in analysis["stages"]), highlight=False, soft_wrap=True)
            if analysis["failure_reason"]:
                out.print(f"      [red]failed[/]: {analysis['failure_reason']}", highlight=False, soft_wrap=True)
            if analysis["overdue_s"]:
                out.print(f"      [red]OVERDUE[/]: no progress in {analysis['status']} for {analysis['overdue_s']:.0f} s past "
                          f"its deadline ({analysis['repairs']} repair(s) so far)", highlight=False, soft_wrap=True)
            if analysis["report_uri"]:
                out.print(f"      report: {analysis['report_uri']}", highlight=False, soft_wrap=True)
    if report["overdue"]:
        out.print(f"[red]{len(report['overdue'])} analysis(es) past their deadline[/] (the sweeper repairs them, then "
                  "fails them with the reason)", highlight=False, soft_wrap=True)
        for late in report["overdue"]:
            out.print(f"  {late['analysis_id']} ({late['run_id']}/{late['session_id']}): {late['status']}, "
                      f"{late['overdue_s']:.0f} s overdue, {late['repairs']} repair(s)", highlight=False, soft_wrap=True)
    if report["dead_letters"]:
        out.print(f"[yellow]{len(report['dead_letters'])} dead letter(s)[/]", highlight=False, soft_wrap=True)
        for letter in report["dead_letters"]:
            out.print(f"  {letter['source_topic']}: {letter['reason']}", highlight=False, soft_wrap=True)


@app.command("publish-capture")
def publish_capture(
    run: Annotated[str, typer.Option(help="The run of the session.")],
    session: Annotated[str, typer.Option(help="The session: gs://BUCKET/<run>/plugins/profile/<session>/.")],
    investigator: Annotated[str, typer.Option(help="rules or gemini.")] = "rules",
    analysis_id: Annotated[Optional[str], typer.Option(help="A fresh id re-analyses a session analysed before.")] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Analyse a session already in the bucket: publishes {"run_id", "session_id"} on the `captures` topic."""
    from xdiag.cloud.operations import publish_capture as publish
    from xdiag.ids import check_name, check_run_id

    _checked(check_run_id, run)
    _checked(check_name, session, "session id")
    _checked(check_name, investigator, "investigator")
    if analysis_id is not None:
        _checked(check_name, analysis_id, "analysis id")
    message = publish(_cloud_config(stack_dir), run, session, investigator, analysis_id)
    out.print(message.model_dump_json(exclude_none=True), highlight=False, soft_wrap=True)


# --- capture: the control plane's API (the cloud, or the local stack) ------------------------------------

URL_OPTION = typer.Option("--url", envvar="XDIAG_CONTROL_PLANE_URL", help="The control plane (default: the local stack's).")
TOKEN_OPTION = typer.Option("--token", envvar="XDIAG_CONTROL_PLANE_TOKEN", help="Its bearer token (default: the local stack's).")
RUN_HELP = "The run: its id, or its display name (the ML Diagnostics SDK gives runs a UUID; the name works too)."
HOSTS_HELP = "Registered target names, comma-separated (default: every target of the run)."


def _control_plane(url: Optional[str], token: Optional[str], stack_dir: Path):
    from xdiag.control.client import ControlPlaneClient, ControlPlaneError
    from xdiag.cloud.localstack import load_stack_env

    env = load_stack_env(stack_dir)
    url = url or env.get("XDIAG_CONTROL_PLANE_URL")
    if not url:
        _fail("no control plane: pass --url or set XDIAG_CONTROL_PLANE_URL (or start the local stack: `xdiag up`)")
    try:
        return ControlPlaneClient(url, token or env.get("XDIAG_CONTROL_PLANE_TOKEN"), timeout_s=30.0)
    except ControlPlaneError as exc:
        _fail(str(exc))


def _call(what, *args, **kwargs):
    from xdiag.control.client import ControlPlaneError

    try:
        return what(*args, **kwargs)
    except ControlPlaneError as exc:
        _fail(str(exc), 2 if 400 <= exc.status < 500 else 1)


def parse_duration_ms(text: str) -> int:
    """`2s`, `500ms`, `1.5s`, `1m` (a bare number is seconds) → milliseconds."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*", text or "")
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 2s, 500ms or 1m")
    return int(round(float(match.group(1)) * {"ms": 1, "s": 1000, "m": 60_000}[match.group(2) or "s"]))


def _hosts(hosts: Optional[str]) -> Optional[list[str]]:
    return [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None


def _wait_for_session(client, run: str, session: str, timeout: float) -> dict:
    """Polls the session until its analysis is done, or the capture failed or found no buffer."""
    deadline = time.monotonic() + timeout
    while True:
        doc = _call(client.session, run, session)
        analysis = doc.get("analysis") or {}
        if doc.get("status") in ("FAILED", "NO_BUFFER") or analysis.get("status") in ("DONE", "FAILED"):
            return doc
        if time.monotonic() > deadline:
            _fail(f"session {session} of run {run} is still {doc.get('status')} after {timeout:.0f} s "
                  f"(`xdiag sessions --run {run}`)", 1)
        time.sleep(0.5)


def _print_session(doc: dict, started: float | None = None) -> None:
    analysis = doc.get("analysis") or {}
    line = f"{doc['session_id']}: {doc.get('kind', '?')} {doc.get('status')}"
    if analysis:
        line += f", analysis {analysis.get('status')} {analysis.get('result') or ''}".rstrip()
    if started is not None:
        line += f" ({time.time() - started:.1f} s)"
    err.print(line, highlight=False, soft_wrap=True)
    for note in (doc.get("note"), doc.get("reason"), analysis.get("failure_reason")):
        if note:
            err.print(f"  {note}", highlight=False, soft_wrap=True)


@app.command()
def capture(
    run: Annotated[str, typer.Option(help="The run whose registered targets to capture (its id or display name).")],
    duration: Annotated[str, typer.Option(help="How long to capture: 2s, 500ms, 1m.")] = "2s",
    hosts: Annotated[Optional[str], typer.Option(help=HOSTS_HELP)] = None,
    host_tracer: Annotated[Optional[int], typer.Option("--host-tracer", help="Host tracer level 0-3 (default 2).")] = None,
    device_tracer: Annotated[Optional[int], typer.Option("--device-tracer", help="Device tracer level 0-2 (default 1).")] = None,
    python_tracer: Annotated[Optional[int], typer.Option("--python-tracer", help="Python tracer level 0-1 (default 0).")] = None,
    session: Annotated[Optional[str], typer.Option(help="Name of the new session (default: a timestamp).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the analysis and print summary.html's URI.")] = True,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600.0,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Capture a profile now from the run's registered profiler targets (all in parallel), then analyse it."""
    client = _control_plane(url, token, stack_dir)
    run = resolve_run(client, run)
    started = time.time()
    answer = _call(client.capture, run, duration_ms=parse_duration_ms(duration), hosts=_hosts(hosts),
                   host_tracer_level=host_tracer, device_tracer_level=device_tracer, python_tracer_level=python_tracer,
                   session_id=session)
    err.print(f"capture requested: run {run}, session {answer['session_id']}, {answer['duration_ms']} ms",
              highlight=False, soft_wrap=True)
    _finish_session(client, run, answer["session_id"], wait, timeout, started, "capture")


continuous_app = typer.Typer(help="Continuous profiling in snapshot mode (TPU; CPU and GPU servers keep no buffer).",
                             no_args_is_help=True)
app.add_typer(continuous_app, name="continuous")


@continuous_app.command("start")
def continuous_start(
    run: Annotated[str, typer.Option(help=RUN_HELP)],
    hosts: Annotated[Optional[str], typer.Option(help=HOSTS_HELP)] = None,
    device_tracer: Annotated[int, typer.Option("--device-tracer", help="Device tracer level 0-2.")] = 1,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Start continuous profiling on the run's targets (device traces into the profiler's circular buffer)."""
    client = _control_plane(url, token, stack_dir)
    answer = _call(client.continuous, resolve_run(client, run), "start", hosts=_hosts(hosts),
                   device_tracer_level=device_tracer)
    _print_continuous(answer)


@continuous_app.command("stop")
def continuous_stop(
    run: Annotated[str, typer.Option(help=RUN_HELP)],
    hosts: Annotated[Optional[str], typer.Option(help=HOSTS_HELP)] = None,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Stop continuous profiling on the run's targets."""
    client = _control_plane(url, token, stack_dir)
    _print_continuous(_call(client.continuous, resolve_run(client, run), "stop", hosts=_hosts(hosts)))


@continuous_app.command("snapshot")
def continuous_snapshot(
    run: Annotated[str, typer.Option(help=RUN_HELP)],
    name: Annotated[Optional[str], typer.Option(help="Name of the snapshot's session (default: a timestamp).")] = None,
    hosts: Annotated[Optional[str], typer.Option(help=HOSTS_HELP)] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the snapshot (and its analysis).")] = True,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600.0,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Save the circular buffer of every target as a session, analysed like any other."""
    client = _control_plane(url, token, stack_dir)
    run = resolve_run(client, run)
    started = time.time()
    answer = _call(client.continuous, run, "snapshot", name=name, hosts=_hosts(hosts))
    err.print(f"snapshot requested: run {run}, session {answer['session_id']}", highlight=False, soft_wrap=True)
    _finish_session(client, run, answer["session_id"], wait, timeout, started, "snapshot")


def _finish_session(client, run: str, session_id: str, wait: bool, timeout: float, started: float, what: str) -> None:
    """Prints the new session's id, or waits for its analysis and prints summary.html's URI."""
    if not wait:
        out.print(session_id, highlight=False)
        return
    doc = _wait_for_session(client, run, session_id, timeout)
    _print_session(doc, started)
    report = (doc.get("analysis") or {}).get("report_uri")
    if doc.get("status") != "COMPLETE" or not report:
        _fail(doc.get("reason") or f"the {what} failed", 1)
    out.print(report, highlight=False, soft_wrap=True)


def _print_continuous(answer: dict) -> None:
    err.print(f"continuous profiling {answer['state']} on run {answer['run_id']}", highlight=False, soft_wrap=True)
    for name, target in sorted(answer.get("answers", {}).items()):
        err.print(f"  {name}: {target['status']}{': ' + target['error'] if target.get('error') else ''}",
                  highlight=False, soft_wrap=True)
    if answer.get("note"):
        err.print(f"  [dim]{answer['note']}[/]", highlight=False, soft_wrap=True)


@app.command()
def runs(
    as_json: Annotated[bool, typer.Option("--json", help="As JSON on stdout.")] = False,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """The runs the control plane knows (SDK-registered, attached, uploaded)."""
    found = _call(_control_plane(url, token, stack_dir).runs)
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
        return
    for run in found:
        out.print(f"[bold]{run['id']}[/] {run['display_name']} [dim]{run['base_uri'] or ''}[/]"
                  f"{' state ' + run['state'] if run.get('state') else ''}"
                  f"{' continuous ' + run['continuous'] if run.get('continuous') == 'on' else ''}",
                  highlight=False, soft_wrap=True)
    if not found:
        out.print("no runs yet", highlight=False)


@app.command()
def sessions(
    run: Annotated[str, typer.Option(help=RUN_HELP)],
    as_json: Annotated[bool, typer.Option("--json", help="As JSON on stdout.")] = False,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """A run's sessions: kind (programmatic, on_demand, snapshot, auto), status, analysis, report."""
    client = _control_plane(url, token, stack_dir)
    found = _call(client.sessions, resolve_run(client, run))
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
        return
    for doc in found:
        _print_session(doc)
        report = (doc.get("analysis") or {}).get("report_uri")
        if report:
            out.print(f"  {report}", highlight=False, soft_wrap=True)
    if not found:
        out.print(f"run {run} has no sessions yet", highlight=False)


# --- stored sessions: the viewer, before/after, reports, share links, monitored events ---------------------------

SESSION_HELP = "RUN/SESSION, or SESSION with --run."


def resolve_run(client, text: str) -> str:
    """A run's id from its id or its display name (unique)."""
    runs = _call(client.runs)
    if any(r["run_id"] == text or r["id"] == text for r in runs):
        return text
    named = [r["run_id"] for r in runs if r.get("display_name") == text]
    if len(named) > 1:
        _fail(f"{len(named)} runs are named {text!r}: {', '.join(named)}; give the run's id")
    return named[0] if named else text  # unknown: the control plane says so


def _run_and_session(client, spec: str, run: Optional[str]) -> tuple[str, str]:
    if run:
        return resolve_run(client, run), spec
    head, sep, tail = spec.rpartition("/")
    if not sep or not head or not tail:
        _fail(f"{spec!r}: name the session as RUN/SESSION, or pass --run")
    return resolve_run(client, head), tail


# --- view ------------------------------------------------------------------------------------------------------


def _bucket_source(stack_dir: Path, view_dir: Path):
    """The profile bucket of the local stack or of a cloud deployment, where one is configured; else None."""
    from xdiag.cloud.localstack import load_stack_env
    from xdiag.cloud.operations import client_config

    load_stack_env(stack_dir)
    try:
        config = client_config()
    except ValueError:
        return None
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    from xdiag.cloud.gcs import GcsBlobStore, storage_client
    from xdiag.cloud.operations import state_store
    from xdiag.pipeline.layout import state_key
    from xdiag.pipeline.runs import run_for_path
    from xdiag.pipeline.topics import sessions_collection
    from xdiag.viewer.sources import CACHE_BYTES, BucketSource

    state = functools.cache(lambda: state_store(config))  # made once, where a kind is first asked for

    def kind_of(run_path: str, session: str) -> str | None:
        """The kind Firestore recorded; None (the kind in the session's id) where Firestore cannot be read."""
        try:
            doc = state().get(sessions_collection(run_for_path(state(), run_path)), state_key(session)) or {}
        except (GoogleAPIError, GoogleAuthError):
            return None
        return doc.get("kind")

    blobs = GcsBlobStore(storage_client(config.project), view_dir / "cache", CACHE_BYTES)
    return BucketSource(root=config.profile_root, blobs=blobs, emulator=bool(os.environ.get("STORAGE_EMULATOR_HOST")),
                        kind_of=kind_of)


@app.command()
def view(
    store: Annotated[Path, typer.Option(help="The embedded default's local store: the folders `xdiag analyze` wrote.")] = Path("xdiag-out"),
    run: Annotated[Optional[list[str]], typer.Option(help="Only this run's sessions (repeatable; default: every run).")] = None,
    port: Annotated[int, typer.Option(help="The viewer's port (0: any free one).")] = 8791,
    bind: Annotated[str, typer.Option(help="The address XProf listens on (0.0.0.0: every interface).")] = "127.0.0.1",
    bucket: Annotated[bool, typer.Option("--bucket/--no-bucket", help="Include the local stack's (or the configured) profile bucket.")] = True,
    view_dir: Annotated[Path, typer.Option(help="xdiag's folder for the viewer: the session tree XProf reads, the bucket's mirror, XProf's log.")] = Path(".xdiag-view"),
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Start XProf's own viewer over every run's sessions (the local store, and the local stack's or the cloud's
    bucket); prints its URL and serves until interrupted."""
    from xdiag.report.viewer_links import session_link
    from xdiag.viewer.server import ViewerError, start_xprof
    from xdiag.viewer.sources import plan_view

    view_dir = view_dir.absolute()
    source = _bucket_source(stack_dir, view_dir) if bucket else None
    plan = plan_view(view_dir, store.absolute(), source, run or [])
    from rich.markup import escape

    for note in plan.notes:  # names from the store and the bucket: brackets in them are text, not markup
        err.print(f"[dim]{escape(note)}[/]", highlight=False, soft_wrap=True)
    if not plan.sessions and plan.traces:
        err.print(f"only PyTorch/Chrome traces here ({len(plan.traces)} session(s)): nothing for XProf's viewer to "
                  "show; each can be opened where said above", highlight=False, soft_wrap=True)
        return
    if not plan.sessions:
        err.print("no sessions yet: analyse one (`xdiag analyze`), or upload or capture one on the local stack",
                  highlight=False, soft_wrap=True)
    try:
        server = start_xprof(plan.logdir, view_dir / "xprof.log", [s.name for s in plan.sessions], port=port or None,
                             bind=bind)
    except ViewerError as exc:
        _fail(str(exc), 1)
    for s in plan.sessions:
        err.print(f"  {s.name}  [bold]{s.kind}[/]  {session_link(s.run, s.session, 'trace_viewer@', server.url)}",
                  highlight=False, soft_wrap=True)
    out.print(server.url, highlight=False, soft_wrap=True)
    sys.stdout.flush()

    def interrupted(*_) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    if server.process.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
        _fail(f"XProf's server exited with status {server.process.returncode} (log: {server.log})", 1)


# --- diff and report -------------------------------------------------------------------------------------------


def _local_outputs(path: Path, label: str):
    """An analysis folder as it is, or a profile (file, session folder, log dir) analysed first by the embedded
    default into ./xdiag-out/<session>."""
    from xdiag.cloud.memory import LocalBlobStore
    from xdiag.compare.outputs import ANALYSIS_FILE, load_outputs

    if path.is_dir() and (path / ANALYSIS_FILE).exists():
        return load_outputs(LocalBlobStore(), str(path.absolute()), label)
    from xdiag.cloud.embedded import analyze_session, build_embedded
    from xdiag.profile.locate import locate_session

    located = locate_session(path, None)
    target = Path("xdiag-out") / located.name
    err.print(f"analysing {path} into {target}", highlight=False, soft_wrap=True)
    analysis = analyze_session(located, target, deps_and_bus=build_embedded())
    if analysis.status == "FAILED":
        _fail(f"{label}: the analysis failed: {analysis.failure_reason}")
    return load_outputs(LocalBlobStore(), str(target.absolute()), label)


def _stored_outputs(spec: str, run: Optional[str], url, token, stack_dir: Path):
    """A session analysed by the pipeline (RUN/SESSION): its outputs read from the bucket."""
    from xdiag.cloud.gcs import GcsBlobStore, storage_client
    from xdiag.cloud.operations import client_config
    from xdiag.compare.outputs import load_outputs

    client = _control_plane(url, token, stack_dir)
    run_id, session_id = _run_and_session(client, spec, run)
    report = ((_call(client.session, run_id, session_id).get("analysis") or {}).get("report_uri"))
    if not report:
        _fail(f"session {session_id} of run {run_id} has no finished analysis yet (`xdiag sessions --run {run_id}`)")
    config = client_config()
    blobs = GcsBlobStore(storage_client(config.project), Path(config.cache_dir))
    return load_outputs(blobs, report.rsplit("/", 1)[0], f"{run_id}/{session_id}")


def _outputs(spec: str, run, url, token, stack_dir: Path):
    try:
        return _local_outputs(Path(spec), spec) if Path(spec).exists() else _stored_outputs(spec, run, url, token, stack_dir)
    except XdiagError as exc:
        _fail(str(exc))


@app.command()
def diff(
    baseline: Annotated[str, typer.Argument(help="Before: an analysis folder, a profile (analysed first), or RUN/SESSION.")],
    candidate: Annotated[str, typer.Argument(help="After: the same forms.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Where diff.html and diff.json go (default ./xdiag-out/diff-<before>-<after>).")] = None,
    run: Annotated[Optional[str], typer.Option(help=RUN_HELP + " For sessions named without their run.")] = None,
    top: Annotated[int, typer.Option(help="Ops and kernels listed per group.")] = 15,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Compare two sessions: step time and its breakdown, ops and kernels per step, memory peak, findings."""
    from xdiag.compare.html import write_diff
    from xdiag.compare.sessions import compare_sessions

    before = _outputs(baseline, run, url, token, stack_dir)
    after = _outputs(candidate, run, url, token, stack_dir)
    result = compare_sessions(before, after, top=top)
    name = f"diff-{result.baseline.session_id}-{result.candidate.session_id}"
    _, html = write_diff(result, out_dir or Path("xdiag-out") / name)
    for line in result.headline:
        err.print(f"  {line}", highlight=False, soft_wrap=True)
    out.print(str(html), highlight=False, soft_wrap=True)


@app.command()
def report(
    session: Annotated[str, typer.Argument(help="An analysis folder, or " + SESSION_HELP)],
    run: Annotated[Optional[str], typer.Option(help=RUN_HELP)] = None,
    open_it: Annotated[bool, typer.Option("--open", help="Open it in the browser.")] = False,
    out_dir: Annotated[Path, typer.Option("--out", help="Where a report from the bucket is saved.")] = Path("xdiag-reports"),
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Fetch a session's summary.html (from the bucket, or a local analysis folder) and print its path; --open
    opens it."""
    local = Path(session) / "summary.html"
    if local.exists():
        path = local.absolute()
    else:
        from xdiag.cloud.gcs import GcsBlobStore, storage_client
        from xdiag.cloud.operations import client_config

        client = _control_plane(url, token, stack_dir)
        run_id, session_id = _run_and_session(client, session, run)
        uri = (_call(client.session, run_id, session_id).get("analysis") or {}).get("report_uri")
        if not uri:
            _fail(f"session {session_id} of run {run_id} has no report yet (`xdiag sessions --run {run_id}`)")
        config = client_config()
        path = (out_dir / run_id.replace("/", "~") / session_id / "summary.html").absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(GcsBlobStore(storage_client(config.project), Path(config.cache_dir)).get(uri))
        err.print(f"downloaded {uri}", highlight=False, soft_wrap=True)
    if open_it:
        import webbrowser

        webbrowser.open(path.as_uri())
    out.print(str(path), highlight=False, soft_wrap=True)


# --- share links and monitored events --------------------------------------------------------------------------


@app.command()
def share(
    session: Annotated[str, typer.Argument(help=SESSION_HELP)],
    expires: Annotated[str, typer.Option(help="How long the link works: 7d (the most), 12h, 30m, 90s.")] = "7d",
    run: Annotated[Optional[str], typer.Option(help=RUN_HELP)] = None,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """A link to the session's report that stops working after --expires (a V4 signed URL), recorded with who
    asked and when; refused for runs you cannot read."""
    from urllib.parse import quote

    from xdiag.sharing.links import parse_expiry

    try:
        seconds = parse_expiry(expires)
    except ValueError as exc:
        _fail(str(exc))
    client = _control_plane(url, token, stack_dir)
    run_id, session_id = _run_and_session(client, session, run)
    link = _call(client.request, "POST", f"/v1/runs/{quote(run_id, safe='~')}/sessions/{quote(session_id)}:share",
                 {"expires_s": seconds})
    err.print(f"link {link['link_id']} for {run_id}/{session_id}, by {link['by']}, valid until {link['expires_at']} "
              f"(checked by {link['checked_by']})", highlight=False, soft_wrap=True)
    for label, viewer in (link.get("viewer") or {}).items():
        err.print(f"  [dim]{label} in the viewer: {viewer}[/]", highlight=False, soft_wrap=True)
    out.print(link["url"], highlight=False, soft_wrap=True)


events_app = typer.Typer(help="Monitored events: alerts and monitor verdicts, and the capture or cool-down each led to.",
                         invoke_without_command=True)
app.add_typer(events_app, name="events")


@events_app.callback()
def events(
    ctx: typer.Context,
    run: Annotated[Optional[str], typer.Option(help=RUN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="As JSON on stdout.")] = False,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """List the degradation events seen (oldest first): source, outcome, the capture each led to."""
    if ctx.invoked_subcommand is not None:
        return
    from urllib.parse import quote

    client = _control_plane(url, token, stack_dir)
    query = f"?run={quote(resolve_run(client, run), safe='~')}" if run else ""
    found = _call(client.request, "GET", f"/v1/events{query}")["events"]
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
        return
    for e in found:
        target = f" → session {e['session_id']}" if e.get("session_id") else ""
        out.print(f"{e['id']}  {e['received_at']}  {e['run_id'] or '-'}  {e['source']}  [bold]{e['outcome']}[/]{target}",
                  highlight=False, soft_wrap=True)
    if not found:
        out.print("no events yet", highlight=False)


@events_app.command("describe")
def events_describe(
    event_id: Annotated[str, typer.Argument(help="The event's id (from `xdiag events`).")],
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """One event with the analyser's details: baseline, window, step times, the capture and its report."""
    from urllib.parse import quote

    event = _call(_control_plane(url, token, stack_dir).request, "GET", f"/v1/events/{quote(event_id)}")
    sys.stdout.write(json.dumps(event, indent=2, default=str) + "\n")


def main() -> None:  # console-script entry point
    global _OWN_PROCESS
    _OWN_PROCESS = True
    try:
        app()
    finally:
        _freeze_collector()


if __name__ == "__main__":
    main()
