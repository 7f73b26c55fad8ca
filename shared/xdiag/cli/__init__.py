"""The `xdiag` command line: one app made of the command families (`local`, `stack`, `runs`), each a typer app
whose commands import what they run inside their bodies."""

from __future__ import annotations

import typer

from xdiag.cli import local, runs, stack
from xdiag.cli.console import freeze_collector, mark_own_process

app = typer.Typer(
    help="xdiag: capture ML workload profiles and diagnose them (OPTIMAL, or prioritised findings with evidence and fixes).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for family in (local.app, stack.app, runs.app):
    app.add_typer(family)


def main() -> None:  # console-script entry point
    from xdiag.profile.scratch import exit_on_sigterm

    mark_own_process()
    exit_on_sigterm()  # SIGTERM unwinds: temporary folders go with the process
    try:
        app()
    finally:
        freeze_collector()
