"""A folder of cache entries bounded on disk: each entry a folder of files, the least recently used dropped first.

Used by the cloud's download cache (`xdiag.cloud.gcs`) and the local result cache (`xdiag.agent.result_cache`). An
entry's recency is its folder's mtime: making or touching a file in it counts as a use.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

STALE_PART_SECONDS = 3600.0
"""A file in flight (`.<name>...part`) not written to for this long was left by a store that was interrupted (a killed
process): its writer would have renamed it into place within seconds."""


def evict_least_recent(folder: Path, limit: int, keep: Path | None = None) -> int:
    """Drops the least recently used entries of `folder` until their files fit `limit` bytes, never `keep` (the one
    just made), and returns how many files in flight left by interrupted stores it removed. Files in flight count
    towards the limit; those not written to for STALE_PART_SECONDS go first. A file another process is reading stays
    readable (an unlinked file lives while open)."""
    entries = []
    stale = 0
    now = time.time()
    for entry in folder.iterdir():
        files = []
        for name, f, info in _files_under(entry) if entry.is_dir() else ():
            in_flight = name.startswith(".") and name.endswith(".part")
            if in_flight and now - info.st_mtime > STALE_PART_SECONDS:
                _unlink(f)
                stale += 1
                continue
            files.append((f, info.st_size, in_flight))
        entries.append((entry.stat().st_mtime, entry, sum(size for _, size, _ in files),
                        [f for f, _, in_flight in files if not in_flight]))  # its writer renames one in flight
    total = sum(size for _, _, size, _ in entries)
    for _, entry, size, files in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if entry == keep:
            continue
        for f in files:
            _unlink(f)
        try:
            for sub in sorted((d for d in entry.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                sub.rmdir()
            entry.rmdir()
        except OSError:
            continue  # another process is writing into it
        total -= size
    return stale


def _files_under(folder: Path | str) -> Iterator[tuple[str, str, os.stat_result]]:
    """Each file under `folder` (at any depth, not through a link to a folder): its name, path and own stat (a link's,
    not its target's). One scandir per folder: the kinds come with the listing, and only files are stat'ed."""
    try:
        with os.scandir(folder) as items:
            listing = list(items)
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # gone, or unreadable: skipped, as rglob does
        return
    for item in listing:
        try:
            if item.is_dir(follow_symlinks=False):
                yield from _files_under(item.path)
                continue
            info = item.stat(follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) or item.is_file():  # a link counts where it points to a file (Path.is_file)
                yield item.name, item.path, info
        except FileNotFoundError:
            continue


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
