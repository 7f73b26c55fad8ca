"""Reads bounded to folders (`xdiag mcp --allow DIR` and the client's roots): a path is read only where it, and
every link on the way, resolves inside one of them, and the file opened is the one checked.

A check of the name a call gives is not enough (issue 62): a link inside an allowed folder leads anywhere, a session
folder lists files that are links, and a link flipped between the check and the read is followed by the read. So
here every path is resolved (`os.path.realpath`: each link on the way) and checked against the roots, and then
opened from the root down, one folder at a time, none of them through a link (`O_NOFOLLOW` at each step): a link
that appears on the way after the check fails the open, it is never followed. What is read is then the file that
was checked, whatever is renamed or linked meanwhile.

The roots are this process's context (`within`), else the environment (`ROOTS_ENV`, JSON), which the processes a
bounded call starts inherit: the MCP worker sets it, its host readers and XProf converters read through it too.
Messages name the path a call gave, never what a link outside leads to, and never a byte of a file outside.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from xdiag.errors import ProfileError

ROOTS_ENV = "XDIAG_CONFINED_ROOTS"
_ROOTS: contextvars.ContextVar[tuple[Path, ...] | None] = contextvars.ContextVar("confined_roots", default=None)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SHOWN_AS_ESCAPES = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls, and Unicode's direction embeddings, overrides and isolates: text after one reads in
another order than it runs (a line of code can show what it does not do)."""


def shown(path: Path | str) -> str:
    """A path as a message may show it: control characters (a tab, a newline, a terminal's escape) and direction
    overrides as escapes."""
    return _SHOWN_AS_ESCAPES.sub(lambda found: ascii(found.group())[1:-1], str(path))


def has_control_characters(text: str) -> bool:
    return _CONTROL.search(text) is not None


class OutsideRoots(ProfileError):
    """A path, or a link on its way, leads outside the folders reads are bounded to."""


def roots() -> tuple[Path, ...] | None:
    """The folders reads are bounded to here, resolved; None where reads are not bounded."""
    own = _ROOTS.get()
    if own is not None:
        return own
    listed = os.environ.get(ROOTS_ENV)
    if not listed:
        return None
    return tuple(Path(os.path.realpath(folder)) for folder in json.loads(listed))


@contextlib.contextmanager
def within(folders: list[Path] | None) -> Iterator[None]:
    """Reads in this context bounded to `folders` (none where it is None or empty)."""
    token = _ROOTS.set(tuple(Path(os.path.realpath(f)) for f in folders) if folders else None)
    try:
        yield
    finally:
        _ROOTS.reset(token)


def bound_environment(folders: list[Path]) -> None:
    """This process, and every process it starts, bounded to `folders`."""
    os.environ[ROOTS_ENV] = json.dumps([os.path.realpath(f) for f in folders])


def _root_of(real: Path, bounds: tuple[Path, ...]) -> Path | None:
    inside = [root for root in bounds if real.is_relative_to(root)]
    return max(inside, key=lambda root: len(root.parts)) if inside else None


def _outside(path: Path | str) -> OutsideRoots:
    return OutsideRoots(f"{shown(path)} is outside the folders this server may use (it, or a link on its way, leads "
                        "elsewhere): the client's roots and `xdiag mcp --allow DIR` set them")


def resolved(path: Path | str, bounds: tuple[Path, ...] | None = None) -> Path:
    """`path` with every link on the way resolved; OutsideRoots where that is outside the bounds (`roots()` where
    none are given). Unbounded: the path as it is."""
    bounds = roots() if bounds is None else bounds
    if not bounds:
        return Path(path)
    real = Path(os.path.realpath(path))
    if _root_of(real, bounds) is None:
        raise _outside(path)
    return real


def is_inside(path: Path | str, bounds: tuple[Path, ...] | None = None) -> bool:
    try:
        resolved(path, bounds)
    except OutsideRoots:
        return False
    return True


def open_fd(path: Path | str, flags: int = os.O_RDONLY, bounds: tuple[Path, ...] | None = None) -> int:
    """A file descriptor of `path` opened with `flags`; where reads are bounded (`bounds`, resolved folders, else
    `roots()`), of the file its resolved path names inside them, opened from the root down with no link followed on
    the way (a link that appeared since the check fails the open: OutsideRoots, never a read elsewhere). OSError as
    os.open raises it."""
    flags |= getattr(os, "O_CLOEXEC", 0)
    bounds = roots() if bounds is None else bounds
    if not bounds:
        return os.open(path, flags)
    real = resolved(path, bounds)
    root = _root_of(real, bounds)
    parts = real.relative_to(root).parts
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                                dir_fd=folder)
            except OSError as exc:
                raise _changed(path, exc) from None
            os.close(folder)
            folder = inner
        if not parts:
            return os.open(root, flags)
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=folder)
        except OSError as exc:
            raise _changed(path, exc) from None
    finally:
        os.close(folder)


def _changed(path: Path | str, exc: OSError) -> OSError:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file, where the check found a folder or a file
        return _outside(path)
    return exc


def open_binary(path: Path | str):
    """`path` opened for reading in binary (open_fd's bounds); the file object's name is the path."""
    fd = open_fd(path)
    return open(path, "rb", opener=lambda _path, _flags: fd)


def read_bytes(path: Path | str) -> bytes:
    with open_binary(path) as handle:
        return handle.read()


def read_text(path: Path | str) -> str:
    return read_bytes(path).decode()


def link_or_copy_opened(source: Path, target: Path) -> None:
    """`target` made the file `source` names (within the bounds): a hard link to the file opened (so a reader by
    name, XProf's converter, reads the file checked, not whatever the name leads to later), else a copy of it."""
    fd = open_fd(source)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(f"{source.name}: not a regular file; not read")
        try:
            os.link(f"/proc/self/fd/{fd}", target, follow_symlinks=True)
            return
        except OSError:  # another file system, or no /proc: a copy
            pass
        with open(fd, "rb", closefd=False) as copied, open(target, "xb") as out:
            shutil.copyfileobj(copied, out)
    finally:
        os.close(fd)
