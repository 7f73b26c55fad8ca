"""The event-driven pipeline: the local stack (up, down), uploads, its status, publishing a capture."""

# No `from __future__ import annotations`: typer would evaluate each command's annotations from their text, twice,
# every time it builds the app (`xdiag --help` builds all 21 commands); here they are evaluated once, at import.

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from xdiag.cli.console import checked, err, fail, out
from xdiag.cli.options import PATH_HELP, STACK_DIR
from xdiag.errors import XdiagError

app = typer.Typer()

STATUS_PROBE_S = 5.0  # `xdiag status` waits this long for one document before it calls Firestore unresponsive


def _cloud_config(stack_dir: Path, bucket: Optional[str] = None):
    """The pipeline's configuration: the environment, or else the local stack that `xdiag up` started."""
    from xdiag.cloud.stack_config import load_stack_env
    from xdiag.cloud.operations import client_config

    load_stack_env(stack_dir)
    try:
        return client_config(bucket)
    except ValueError as exc:
        fail(f"{exc} (or start the local stack: `xdiag up`)")


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
    from xdiag.cloud.localstack import LocalStack
    from xdiag.cloud.stack_config import STATE_FILE, StackError, StackSettings

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
        fail(str(exc), 1)
    for name, port in stack.ports.items():
        err.print(f"  [dim]{name:<12}[/] 127.0.0.1:{port}", highlight=False, soft_wrap=True)
    for key, value in stack.env.items():
        out.print(f"export {key}={value}", highlight=False, soft_wrap=True)


@app.command()
def down(stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack")) -> None:
    """Stop the local stack: every process group it started (the emulators' Java children too), Firestore's documents
    exported first (the next `xdiag up` imports them)."""
    from xdiag.cloud.localstack import LocalStack
    from xdiag.cloud.stack_config import StackError

    try:
        stack = LocalStack.attach(stack_dir)
    except StackError as exc:
        err.print(str(exc), highlight=False, soft_wrap=True)
        return
    left = stack.stop()
    if left:
        fail(f"local stack stopped, but: {'; '.join(left)}", 1)
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
        fail(str(exc))
    started = time.time()
    for uri in upload_session(located, run, config):
        err.print(f"uploaded {uri}", highlight=False, soft_wrap=True)
    report = output_uri(config.profile_root, run, located.name) + "/summary.html"
    if wait:
        state = state_store(config)
        try:
            analysis = wait_for_analysis(state, run, located.name, timeout, since=started)
        except TimeoutError as exc:
            fail(str(exc), 1)
        for stage in stage_breakdown(state, analysis, uploaded_at=started):
            err.print(f"  {stage.name:<16} {stage.seconds:6.2f} s  [dim]{stage.note}[/]", highlight=False, soft_wrap=True)
        err.print(f"{analysis['status']} {analysis.get('result') or ''} in {time.time() - started:.1f} s after the upload began",
                  highlight=False, soft_wrap=True)
        if analysis["status"] == "FAILED":
            out.print(analysis.get("report_uri") or report, highlight=False, soft_wrap=True)
            fail(f"the analysis FAILED: {analysis.get('failure_reason')}", 1)
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
        checked(check_run_id, run)
    down = unreachable_emulators()
    if down:
        fail("; ".join(down) + " (`xdiag up` starts again what of the local stack is down)", 1)
    what = f"Firestore (project {config.project})"
    try:
        state = state_store(config)
        # One document first: a Firestore that takes connections and never answers (frozen) is told in seconds.
        within(min(timeout, STATUS_PROBE_S), what, lambda: state.get(RUNS, "xdiag-status-probe"))
        report = within(timeout, what, lambda: read_status(state, run, config.stage_deadline_s))
    except TimeoutError as exc:
        fail(f"{exc}: it is down, frozen or unreachable", 1)
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

    checked(check_run_id, run)
    checked(check_name, session, "session id")
    checked(check_name, investigator, "investigator")
    if analysis_id is not None:
        checked(check_name, analysis_id, "analysis id")
    message = publish(_cloud_config(stack_dir), run, session, investigator, analysis_id)
    out.print(message.model_dump_json(exclude_none=True), highlight=False, soft_wrap=True)


