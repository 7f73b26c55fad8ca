"""The commands that work on this machine's files: analyze, tools, tool, lines, mcp, skill, demo, diff, report.

Each imports what it runs inside its body, so that `xdiag analyze` loads no cloud, control-plane or viewer module."""

# No `from __future__ import annotations`: typer would evaluate each command's annotations from their text, twice,
# every time it builds the app (`xdiag --help` builds all 21 commands); here they are evaluated once, at import.

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from xdiag.cli.console import (err, fail, folder_to_write, freeze_collector, is_folder, is_own_process, one_of, out,
                               pause_collector, progress_printer)
from xdiag.cli.runs import call_plane, control_plane, run_and_session
from xdiag.cli.options import MAX_PROFILE_OPTION, PATH_HELP, RUN_HELP, SESSION_HELP, STACK_DIR, TOKEN_OPTION, URL_OPTION
from xdiag.errors import XdiagError

WAITING_NICENESS = 5
"""How much lower `xdiag analyze --xprof-wait` runs than XProf's converter it waits for."""

app = typer.Typer()


@app.command()
def analyze(
    path: Annotated[Path, typer.Argument(help=PATH_HELP)],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Output folder (default ./xdiag-out/<session>, or <session>-2, … where that holds another profile's analysis).")] = None,
    investigator: Annotated[str, typer.Option(envvar="XDIAG_INVESTIGATOR", help="rules (built-in, no network) or gemini (Vertex AI).")] = "rules",
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir (default: the newest).")] = None,
    max_profile_gib: Annotated[float, MAX_PROFILE_OPTION] = 2.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines; print only the report path.")] = False,
    no_xprof_views: Annotated[bool, typer.Option("--no-xprof-views", help="Skip XProf's own converters on TPU/GPU profiles (they take seconds per view on large profiles); the tools that need them say so.")] = False,
    source_root: Annotated[Optional[Path], typer.Option("--source-root", help="A checkout holding the profiled program's files, for the report's code (as `xdiag lines --source-root`): each path the profile records is read at its longest suffix that is a file under DIR, and only there (a link leading out of DIR is not followed).")] = None,
    xprof_wait: Annotated[float, typer.Option("--xprof-wait", min=0, help="Seconds the analysis may wait for XProf's views of a TPU/GPU session of 16 MiB or more, converted beside it in a process of their own and kept per file version (the next analysis of the files has them); 0: the report never waits for them.")] = 0.0,
    project: Annotated[Optional[str], typer.Option(help="Google Cloud project for Gemini on Vertex AI (env VERTEX_PROJECT).")] = None,
    location: Annotated[Optional[str], typer.Option(help="Vertex AI location (env VERTEX_LOCATION; default us-central1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Gemini model (env VERTEX_MODEL; default gemini-2.5-flash).")] = None,
) -> None:
    """Analyse one profile session: the broad tools, an investigation, and summary.html.

    With --investigator gemini, Gemini on Vertex AI investigates (Application Default Credentials; VERTEX_BASE_URL
    points it at a private endpoint); if it fails, the rule engine does, and the report says why.
    """
    pause_collector()  # until the imports below are done and frozen
    from xdiag.profile.locate import locate_session

    one_of("--investigator", investigator, ("rules", "gemini"))
    if no_xprof_views:
        from xdiag.analysis.xprof import XPROF_VIEWS_ENV

        os.environ[XPROF_VIEWS_ENV] = "0"
    from xdiag.analysis.source_code import SOURCE_ROOT_ENV, allow_recorded_paths

    allow_recorded_paths()  # the user's own profile on their own machine: its recorded paths are theirs to read
    if source_root is not None:
        if not is_folder(source_root):
            fail(f"--source-root {source_root}: not a folder")
        os.environ[SOURCE_ROOT_ENV] = str(source_root.absolute())
    investigators = {}
    if investigator == "gemini":
        from xdiag.investigators.gemini import gemini_factory
        from xdiag.investigators.gemini.config import GeminiConfig

        try:
            investigators["gemini"] = gemini_factory(GeminiConfig.from_env(project=project, location=location, model=model))
        except ValueError as exc:
            fail(str(exc))
    try:
        located = locate_session(path, session)
    except XdiagError as exc:
        fail(str(exc))
    from xdiag.analysis.xprof import analysis_views
    from xdiag.profile.reader import one_malloc_arena

    if is_own_process():
        one_malloc_arena()  # before the read's threads, and any other, start

    def views_folder() -> Path:  # the local cache's, loaded only for views converted beside the analysis
        from xdiag.agent.result_cache import ResultCache

        return ResultCache.from_env().views_folder(located.files)

    max_bytes = int(max_profile_gib * 2**30)
    started_views = analysis_views(located.files, max_bytes, views_folder,
                                   xprof_wait)  # before the pipeline's imports, on the core they leave idle
    if xprof_wait > 0 and getattr(started_views, "pid", None) is not None:
        # The report waits for XProf's converter, which then holds the longest path: this process yields the cores
        # to it (87.6 MiB TPU v5e capture, --xprof-wait, 3 pairs alternating on an idle machine: 9.06-10.27 s at
        # the same priority, 8.35-9.98 s this much lower).
        try:
            os.nice(WAITING_NICENESS)
        except OSError:
            pass
    on_event, on_read = progress_printer(quiet)
    read_ahead = None
    if len(located.files) == 1:  # (a session of several hosts is read host by host, in worker processes)
        from xdiag.profile.reader import read_threads
        from xdiag.profile.session import ReadAhead

        read_ahead = ReadAhead(located.files[0], located.name, max_bytes, on_read,
                               read_threads(getattr(started_views, "workers_converting", 0)))  # under the imports
    try:
        from xdiag.cloud.embedded import analysis_folder, analyze_session, build_embedded

        freeze_collector()
        target = out_dir or analysis_folder(Path("xdiag-out"), located)
        deps = build_embedded(max_bytes=max_bytes, on_event=on_event, read_progress=on_read,
                              investigators=investigators, started_views=(located.files, started_views))
        if read_ahead is not None:
            deps[0].sessions.take_read(read_ahead)
        try:
            analysis = analyze_session(located, target, investigator=investigator, deps_and_bus=deps)
        except XdiagError as exc:  # the outputs cannot be written where they would go (UnsafeOutput)
            fail(str(exc))
    finally:
        if read_ahead is not None:
            read_ahead.close()  # where no load took it (the outputs could not be written)
    report = Path(analysis.report_uri) if analysis.report_uri else target / "summary.html"
    if analysis.status == "FAILED":  # one line: the reason, then where the report says it too
        fail(f"{analysis.failure_reason or 'analysis failed'} (report: {report})")
    from xdiag.agent.result_cache import ResultCache, keep_analysis_answers

    pending = getattr(started_views, "folder", None)  # BackgroundViews: views converted beside the analysis
    keep_analysis_answers(ResultCache.from_env(), located.files, target,
                          views_pending=json.dumps(str(pending))[1:-1] if pending is not None else None)
    status = analysis.result.value if analysis.result else analysis.status
    if not quiet:
        colour = "green" if status == "OPTIMAL" else "yellow"
        err.print(f"[bold {colour}]{status}[/]: {analysis.diagnosis.summary if analysis.diagnosis else ''}", highlight=False)
        for finding in (analysis.diagnosis.findings if analysis.diagnosis else [])[:5]:
            err.print(f"  [bold]{finding.priority}[/] {finding.title}", highlight=False)
    typer.echo(str(report))  # as it is: a path is never markup, and a script reads this line


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
    max_profile_gib: Annotated[float, MAX_PROFILE_OPTION] = 2.0,
    show_help: Annotated[bool, typer.Option("--help", "-h", help="This help; with NAME, the tool's arguments and the fields it returns.")] = False,
) -> None:
    """Run one tool on a session and print its JSON result. The decoded profile and the answer are kept per file
    version (a second call answers from the cache); a failed answer is never kept."""
    if show_help or name is None:
        if name is None:
            typer.echo(ctx.get_help())  # as it is: its `[name]`, `<list[str]>` are no markup
            return
        from xdiag.tools import REGISTRY
        from xdiag.tools.describe import help_text

        if name not in REGISTRY:
            fail(f"unknown tool {name!r}; `xdiag tools` lists them")
        sys.stdout.write(help_text(REGISTRY[name]) + "\n")
        return
    if path is None:
        fail(f"xdiag tool {name}: PATH is missing (`xdiag tool {name} --help`)")
    from xdiag.agent.result_cache import ResultCache
    from xdiag.analysis.source_code import allow_recorded_paths
    from xdiag.cli.kept import given_args

    allow_recorded_paths()
    from xdiag.profile.locate import locate_session

    try:
        located = locate_session(path, session)
    except XdiagError as exc:
        fail(str(exc))
    cache = None if no_cache else ResultCache.from_env()
    given = given_args(arg or [])
    kept = cache.answer(located.files, name, given) if cache is not None else None
    if kept is not None:  # only a tool that exists, called with arguments that passed, has an answer kept
        sys.stdout.write(kept)
        return
    from xdiag.agent.result_cache import answer_tool
    from xdiag.tools import REGISTRY
    from xdiag.tools.describe import parse_cli_args

    if name not in REGISTRY:
        fail(f"unknown tool {name!r}; `xdiag tools` lists them")
    try:
        args = parse_cli_args(REGISTRY[name], arg or [])
    except ValueError as exc:
        fail(f"{exc} (`xdiag tool {name} --help`)")
    try:
        text, status = answer_tool(located.files, located.name, name, args, cache, int(max_profile_gib * 2**30),
                                   key_args=given)
    except XdiagError as exc:
        fail(str(exc))
    sys.stdout.write(text)
    if status == "failed":
        raise typer.Exit(1)


