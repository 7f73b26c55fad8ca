"""A cached `xdiag tool` answer, printed before typer and the command families are imported: an agent that calls
the command line once per question pays the interpreter, the cache's lookup and nothing more (typer converts every
parameter through pydantic, and the families import their options' modules)."""

from __future__ import annotations

from pathlib import Path

_VALUED = ("--arg", "--session")
"""The options of `xdiag tool` read here; any other word starting with `-` leaves the command line to typer."""


def given_args(items: list[str]) -> dict[str, str]:
    """`--arg key=value` items as typed: what a kept answer is keyed by."""
    return dict(item.partition("=")[::2] for item in items)


def kept_tool_answer(args: list[str]) -> str | None:
    """The answer the local result cache keeps for `tool NAME PATH [--arg K=V]... [--session S]`, or None: another
    command, any other option or form, no answer kept, a path that cannot be located. The command line then runs
    through typer as ever, which looks again and says what is wrong."""
    if args[:1] != ["tool"]:
        return None
    positional: list[str] = []
    options: dict[str, list[str]] = {option: [] for option in _VALUED}
    words = iter(args[1:])
    for word in words:
        option, equals, value = word.partition("=")
        if option in _VALUED and not equals:
            value = next(words, "-")
        if option in _VALUED and value and not value.startswith("-"):
            options[option].append(value)
        elif word.startswith("-") or not word:
            return None
        else:
            positional.append(word)
    if len(positional) != 2 or len(options["--session"]) > 1:
        return None
    from xdiag.agent.result_cache import ResultCache
    from xdiag.errors import XdiagError
    from xdiag.profile.locate import locate_session

    name, path = positional
    try:
        located = locate_session(Path(path), options["--session"][0] if options["--session"] else None)
        cache = ResultCache.from_env()
    except (XdiagError, OSError, ValueError):
        return None
    return cache.answer(located.files, name, given_args(options["--arg"]))
