"""The `xdiag` command line: one app made of the command families (`local`, `stack`, `runs`), each a typer app
whose commands import what they run inside their bodies. Typer and the families are imported on first use (`app`,
`main`): a cached `xdiag tool` answer is printed without them (xdiag.cli.kept)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer


@functools.cache
def _families() -> tuple[typer.Typer, ...]:
    from xdiag.cli import local, runs, stack

    return (local.app, stack.app, runs.app)


def _app(*families: typer.Typer) -> typer.Typer:
    import typer

    made = typer.Typer(
        help="xdiag: capture ML workload profiles and diagnose them (OPTIMAL, or prioritised findings with evidence and fixes).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,  # click's plain help and usage errors: typer's rich formatting imports 0.1 s of modules
    )
    for family in families:
        made.add_typer(family)
    return made


@functools.cache
def _whole_app() -> typer.Typer:
    return _app(*_families())


def __getattr__(name: str):  # `app`, the whole app, made on first use
    if name == "app":
        return _whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _names(family: typer.Typer) -> set[str]:
    """The command and group names a family adds at the top level."""
    import typer

    return {command.name or typer.main.get_command_name(command.callback.__name__)
            for command in family.registered_commands} | {group.name for group in family.registered_groups}


def _app_for(args: list[str]) -> typer.Typer:
    """The app a command line runs: where its first word names a command of one family, an app of that family alone
    (typer builds every command's parameters before it parses: 30 ms for all three families, 13 for `local`, on the
    path of every `xdiag analyze`); else the whole app (help, a mistyped command)."""
    holding = [family for family in _families() if args and args[0] in _names(family)]
    return _app(*holding) if len(holding) == 1 else _whole_app()


def main() -> None:  # console-script entry point
    import sys

    from xdiag.cli.kept import kept_tool_answer

    kept = kept_tool_answer(sys.argv[1:])  # before typer's and the families' imports
    if kept is not None:
        sys.stdout.write(kept)
        return
    from xdiag.cli.console import freeze_collector, mark_own_process
    from xdiag.profile.scratch import exit_on_sigterm

    mark_own_process()
    exit_on_sigterm()  # SIGTERM unwinds: temporary folders go with the process
    try:
        _app_for(sys.argv[1:])()
    finally:
        freeze_collector()
