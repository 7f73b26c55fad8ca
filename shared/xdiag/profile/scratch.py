"""Temporary folders that go with their owner, however it ends.

A folder made here is named for the process that owns it (`xdiag-<kind>-pid<PID>-<random>` in the system's
temporary folder) and removed by it on every exit it can see: the end of its block, an exception, and SIGTERM
(`exit_on_sigterm` makes it a SystemExit, so every `finally` runs). What a process killed outright leaves (SIGKILL:
a cancelled MCP call's worker, the out-of-memory killer) is removed at the next start (`sweep`): any such folder of
this user whose owner is gone. Before, SIGTERM to `analyze` of a 2-host session left 486 MiB of mapped hosts, and a
cancelled MCP `analyze` XProf's private copy, with nothing to remove them (issue 62).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

_NAME = re.compile(r"xdiag-[A-Za-z0-9_.-]+-pid(\d+)-[A-Za-z0-9_]+")


def make(kind: str) -> Path:
    """A new private folder (0700) of this process, for `kind` (a short word: `hosts`, `xprof`); the caller removes
    it. Orphans of earlier processes are swept first."""
    sweep()
    kind = re.sub(r"[^A-Za-z0-9_.-]+", "_", kind) or "scratch"
    return Path(tempfile.mkdtemp(prefix=f"xdiag-{kind}-pid{os.getpid()}-"))


@contextlib.contextmanager
def folder(kind: str) -> Iterator[Path]:
    """make(kind), removed when the block ends, however it ends (SIGTERM too, with exit_on_sigterm)."""
    made = make(kind)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: alive
        return False
    return False


def sweep(root: Path | None = None) -> int:
    """Removes the folders of this user that `make` named for a process that no longer runs; returns how many."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        found = _NAME.fullmatch(entry.name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or not _gone(int(found.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    return removed


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM ends this process as an exception would (status 143), so that its temporary folders are removed;
    where SIGTERM has a handler of the program's own, or off the main thread, nothing changes."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
