"""The pipeline on one machine: the stages wired to the embedded adapters.

`xdiag analyze` calls `analyze_session`; tests call it too. Nothing here talks to a network.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdiag.cloud.memory import InProcessBus, LocalBlobStore, MemoryStateStore
from xdiag.handlers import HANDLERS
from xdiag.model import Analysis, CaptureReady
from xdiag.pipeline.deps import Dependencies, SessionLoader
from xdiag.pipeline.topics import ANALYSES, TOPIC_CAPTURES
from xdiag.profile.locate import LocatedSession
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES


def analysis_id_for(files: list[Path]) -> str:
    """Stable per session contents' identity (paths, sizes, mtimes): re-analysing the same files gives the same id."""
    digest = hashlib.sha256()
    for f in sorted(files):
        stat = f.stat()
        digest.update(f"{f.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def build_embedded(
    max_bytes: int = DEFAULT_MAX_PROFILE_BYTES,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    read_progress=None,
    investigators: dict[str, Callable] | None = None,
    started_views: tuple[list[Path], Any] | None = None,
) -> tuple[Dependencies, InProcessBus]:
    """`started_views`: (files, XProf's views of them) that the caller started early (`SessionLoader.take_views`)."""
    bus = InProcessBus()
    blobs = LocalBlobStore()
    deps = Dependencies(
        bus=bus,
        blobs=blobs,
        state=MemoryStateStore(),
        sessions=SessionLoader(blobs, max_bytes=max_bytes, progress=read_progress, prefetch_views=True),
    )
    if started_views:
        deps.sessions.take_views(*started_views)
    if investigators:
        deps.investigators.update(investigators)
    if on_event:
        deps.on_event = on_event
    for topic, (message_type, handler) in HANDLERS.items():
        bus.subscribe(topic, lambda message, handler=handler: handler(message, deps))
    return deps, bus


def analyze_session(
    located: LocatedSession,
    out_dir: Path,
    investigator: str = "rules",
    deps_and_bus: tuple[Dependencies, InProcessBus] | None = None,
) -> Analysis:
    """Runs every stage over one session; returns the stored analysis (status DONE or FAILED)."""
    deps, bus = deps_and_bus or build_embedded()
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(deps.blobs, LocalBlobStore):
        deps.blobs.confined_to = out_dir.resolve()  # the outputs go under --out, whatever links its folders hold
    analysis_id = analysis_id_for(located.files)
    bus.publish(
        TOPIC_CAPTURES,
        CaptureReady(
            analysis_id=analysis_id,
            run_id=located.run,
            session_id=located.name,
            profile_uris=[str(f.resolve()) for f in located.files],
            output_uri=str(out_dir.resolve()),
            investigator=investigator,
        ),
    )
    try:
        bus.drain()
    finally:
        deps.sessions.close()  # XProf's private copies of the files go with the session
    return Analysis.model_validate(deps.state.get(ANALYSES, analysis_id))
