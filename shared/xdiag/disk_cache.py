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
"""Beside the entries, each entry's bytes when it was last walked (`<folder>/.sizes/<entry>`: its bytes, how many of
its files were in flight, and the entry's version: the latest mtime of its folder and the folders directly in it,
read before the walk), so that eviction reads one small file per entry instead of stat'ing every file of every entry
(858 entries of 15,280 files: 49-54 ms a walk, 17-21 ms with the records). A file made or renamed into a folder
moves that folder's mtime, and a use touches the entry (the caches here keep their files at most one folder deep):
a record is trusted while the entry's version is the one it names and, where it counted files in flight, until
STALE_PART_SECONDS after that version. An entry changed within SETTLE_SECONDS of its walk is not recorded (a change in the same
tick of the file system's clock would not move the version): it is walked again next time."""
SETTLE_SECONDS = 2.0
"""Longer than a tick of any file system's timestamps the caches live on (ext4 and tmpfs: a jiffy; some: 1 s)."""


def evict_least_recent(folder: Path, limit: int, keep: Path | None = None) -> int:
    """Drops the least recently used entries of `folder` until their files fit `limit` bytes, never `keep` (the one
    just made: walked afresh), and returns how many files in flight left by interrupted stores it
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
        size = None if keep is not None and item.path == str(keep) else _recorded_size(record, item.path, now)
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


def _version(entry: str) -> int:
    """The latest mtime (ns) of the entry's folder and the folders directly in it."""
    version = os.stat(entry).st_mtime_ns
    with os.scandir(entry) as inside:
        for item in inside:
            if item.is_dir(follow_symlinks=False):
                version = max(version, item.stat(follow_symlinks=False).st_mtime_ns)
    return version


def _recorded_size(record: str, entry: str, now: float) -> int | None:
    """The entry's recorded bytes, where the record is trusted (SIZES); else None."""
    try:
        with open(record, "rb") as handle:
            size, in_flight, version = (int(n) for n in handle.read(96).split())
        if version != _version(entry):
            return None
    except (OSError, ValueError):
        return None
    if in_flight and now - version / 1e9 > STALE_PART_SECONDS:
        return None  # a file it counted in flight may have been left by an interrupted store: walk again
    return size


def _walk_and_record(entry: str, record: str, now: float) -> tuple[int, int]:
    """The entry's bytes (files in flight included, those left by interrupted stores removed) and how many it removed;
    its record written where the entry has settled (SETTLE_SECONDS) and the cache can be written."""
    try:
        version = _version(entry)
    except OSError:
        version = None  # gone, or not a folder
    size = in_flight = cleaned = 0
    for name, f, info in _files_under(entry):
        if _in_flight(name):
            if now - info.st_mtime > STALE_PART_SECONDS:
                _unlink(f)
                cleaned += 1
                continue
            in_flight += 1
        size += info.st_size
    if cleaned:
        version = None  # the walk changed it
    records = os.path.dirname(record)
    try:
        if version is None or now - version / 1e9 < SETTLE_SECONDS:
            _unlink(record)
        else:
            with contextlib.suppress(FileExistsError):
                os.mkdir(records, 0o700)
            if stat.S_ISDIR(os.lstat(records).st_mode):  # a link in its place is not written through
                replace_with(Path(record), f"{size} {in_flight} {version}\n".encode(), mode=0o600)
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
