"""The `xdiag` command line: one app made of the command families (`local`, `stack`, `runs`), each a typer app
whose commands import what they run inside their bodies."""

from __future__ import annotations

import typer

from xdiag.cli import local, runs, stack
from xdiag.cli.console import freeze_collector, mark_own_process

FAMILIES = (local.app, stack.app, runs.app)


def _app(*families: typer.Typer) -> typer.Typer:
    made = typer.Typer(
        help="xdiag: capture ML workload profiles and diagnose them (OPTIMAL, or prioritised findings with evidence and fixes).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    for family in families:
        made.add_typer(family)
    return made


app = _app(*FAMILIES)


def _names(family: typer.Typer) -> set[str]:
    """The command and group names a family adds at the top level."""
    return {command.name or typer.main.get_command_name(command.callback.__name__)
            for command in family.registered_commands} | {group.name for group in family.registered_groups}


def _app_for(args: list[str]) -> typer.Typer:
    """The app a command line runs: where its first word names a command of one family, an app of that family alone
    (typer builds every command's parameters before it parses: 30 ms for all three families, 13 for `local`, on the
    path of every `xdiag analyze`); else the whole app (help, a mistyped command)."""
    holding = [family for family in FAMILIES if args and args[0] in _names(family)]
    return _app(*holding) if len(holding) == 1 else app


def main() -> None:  # console-script entry point
    import sys

    from xdiag.profile.scratch import exit_on_sigterm

    mark_own_process()
    exit_on_sigterm()  # SIGTERM unwinds: temporary folders go with the process
    try:
        _app_for(sys.argv[1:])()
    finally:
        freeze_collector()
