"""The control plane's commands (the cloud, or the local stack): capture, continuous profiling, runs, sessions, share
links and monitored events; and XProf's viewer over every run's sessions (view)."""

# No `from __future__ import annotations`: typer would evaluate each command's annotations from their text, twice,
# every time it builds the app (`xdiag --help` builds all 21 commands); here they are evaluated once, at import.

import functools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from xdiag.cli.console import err, fail, out
from xdiag.cli.options import HOSTS_HELP, RUN_HELP, SESSION_HELP, STACK_DIR, TOKEN_OPTION, URL_OPTION

app = typer.Typer()


def control_plane(url: Optional[str], token: Optional[str], stack_dir: Path):
    from xdiag.control.client import ControlPlaneClient, ControlPlaneError
    from xdiag.cloud.stack_config import load_stack_env

    env = load_stack_env(stack_dir)
    url = url or env.get("XDIAG_CONTROL_PLANE_URL")
    if not url:
        fail("no control plane: pass --url or set XDIAG_CONTROL_PLANE_URL (or start the local stack: `xdiag up`)")
    try:
        return ControlPlaneClient(url, token or env.get("XDIAG_CONTROL_PLANE_TOKEN"), timeout_s=30.0)
    except ControlPlaneError as exc:
        fail(str(exc))


def call_plane(what, *args, **kwargs):
    """The control plane's answer to one call; exits 2 on a refusal (4xx), 1 otherwise."""
    from xdiag.control.client import ControlPlaneError

    try:
        return what(*args, **kwargs)
    except ControlPlaneError as exc:
        fail(str(exc), 2 if 400 <= exc.status < 500 else 1)


def resolve_run(client, text: str) -> str:
    """A run's id from its id or its display name (unique)."""
    runs = call_plane(client.runs)
    if any(r["run_id"] == text or r["id"] == text for r in runs):
        return text
    named = [r["run_id"] for r in runs if r.get("display_name") == text]
    if len(named) > 1:
        fail(f"{len(named)} runs are named {text!r}: {', '.join(named)}; give the run's id")
    return named[0] if named else text  # unknown: the control plane says so


