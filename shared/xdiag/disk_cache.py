"""A folder of cache entries bounded on disk: each entry a folder of files, the least recently used dropped first.

Used by the cloud's download cache (`xdiag.cloud.gcs`) and the local result cache (`xdiag.agent.result_cache`). An
entry's recency is its folder's mtime: making or touching a file in it counts as a use.
"""

from __future__ import annotations

from pathlib import Path


def evict_least_recent(folder: Path, limit: int, keep: Path | None = None) -> None:
    """Drops the least recently used entries of `folder` until their files fit `limit` bytes, never `keep` (the one
    just made). A file another process is reading stays readable (an unlinked file lives while open)."""
    entries = []
    for entry in folder.iterdir():
        # never a file in flight (".<name>.<pid>.<thread>.part"): its writer renames it into place
        files = [f for f in entry.rglob("*") if f.is_file() and not f.name.startswith(".")] if entry.is_dir() else []
        entries.append((entry.stat().st_mtime, entry, sum(f.stat().st_size for f in files), files))
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
