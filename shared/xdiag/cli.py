"""The `xdiag` command line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from xdiag.errors import XdiagError

app = typer.Typer(
    help="xdiag: capture ML workload profiles and diagnose them (OPTIMAL, or prioritised findings with evidence and fixes).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

PATH_HELP = "An *.xplane.pb file, a folder of one session's *.xplane.pb (one per host), or an XProf log dir (…/plugins/profile/<session>/)."


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]xdiag:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _progress_printer(quiet: bool):
    started = time.perf_counter()
    state = {"tools": 0, "last_read": 0.0}

    def on_event(stage: str, info: dict[str, Any]) -> None:
        if quiet:
            return
        elapsed = f"[dim]{time.perf_counter() - started:6.2f}s[/]"
        if stage == "collect" and "failed" in info:
            err.print(f"{elapsed} [red]read failed[/]: {info['failed']}", highlight=False)
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
                f"{elapsed} tool   {state['tools']:2d}/15 {info['tool']:<36} [{colour}]{info['status']}[/] "
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
    project: Annotated[Optional[str], typer.Option(help="Google Cloud project for Gemini on Vertex AI (env VERTEX_PROJECT).")] = None,
    location: Annotated[Optional[str], typer.Option(help="Vertex AI location (env VERTEX_LOCATION; default us-central1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Gemini model (env VERTEX_MODEL; default gemini-2.5-flash).")] = None,
) -> None:
    """Analyse one profile session: 15 tools, an investigation, and summary.html.

    With --investigator gemini, Gemini on Vertex AI investigates (Application Default Credentials; VERTEX_BASE_URL
    points it at a private endpoint); if it fails, the rule engine does, and the report says why.
    """
    from xdiag.embedded import analyze_session, build_embedded
    from xdiag.locate import locate_session

    if investigator not in ("rules", "gemini"):
        _fail(f"unknown investigator {investigator!r}; use rules or gemini")
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
    target = out_dir or Path("xdiag-out") / located.name
    on_event, on_read = _progress_printer(quiet)
    deps = build_embedded(max_bytes=int(max_profile_gib * 2**30), on_event=on_event, read_progress=on_read,
                          investigators=investigators)
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
def list_tools() -> None:
    """List the tools: the 15 broad ones every analysis runs, and the follow-ups."""
    from xdiag.tools import REGISTRY

    for name, spec in sorted(REGISTRY.items(), key=lambda kv: (not kv[1].broad, kv[0])):
        kind = "broad" if spec.broad else "follow-up"
        args = ", ".join(f"{a}{'*' if p.get('required') else ''}" for a, p in spec.parameters.items())
        out.print(f"[bold]{name}[/] [dim]({kind}{'; args: ' + args if args else ''})[/]\n    {spec.question}", highlight=False)


@app.command("tool")
def one_tool(
    name: Annotated[str, typer.Argument(help="Tool name (see `xdiag tools`).")],
    path: Annotated[Path, typer.Argument(help=PATH_HELP)],
    arg: Annotated[Optional[list[str]], typer.Option("--arg", help="Tool argument as key=value (repeatable).")] = None,
    session: Annotated[Optional[str], typer.Option(help="Session name inside a log dir.")] = None,
) -> None:
    """Run one tool on a session and print its JSON result."""
    from xdiag.locate import locate_session
    from xdiag.profile.reader import read_session
    from xdiag.tools import REGISTRY, run_tool

    if name not in REGISTRY:
        _fail(f"unknown tool {name!r}; `xdiag tools` lists them")
    args: dict[str, Any] = {}
    for item in arg or []:
        key, sep, value = item.partition("=")
        if not sep:
            _fail(f"--arg {item!r}: expected key=value")
        kind = REGISTRY[name].parameters.get(key, {}).get("type")
        try:
            args[key] = int(value) if kind == "integer" else value
        except ValueError:
            _fail(f"--arg {key}: {value!r} is not an integer")
    try:
        located = locate_session(path, session)
        loaded = read_session(located.files, name=located.name)
    except XdiagError as exc:
        _fail(str(exc))
    result = run_tool(loaded, name, args)
    sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    if result.status.value == "failed":
        raise typer.Exit(1)


@app.command()
def demo(
    workload: Annotated[str, typer.Option(help="Bundled workload to profile (see `python -m xdiag.workloads --list`).")] = "input_bound",
    out_dir: Annotated[Path, typer.Option("--out", help="Where the profile and the analysis go.")] = Path("xdiag-out/demo"),
) -> None:
    """Run a bundled JAX example on this machine, capture a real profile, analyse it."""
    from xdiag.workloads import WORKLOADS
    from xdiag.workloads.capture import capture_workload

    if workload not in WORKLOADS:
        _fail(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    err.print(f"profiling the bundled workload [bold]{workload}[/]: {WORKLOADS[workload].problem}", highlight=False)
    try:
        xplane = capture_workload(workload, out_dir / "profiles")
    except Exception as exc:  # the capture runs a subprocess: its failure is the user's answer
        _fail(f"capturing {workload} failed: {exc}", 1)
    err.print(f"captured {xplane} ({xplane.stat().st_size / 2**20:.2f} MiB)", highlight=False)
    analyze(xplane, out_dir / "analysis", "rules", None, 2.0, False)


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    main()