@app.command()
def lines(
    path: Annotated[Path, typer.Argument(help=PATH_HELP)],
    source_root: Annotated[Optional[Path], typer.Option("--source-root", help="A checkout holding the profiled program's files: each path the profile records (/home/user/jobs/train.py at capture) is read at its longest suffix that is a file under DIR (DIR/jobs/train.py, else DIR/train.py), as XProf's --src_prefix maps its links, and only there: a link leading out of DIR is not followed. Default: the recorded path.")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=200, help="How many lines and functions to list.")] = 20,
    order: Annotated[str, typer.Option("--order", help="Rank lines by self (default), total (callees included) or host time.")] = "self",
    as_json: Annotated[bool, typer.Option("--json", help="get_line_view's JSON result instead of text.")] = False,
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Decode the profile afresh, keeping nothing.")] = False,
    max_profile_gib: Annotated[float, MAX_PROFILE_OPTION] = 2.0,
) -> None:
    """Your program's lines by device time: each line's self time (ops whose innermost frame of your code is that
    line) and total (ops anywhere below it in the stack), the functions by total (callees included), the op kinds
    on each line, its FLOP rate and bandwidth against the roof of its precision, the host time the Python tracer
    recorded in it, and the code itself (pprof's `top`, `top -cum` and `list` for device time)."""
    from xdiag.agent.result_cache import ResultCache
    from xdiag.analysis.source_code import allow_recorded_paths
    from xdiag.cli.lines import render_lines
    from xdiag.profile.locate import locate_session
    from xdiag.tools import run_tool
    from xdiag.tools.get_line_view import ORDERS

    one_of("--order", order, ORDERS)
    allow_recorded_paths()
    if source_root is not None and not is_folder(source_root):
        fail(f"--source-root {source_root}: not a folder")
    try:
        located = locate_session(path, session)
    except XdiagError as exc:
        fail(str(exc))
    args: dict = {"top_n": top, "order": order}
    if source_root is not None:
        args["source_root"] = str(source_root.absolute())
    max_bytes = int(max_profile_gib * 2**30)
    try:
        if no_cache:
            from xdiag.profile.session import read_session

            read = read_session(located.files, name=located.name, max_bytes=max_bytes)
        else:  # the decoded profile is kept per file version; the answer is not (the code it quotes may change)
            read = ResultCache.from_env().session(located.files, located.name, max_bytes)
    except XdiagError as exc:
        fail(str(exc))
    try:
        result = run_tool(read, "get_line_view", args)
    finally:
        read.close()
    if as_json:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        sys.stdout.write(render_lines(result.model_dump(mode="json"), str(path)))
    if result.status.value == "failed":
        raise typer.Exit(1)


