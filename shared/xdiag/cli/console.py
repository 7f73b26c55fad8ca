"""What the commands print, and how they fail: the consoles, the progress printer of `xdiag analyze`, the one-line
error with its exit code."""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from xdiag.errors import XdiagError

class _Console:
    """A rich Console made on first use: `xdiag analyze` starts XProf's conversions of a device session before it
    imports rich (or pydantic, which xdiag.ids needs), so that they start that much sooner (bench/README.md,
    "Measured design choices")."""

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


def mark_own_process() -> None:
    """Called by `main` alone: xdiag runs as its own console script."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def is_own_process() -> bool:
    """Whether xdiag runs as its own console script (`mark_own_process`): process-wide settings are its to make."""
    return _OWN_PROCESS


def pause_collector() -> None:
    """Stops the collector until `freeze_collector`: the modules a command imports, and what a read under them
    decodes, live as long as the process, so the collections they set off free nothing (`xdiag analyze` of the
    19.3 MiB CPU capture spent 85-195 ms in them, one full collection 43-110 ms of it; bench/README.md, "Measured
    design choices")."""
    if _OWN_PROCESS:
        gc.disable()


def freeze_collector() -> None:
    """Puts every object alive now out of the collector's reach for the rest of the process, and starts the
    collector again where `pause_collector` stopped it: the modules imported for a command live as long as the
    process, and at exit the interpreter's shutdown would otherwise collect over everything still alive (0.13 s after
    analysing the 85 MiB bench profile; bench/README.md, "Measured design choices")."""
    if _OWN_PROCESS:
        gc.freeze()
        gc.enable()


def fail(message: str, code: int = 2) -> None:
    """Exits `code` with `message` on one line of stderr, as it is: a reason quoting a file's name or bytes shows
    them, never reads them as markup (`run[/x]`), and its line breaks become spaces."""
    from rich.markup import escape

    err.print(f"[bold red]xdiag:[/] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def checked(check, *args) -> None:
    """An id from the command line through the one id grammar (xdiag.ids); exits 2 with the reason otherwise."""
    try:
        check(*args)
    except XdiagError as exc:
        fail(str(exc))


def positive_number(option: str, value: float) -> float:
    """A command-line number that must be positive and finite (a size, a bound), checked before any work is done:
    exits 2 otherwise ('nan', 'inf' and -1 parse as floats)."""
    if not 0 < value < math.inf:
        fail(f"{option} {value}: not a positive finite number")
    return value


def is_folder(path: Path) -> bool:
    """Path.is_dir() of a name from the command line, False where the system refuses the name itself (longer than
    it takes: ENAMETOOLONG, which Python 3.11's is_dir() raises)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def folder_to_write(option: str, path: Path, then: str) -> None:
    """A folder named to be written, checked before any work is done: missing is fine (it is made); an existing
    non-folder, or a name the system refuses, exits 2 with `then` (what to name instead)."""
    try:
        path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        fail(f"{option} {path}: not a folder ({exc.strerror or exc}); {then}")
    if not path.is_dir():
        fail(f"{option} {path}: not a folder; {then}")


def one_of(option: str, value: str, choices: Sequence[str]) -> None:
    """A command-line option that takes one of a fixed set of values, checked before any work is done: exits 2 naming
    the choices otherwise."""
    if value not in choices:
        fail(f"{option} {value!r}: not one of {', '.join(choices)}")


def progress_printer(quiet: bool):
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
            from xdiag.tools import BROAD_TOOLS  # here, not above: `xdiag analyze` makes the printer before its imports

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