def run_and_session(client, spec: str, run: Optional[str]) -> tuple[str, str]:
    if run:
        return resolve_run(client, run), spec
    head, sep, tail = spec.rpartition("/")
    if not sep or not head or not tail:
        fail(f"{spec!r}: name the session as RUN/SESSION, or pass --run")
    return resolve_run(client, head), tail


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
        doc = call_plane(client.session, run, session)
        analysis = doc.get("analysis") or {}
        if doc.get("status") in ("FAILED", "NO_BUFFER") or analysis.get("status") in ("DONE", "FAILED"):
            return doc
        if time.monotonic() > deadline:
            fail(f"session {session} of run {run} is still {doc.get('status')} after {timeout:.0f} s "
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
    host_tracer: Annotated[Optional[int], typer.Option("--host-tracer", min=0, max=3, help="Host tracer level 0-3 (default 2).")] = None,
    device_tracer: Annotated[Optional[int], typer.Option("--device-tracer", min=0, max=2, help="Device tracer level 0-2 (default 1).")] = None,
    python_tracer: Annotated[Optional[int], typer.Option("--python-tracer", min=0, max=1, help="Python tracer level 0-1 (default 0).")] = None,
    session: Annotated[Optional[str], typer.Option(help="Name of the new session (default: a timestamp).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the analysis and print summary.html's URI.")] = True,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600.0,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Capture a profile now from the run's registered profiler targets (all in parallel), then analyse it."""
    client = control_plane(url, token, stack_dir)
    run = resolve_run(client, run)
    started = time.time()
    answer = call_plane(client.capture, run, duration_ms=parse_duration_ms(duration), hosts=_hosts(hosts),
                        host_tracer_level=host_tracer, device_tracer_level=device_tracer,
                        python_tracer_level=python_tracer, session_id=session)
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
    device_tracer: Annotated[int, typer.Option("--device-tracer", min=0, max=2, help="Device tracer level 0-2.")] = 1,
    url: Annotated[Optional[str], URL_OPTION] = None,
    token: Annotated[Optional[str], TOKEN_OPTION] = None,
    stack_dir: Annotated[Path, STACK_DIR] = Path(".xdiag-stack"),
) -> None:
    """Start continuous profiling on the run's targets (device traces into the profiler's circular buffer)."""
    client = control_plane(url, token, stack_dir)
    answer = call_plane(client.continuous, resolve_run(client, run), "start", hosts=_hosts(hosts),
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
    client = control_plane(url, token, stack_dir)
    _print_continuous(call_plane(client.continuous, resolve_run(client, run), "stop", hosts=_hosts(hosts)))


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
    client = control_plane(url, token, stack_dir)
    run = resolve_run(client, run)
    started = time.time()
    answer = call_plane(client.continuous, run, "snapshot", name=name, hosts=_hosts(hosts))
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
        fail(doc.get("reason") or f"the {what} failed", 1)
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
    found = call_plane(control_plane(url, token, stack_dir).runs)
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
    """A run's sessions: kind (programmatic, on_demand, snapshot, auto), status, analysis, report, and the baseline
    each was compared with (an automatic capture's: the run's last healthy session) with what changed since."""
    client = control_plane(url, token, stack_dir)
    found = call_plane(client.sessions, resolve_run(client, run))
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
        return
    for doc in found:
        _print_session(doc)
        report = (doc.get("analysis") or {}).get("report_uri")
        if report:
            out.print(f"  {report}", highlight=False, soft_wrap=True)
        baseline = (doc.get("analysis") or {}).get("baseline")
        if baseline:  # the session it was compared with, what changed since, and the comparison
            out.print(f"  baseline ({baseline.get('role')}): {baseline.get('session_id')}: {baseline.get('since')}",
                      highlight=False, soft_wrap=True)
            out.print(f"    {baseline.get('diff_uri')}", highlight=False, soft_wrap=True)
    if not found:
        out.print(f"run {run} has no sessions yet", highlight=False)


# --- view ------------------------------------------------------------------------------------------------------


def _bucket_source(stack_dir: Path, view_dir: Path):
    """The profile bucket of the local stack or of a cloud deployment, where one is configured; else None."""
    from xdiag.cloud.stack_config import load_stack_env
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
    from xdiag.pipeline.topics import ANALYSES, sessions_collection
    from xdiag.viewer.sources import CACHE_BYTES, BucketSource

    state = functools.cache(lambda: state_store(config))  # made once, where a kind is first asked for

    def kind_of(run_path: str, session: str) -> str | None:
        """The kind Firestore recorded; None (the kind in the session's id) where Firestore cannot be read."""
        try:
            doc = state().get(sessions_collection(run_for_path(state(), run_path)), state_key(session)) or {}
        except (GoogleAPIError, GoogleAuthError):
            return None
        return doc.get("kind")

    def baseline_of(run_path: str, session: str) -> dict | None:
        """The baseline the session's analysis was compared with (an automatic capture's: the last healthy one)."""
        try:
            doc = state().get(sessions_collection(run_for_path(state(), run_path)), state_key(session)) or {}
            analysis = state().get(ANALYSES, doc["analysis_id"]) if doc.get("analysis_id") else None
        except (GoogleAPIError, GoogleAuthError):
            return None
        return (analysis or {}).get("baseline")

    blobs = GcsBlobStore(storage_client(config.project), view_dir / "cache", CACHE_BYTES)
    return BucketSource(root=config.profile_root, blobs=blobs, emulator=bool(os.environ.get("STORAGE_EMULATOR_HOST")),
                        kind_of=kind_of, baseline_of=baseline_of)


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
        fail(str(exc), 1)
    for s in plan.sessions:
        err.print(f"  {s.name}  [bold]{s.kind}[/]  {session_link(s.run, s.session, 'trace_viewer@', server.url)}",
                  highlight=False, soft_wrap=True)
        if s.baseline:  # the session it was compared with, in the viewer too, and what changed since
            base = session_link(s.run, s.baseline["session_id"], "trace_viewer@", server.url)
            err.print(f"    baseline ({escape(s.baseline['role'])}): {s.run}/{escape(s.baseline['session_id'])}  {base}",
                      highlight=False, soft_wrap=True)
            err.print(f"    {escape(s.baseline['since'])}  {escape(s.baseline['diff_uri'])}", highlight=False,
                      soft_wrap=True)
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
        fail(f"XProf's server exited with status {server.process.returncode} (log: {server.log})", 1)


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
        fail(str(exc))
    client = control_plane(url, token, stack_dir)
    run_id, session_id = run_and_session(client, session, run)
    link = call_plane(client.request, "POST", f"/v1/runs/{quote(run_id, safe='~')}/sessions/{quote(session_id)}:share",
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

    client = control_plane(url, token, stack_dir)
    query = f"?run={quote(resolve_run(client, run), safe='~')}" if run else ""
    found = call_plane(client.request, "GET", f"/v1/events{query}")["events"]
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

    event = call_plane(control_plane(url, token, stack_dir).request, "GET", f"/v1/events/{quote(event_id)}")
    sys.stdout.write(json.dumps(event, indent=2, default=str) + "\n")

