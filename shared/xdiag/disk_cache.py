"""A folder of cache entries bounded on disk: each entry a folder of files, the least recently used dropped first.

Used by the cloud's download cache (`xdiag.cloud.gcs`) and the local result cache (`xdiag.agent.result_cache`). An
entry's recency is its folder's mtime: making or touching a file in it counts as a use.
"""

from __future__ import annotations

import time
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
        for f in entry.rglob("*") if entry.is_dir() else ():
            try:
                info = f.lstat()
            except FileNotFoundError:
                continue
            if not f.is_file():
                continue
            in_flight = f.name.startswith(".") and f.name.endswith(".part")
            if in_flight and now - info.st_mtime > STALE_PART_SECONDS:
                f.unlink(missing_ok=True)
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
            f.unlink(missing_ok=True)
        try:
            for sub in sorted((d for d in entry.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                sub.rmdir()
            entry.rmdir()
        except OSError:
            continue  # another process is writing into it
        total -= size
    return stale
