"""A folder of cache entries bounded on disk: each entry a folder of files, the least recently used dropped first.

Used by the cloud's download cache (`xdiag.cloud.gcs`) and the local result cache (`xdiag.agent.result_cache`). An
entry's recency is its folder's mtime: making or touching a file in it counts as a use. Each entry's size is recorded
beside it (SIZES).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from xdiag.fresh_files import PART_SUFFIX, replace_with

STALE_PART_SECONDS = 3600.0
"""A file in flight (`.<name>...part`) not written to for this long was left by a store that was interrupted (a killed
process): its writer would have renamed it into place within seconds."""
SIZES = ".sizes"
"""Beside the entries, each entry's bytes when it was last walked (`<folder>/.sizes/<entry>`: its bytes and how many
of its files were in flight), so that eviction reads one small file per entry instead of stat'ing every file of every
entry (858 entries of 15,280 files: 84-102 ms a walk, 31-32 ms with the records). A record is trusted while
neither the entry's folder nor a folder directly in it changed after it was written (their mtimes: a file made or
renamed into a folder moves its mtime, and a use touches the entry; the caches here keep their files at most one
folder deep) and, where it counted files in flight, for STALE_PART_SECONDS; otherwise the entry is walked and
recorded again. A change in the same clock tick as the record is counted at the entry's next change."""


def evict_least_recent(folder: Path, limit: int, keep: Path | None = None) -> int:
    """Drops the least recently used entries of `folder` until their files fit `limit` bytes, never `keep` (the one
    just made: its size is recorded afresh), and returns how many files in flight left by interrupted stores it
    removed. Files in flight count towards the limit; those not written to for STALE_PART_SECONDS go first. A file
    another process is reading stays readable (an unlinked file lives while open)."""
    now = time.time()
    records = os.path.join(folder, SIZES)
    try:
        unmatched = set(os.listdir(records))
    except OSError:
        unmatched = set()
    with os.scandir(folder) as listing:
        items = [item for item in listing if item.name != SIZES]
    entries, stale = [], 0
    for item in items:  # paths as strings: Path objects cost as much as the syscalls here
        unmatched.discard(item.name)
        try:
            mtime = item.stat().st_mtime
        except FileNotFoundError:
            continue  # evicted by another process meanwhile
        record = os.path.join(records, item.name)
        size = None if keep is not None and item.path == str(keep) else _recorded_size(record, item, now)
        if size is None:
            size, cleaned = _walk_and_record(item.path, record, now) if item.is_dir() else (0, 0)
            stale += cleaned
        entries.append((mtime, Path(item.path), size))
    for name in unmatched:  # the records of entries gone, and of record writes interrupted
        _unlink(os.path.join(records, name))
    total = sum(size for _, _, size in entries)
    for _, entry, size in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        if entry == keep:
            continue
        for name, f, _ in _files_under(entry):
            if not _in_flight(name):  # its writer renames a file in flight: the folder then stays
                _unlink(f)
        try:
            for sub in sorted((d for d in entry.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                sub.rmdir()
            entry.rmdir()
        except OSError:
            continue  # another process is writing into it
        _unlink(os.path.join(records, entry.name))
        total -= size
    return stale


def _in_flight(name: str) -> bool:
    return name.startswith(".") and name.endswith(PART_SUFFIX)


def _recorded_size(record: str, item: os.DirEntry, now: float) -> int | None:
    """The entry's recorded bytes, where the record is trusted (SIZES); else None."""
    try:
        info = os.stat(record)
        with open(record, "rb") as handle:
            size, in_flight = (int(n) for n in handle.read(64).split())
        if in_flight and now - info.st_mtime > STALE_PART_SECONDS:
            return None  # a file it counted in flight may have been left by an interrupted store: walk again
        changed = item.stat().st_mtime_ns
        with os.scandir(item.path) as inside:
            for d in inside:
                if d.is_dir(follow_symlinks=False):
                    changed = max(changed, d.stat(follow_symlinks=False).st_mtime_ns)
    except (OSError, ValueError):
        return None
    return size if changed <= info.st_mtime_ns else None


def _walk_and_record(entry: str, record: str, now: float) -> tuple[int, int]:
    """The entry's bytes (files in flight included, those left by interrupted stores removed) and how many it removed;
    its record written, where it can be."""
    size = in_flight = cleaned = 0
    for name, f, info in _files_under(entry):
        if _in_flight(name):
            if now - info.st_mtime > STALE_PART_SECONDS:
                _unlink(f)
                cleaned += 1
                continue
            in_flight += 1
        size += info.st_size
    records = os.path.dirname(record)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(records, 0o700)
        if stat.S_ISDIR(os.lstat(records).st_mode):  # a link in its place is not written through
            replace_with(Path(record), f"{size} {in_flight}\n".encode(), mode=0o600)
    except OSError:
        pass  # a cache that cannot be written: the entry is walked again next time
    return size, cleaned


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
