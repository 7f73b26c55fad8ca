"""Which sessions `xdiag view` shows, and how XProf reaches each: the embedded default's local store, and the
bucket of the local stack (mirrored read-only: XProf cannot read the emulator) or of a cloud deployment (XProf reads
gs:// itself where it is the only source)."""

from __future__ import annotations

import fcntl
from dataclasses import dataclass, field
from pathlib import Path

from xdiag.viewer.tree import (
    Found, ViewSession, bucket_sessions, build_view_tree, local_store_sessions, split_traces, trace_note,
)

CACHE_BYTES = 64 * 2**30  # the mirror of the bucket's sessions; least recently used downloads go past it


@dataclass
class ViewPlan:
    logdir: str  # what XProf's --logdir gets: the view tree, or gs://BUCKET
    sessions: list[ViewSession] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    traces: list[ViewSession] = field(default_factory=list)  # sessions of PyTorch traces alone: not XProf's to open


@dataclass
class BucketSource:
    """A profile bucket: `root` gs://BUCKET, its BlobStore, whether it is the emulator, the kinds the state knows."""

    root: str
    blobs: object
    emulator: bool
    kind_of: object = None  # (run path, session) -> kind | None
    baseline_of: object = None  # (run path, session) -> the baseline its analysis was compared with | None


def plan_view(view_dir: Path, store: Path | None, bucket: BucketSource | None, runs: list[str]) -> ViewPlan:
    """Builds the view tree (or picks gs:// directly) for the sessions of `runs` (all when empty)."""
    in_store = local_store_sessions(store) if store else Found()
    local, traces = split_traces([s for s in in_store.sessions if not runs or s.run in runs])
    notes = []
    if store:
        notes.append(f"local store {store}: {len(local)} analysed session(s), linked where they are")
        notes += _skipped_notes(in_store.skipped, f"local store {store}")
    remote: list[ViewSession] = []
    if bucket is not None:
        in_bucket = bucket_sessions(bucket.blobs, bucket.root, bucket.kind_of, runs, bucket.baseline_of)
        remote, remote_traces = split_traces(in_bucket.sessions)
        traces += remote_traces
        notes += _skipped_notes(in_bucket.skipped, bucket.root)
        if not bucket.emulator and not local:
            notes.append(f"{bucket.root}: {len(remote)} session(s); XProf reads the bucket itself")
            return ViewPlan(logdir=bucket.root, sessions=remote, notes=notes + [trace_note(s) for s in traces],
                            traces=traces)
        why = ("XProf cannot read the Cloud Storage emulator's bucket (it opens sessions through google-cloud-storage "
               "with Application Default Credentials, which the emulator setup has none of)" if bucket.emulator
               else "one folder holds them beside the local store's")
        notes.append(f"{bucket.root}: {len(remote)} session(s) mirrored read-only into {view_dir / 'cache'} "
                     f"(downloaded once per object version): {why}")
    tree = view_dir / "tree"
    tree.mkdir(parents=True, exist_ok=True)
    with open(view_dir / "tree.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another `xdiag view` of this folder may be relinking the same sessions
        sessions = build_view_tree(tree, local, local_copy=lambda f: Path(f))
        if remote:
            sessions += build_view_tree(tree, remote, local_copy=bucket.blobs.local_path)
    return ViewPlan(logdir=str(tree), sessions=sessions, notes=notes + [trace_note(s) for s in traces], traces=traces)


def _skipped_notes(skipped: list[str], where: str, shown: int = 5) -> list[str]:
    if not skipped:
        return []
    more = f" (and {len(skipped) - shown} more)" if len(skipped) > shown else ""
    return [f"{where}: skipped {len(skipped)} object(s) whose names are not xdiag ids{more}:"] + \
        [f"  {line}" for line in skipped[:shown]]
