"""The pipeline on one machine: the stages wired to the embedded adapters.

`xdiag analyze` calls `analyze_session`; tests call it too. Nothing here talks to a network.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xdiag.cloud.memory import InProcessBus, LocalBlobStore, MemoryStateStore
from xdiag.errors import OutputError, XdiagError
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


def analysis_folder(parent: Path, located: LocatedSession) -> Path:
    """Where an analysis of `located` goes below `parent` when no folder is named: `parent/<session>`, else
    `<session>-2`, … (`unclaimed_folder`): never a folder holding another profile's analysis (two profiles both
    named run.xplane.pb, or one file captured again), only an earlier analysis of these same files."""
    from xdiag.fresh_files import unclaimed_folder
    from xdiag.profile import confined

    own = analysis_id_for(located.files)

    def holds_the_same(folder: Path) -> bool:
        try:
            return json.loads(confined.read_bytes(folder / "analysis.json")).get("analysis_id") == own
        except (OSError, ValueError, AttributeError, XdiagError):  # none, unreadable, a link out, not one: another's
            return False

    return unclaimed_folder(parent, located.name, holds_the_same)


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
    """Runs every stage over one session; returns the stored analysis (status DONE or FAILED). One analysis at a
    time per output folder: OutputError where another is writing there, or where the folder cannot be made or
    written (read-only, full, below a file)."""
    deps, bus = deps_and_bus or build_embedded()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out_dir}: the output folder cannot be made ({_reason(exc)})") from None
    try:
        with _only_analysis(out_dir):
            return _analyze(located, out_dir, investigator, deps, bus)
    except OSError as exc:
        if isinstance(exc, XdiagError) or exc.errno not in _UNWRITABLE:
            raise
        raise OutputError(f"{out_dir}: the analysis cannot be written there ({_reason(exc)})") from None


_UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}
"""What a write into a read-only, full or quota-bound folder (or one below a file) fails with."""


OUT_LOCK = ".xdiag-analysis.lock"
"""Held (flock) in the output folder while an analysis writes there; gone after it."""


def _reason(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


@contextlib.contextmanager
def _only_analysis(out_dir: Path) -> Iterator[None]:
    """The output folder's lock held while the block runs: OutputError at once where another analysis holds it
    (two analyses into one folder would each print a report the other wrote; issue 62). A lock the kernel drops
    with its process: a killed analysis leaves none held."""
    path = out_dir / OUT_LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{out_dir}: another analysis is writing there now; wait for it to end or "
                                  "choose another output folder") from None
            raise
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break  # the file locked is the one the folder holds (not one the last holder removed meanwhile)
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)


def _remove_earlier_outputs(out_dir: Path, written: set[Path]) -> None:
    """The tool outputs an earlier analysis left in the folder that this one did not write (its follow-up calls):
    the folder is this analysis's as a whole (`xdiag diff` read a follow-up of the earlier profile as this one's)."""
    tools = Path(os.path.abspath(out_dir / "tools"))
    try:
        entries = list(os.scandir(tools))
    except OSError:
        return
    for entry in entries:
        path = tools / entry.name
        if entry.name.endswith(".json") and entry.is_file(follow_symlinks=False) and path not in written:
            with contextlib.suppress(OSError):
                path.unlink()


def _analyze(located: LocatedSession, out_dir: Path, investigator: str, deps: Dependencies,
             bus: InProcessBus) -> Analysis:
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
        if isinstance(deps.blobs, LocalBlobStore):
            _remove_earlier_outputs(out_dir, deps.blobs.written)
    return Analysis.model_validate(deps.state.get(ANALYSES, analysis_id))