@app.command()
def mcp(
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio.")] = False,
    port: Annotated[int, typer.Option(help="With --http: the port (0: any free one; the URL is printed on stderr).")] = 8792,
    allow: Annotated[Optional[list[Path]], typer.Option(
        "--allow", help="A folder the calls may read profiles from and write analyses to (repeatable); with the "
                        "client's MCP roots, they bound every path a call names (none of either: no bound).")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="How many tool calls run at once (each in a process of its own), beside one analysis.")] = 2,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every tool afresh, keeping nothing.")] = False,
    max_profile_gib: Annotated[float, MAX_PROFILE_OPTION] = 2.0,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Serve xdiag to a coding agent over MCP (Gemini CLI, Claude Code, Cursor): every tool with its schema,
    analyze, list_sessions and explain_finding. stdio by default (the agent starts `xdiag mcp`); --http serves
    http://127.0.0.1:PORT/mcp, and with XDIAG_MCP_TOKEN set every request must carry `Authorization: Bearer
    <token>`. docs/howto/agent.md has each client's configuration."""
    try:
        import mcp as _  # noqa: F401
    except ImportError:
        fail("xdiag mcp needs the MCP SDK: pip install 'xdiag[mcp]'", 1)
    from xdiag.agent.mcp_server import XdiagTools, serve_http, serve_stdio
    from xdiag.agent.result_cache import ResultCache
    from xdiag.analysis.source_code import allow_recorded_paths

    allow_recorded_paths()  # the user's agent: inside the roots and --allow folders where there are any

    missing = [str(folder) for folder in allow or [] if not is_folder(folder)]
    if missing:
        fail(f"--allow {', '.join(missing)}: not a folder")
    tools = XdiagTools(None if no_cache else ResultCache.from_env(), int(max_profile_gib * 2**30), stack_dir)
    if not http:
        serve_stdio(tools, workers, allow)
        return

    def ready(bound: int) -> None:
        err.print(f"xdiag MCP server at http://127.0.0.1:{bound}/mcp", highlight=False, soft_wrap=True)

    serve_http(tools, port, on_ready=ready, workers=workers, allow=allow,
               token=os.environ.get("XDIAG_MCP_TOKEN") or None)


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

    one_of("--workload", workload, tuple(WORKLOADS))
    err.print(f"profiling the bundled workload [bold]{workload}[/]: {WORKLOADS[workload].problem}", highlight=False)
    try:
        xplane = capture_workload(workload, out_dir / "profiles")
    except Exception as exc:  # the capture runs a subprocess: its failure is the user's answer
        fail(f"capturing {workload} failed: {exc}", 1)
    err.print(f"captured {xplane} ({xplane.stat().st_size / 2**20:.2f} MiB)", highlight=False)
    analyze(xplane, out_dir=out_dir / "analysis")


# --- diff and report -------------------------------------------------------------------------------------------


def _local_outputs(path: Path, label: str):
    """An analysis folder as it is, or a profile (file, session folder, log dir) analysed first by the embedded
    default into ./xdiag-out/<session> (or <session>-2, …: never over another profile's analysis)."""
    from xdiag.cloud.embedded import analysis_folder, analyze_session, build_embedded
    from xdiag.compare.outputs import ANALYSIS_FILE, load_folder
    from xdiag.profile.locate import locate_session

    if is_folder(path) and (path / ANALYSIS_FILE).exists():
        return load_folder(path, label)
    located = locate_session(path, None)
    target = analysis_folder(Path("xdiag-out"), located)
    err.print(f"analysing {path} into {target}", highlight=False, soft_wrap=True)
    analysis = analyze_session(located, target, deps_and_bus=build_embedded())
    if analysis.status == "FAILED":
        fail(f"{label}: the analysis failed: {analysis.failure_reason}")
    return load_folder(target, label)


def _stored_outputs(spec: str, run: Optional[str], url, token, stack_dir: Path):
    """A session analysed by the pipeline (RUN/SESSION): its outputs read from the bucket."""
    from xdiag.cloud.gcs import GcsBlobStore, storage_client
    from xdiag.cloud.operations import client_config
    from xdiag.compare.outputs import load_outputs

    client = control_plane(url, token, stack_dir)
    run_id, session_id = run_and_session(client, spec, run)
    report = ((call_plane(client.session, run_id, session_id).get("analysis") or {}).get("report_uri"))
    if not report:
        fail(f"session {session_id} of run {run_id} has no finished analysis yet (`xdiag sessions --run {run_id}`)")
    config = client_config()
    blobs = GcsBlobStore(storage_client(config.project), Path(config.cache_dir))
    return load_outputs(blobs, report.rsplit("/", 1)[0], f"{run_id}/{session_id}")


LOCAL_PATH_ENDINGS = (".pb", ".json", ".gz", ".xz", "/")
"""A missing argument ending so names a file or folder here, never a RUN/SESSION."""


def _outputs(spec: str, run, url, token, stack_dir: Path):
    """A side of `xdiag diff`: a local analysis folder or profile where one is there, else a pipeline's session."""
    from xdiag.cloud.stack_config import load_stack_env

    if not os.path.lexists(spec):
        local = spec.endswith(LOCAL_PATH_ENDINGS) or spec.startswith(("/", "./", "../", "~"))
        if local or not (url or load_stack_env(stack_dir).get("XDIAG_CONTROL_PLANE_URL")):
            fail(f"{spec}: no such file or folder" + ("" if local else " (nor a RUN/SESSION: no control plane is "
                                                                      "set, --url or `xdiag up`)"))
    try:
        return _local_outputs(Path(spec), spec) if os.path.lexists(spec) else _stored_outputs(spec, run, url, token,
                                                                                                stack_dir)
    except XdiagError as exc:
        fail(str(exc))


def _diff_folder(diff) -> Path:
    """Where diff.html and diff.json go when --out names none: ./xdiag-out/diff-<before>-<after> (or -2, …: never
    over another comparison, only an earlier one of the same two analyses)."""
    from xdiag.compare.html import DIFF_FILE
    from xdiag.fresh_files import unclaimed_folder

    sides = [(ref.analysis_id, ref.report_uri) for ref in (diff.baseline, diff.candidate)]

    def holds_the_same(folder: Path) -> bool:
        try:
            written = json.loads((folder / DIFF_FILE).read_bytes())
            return [(written[s]["analysis_id"], written[s]["report_uri"]) for s in ("baseline", "candidate")] == sides
        except (OSError, ValueError, TypeError, KeyError):
            return False

    return unclaimed_folder(Path("xdiag-out"), f"diff-{diff.baseline.session_id}-{diff.candidate.session_id}",
                            holds_the_same)


@app.command()
def diff(
    baseline: Annotated[str, typer.Argument(help="Before: an analysis folder, a profile (analysed first), or RUN/SESSION.")],
    candidate: Annotated[str, typer.Argument(help="After: the same forms.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Where diff.html and diff.json go (default ./xdiag-out/diff-<before>-<after>).")] = None,
    run: Annotated[Optional[str], typer.Option(help=RUN_HELP + " For sessions named without their run.")] = None,
    top: Annotated[int, typer.Option(min=1, max=200, help="Ops and kernels listed per group.")] = 15,
    fail_if_slower: Annotated[Optional[str], typer.Option("--fail-if-slower", help="A regression gate: exit 3 when AFTER is slower by more than this (e.g. 5%) with the step test's confidence (its 95% interval of the change lies wholly above it); exit 2 where there is no verdict (too few steps, or captures that cannot be compared).")] = None,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Did it work? The step time of each side with its interval and a verdict (faster, slower, no change, not
    enough steps), each finding of BEFORE gone, smaller or unchanged with its predicted and realized gain, the lines
    whose device time moved most; then the breakdown, ops and kernels per step, memory peak. Captures of other
    platforms, devices or programs are refused (exit 2): no verdict compares them."""
    from xdiag.compare.html import write_diff
    from xdiag.compare.outputs import compare_outputs
    from xdiag.compare.steps import slower_than

    threshold = _percent(fail_if_slower) if fail_if_slower is not None else None
    if out_dir is not None:
        folder_to_write("--out", out_dir, "name a folder for diff.html and diff.json")
    before = _outputs(baseline, run, url, token, stack_dir)
    after = _outputs(candidate, run, url, token, stack_dir)
    try:
        result = compare_outputs(before, after, top=top)
    except XdiagError as exc:
        fail(str(exc))
    if result.refused_because:
        fail(f"not compared: {result.refused_because}; a verdict compares two captures of one program on one kind "
             "of device")
    target = out_dir or _diff_folder(result)
    try:
        _, html = write_diff(result, target)
    except OSError as exc:
        fail(f"--out {target}: diff.html and diff.json cannot be written there ({exc.strerror or exc})")
    err.print(f"[bold]{result.verdict.replace('_', ' ').upper()}[/]", highlight=False)
    for line in result.headline:
        err.print(f"  {line}", highlight=False, soft_wrap=True)
    out.print(str(html), highlight=False, soft_wrap=True)
    if threshold is None:
        return
    test = result.step_test
    if slower_than(test, threshold):
        err.print(f"[bold red]regression[/]: {test.change_percent:+.1f}% per step (95% interval {test.ci_low_percent:+.1f}% "
                  f"to {test.ci_high_percent:+.1f}%), over the {threshold:g}% allowed", highlight=False)
        raise typer.Exit(REGRESSION_EXIT)
    if result.verdict not in ("faster", "slower", "no_change"):  # fail-safe: a gate passes only what it measured
        fail(f"--fail-if-slower: no verdict ({result.verdict.replace('_', ' ')}: {test.reason}); the gate passes "
             "only captures it can compare")


REGRESSION_EXIT = 3  # `xdiag diff --fail-if-slower`: AFTER is slower than allowed (1 and 2 are errors and usage)


def _percent(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        fail(f"--fail-if-slower takes a percentage such as 5% (got {text!r})", 2)
    if not 0 <= value < 1000:
        fail(f"--fail-if-slower takes a percentage from 0% (got {text!r})", 2)
    return value


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

        client = control_plane(url, token, stack_dir)
        run_id, session_id = run_and_session(client, session, run)
        uri = (call_plane(client.session, run_id, session_id).get("analysis") or {}).get("report_uri")
        if not uri:
            fail(f"session {session_id} of run {run_id} has no report yet (`xdiag sessions --run {run_id}`)")
        config = client_config()
        path = (out_dir / run_id.replace("/", "~") / session_id / "summary.html").absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(GcsBlobStore(storage_client(config.project), Path(config.cache_dir)).get(uri))
        err.print(f"downloaded {uri}", highlight=False, soft_wrap=True)
    if open_it:
        import webbrowser

        webbrowser.open(path.as_uri())
    out.print(str(path), highlight=False, soft_wrap=True)


