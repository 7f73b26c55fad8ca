"""What every stage is given: the ports, the session loader and the settings (`Dependencies`)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xdiag.errors import ProfileError
from xdiag.investigators import RuleEngine
from xdiag.model import Diagnosis, ToolResult
from xdiag.pipeline.ports import BlobStore, Bus, StateStore
from xdiag.pipeline.runs import CaptureSettings, MonitorSettings
from xdiag.profile.compact import load_session, save_session
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES, read_session
from xdiag.profile.space import Session
from xdiag.tools.common import prefetch_views


class Investigator(Protocol):
    name: str

    def investigate(
        self,
        health: dict[str, Any],
        results: dict[str, ToolResult],
        call_tool: Callable[[str, dict[str, Any], str], ToolResult | None],
    ) -> Diagnosis: ...


PREPARED_SESSION = "session.xdiag"
"""The read-once session, written next to the analysis output by collect when `prepare` is on."""


class SessionLoader:
    """Reads a session once per process and keeps the most recent sessions in memory.

    With `prepare` on (the cloud, where every stage is its own process), the first reader also
    stores the decoded session as one file next to the analysis; later readers memory-map that
    file instead of parsing the profile again (see xdiag.profile.compact). With `prefetch_views`
    on (one process runs every tool), XProf's conversions of a device session start in worker
    processes as soon as it is read, and run while xdiag's own tools do.
    """

    def __init__(self, blobs: BlobStore, max_bytes: int = DEFAULT_MAX_PROFILE_BYTES, keep: int = 2, progress=None,
                 prepare: bool = False, prefetch_views: bool = False):
        self._blobs, self._max_bytes, self._keep, self._progress = blobs, max_bytes, keep, progress
        self._prepare, self._prefetch_views = prepare, prefetch_views
        self._sessions: dict[tuple[str, ...], Session] = {}
        self.read_ms: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()  # concurrent deliveries in one process read a session once

    def load(self, uris: list[str], name: str, prepared_uri: str | None = None) -> Session:
        with self._lock:
            return self._load(uris, name, prepared_uri)

    def close(self) -> None:
        with self._lock:
            for session in self._sessions.values():
                session.close()
            self._sessions.clear()

    def _load(self, uris: list[str], name: str, prepared_uri: str | None) -> Session:
        key = tuple(uris)
        if key not in self._sessions:
            started = time.perf_counter()
            try:
                if prepared_uri and self._prepare and self._blobs.exists(prepared_uri):
                    session = self._load_prepared(uris, prepared_uri)
                else:
                    session = read_session(
                        [self._blobs.local_path(uri) for uri in uris], name=name, max_bytes=self._max_bytes,
                        progress=self._progress,
                    )
                    if prepared_uri and self._prepare:
                        self._store_prepared(session, prepared_uri)
            except FileNotFoundError as exc:
                raise ProfileError(f"profile object missing: {exc}") from None
            while len(self._sessions) >= self._keep:
                self._sessions.pop(next(iter(self._sessions))).close()
            self._sessions[key] = session
            self.read_ms[key] = (time.perf_counter() - started) * 1000
            if self._prefetch_views:
                prefetch_views(session)
        return self._sessions[key]

    def _store_prepared(self, session: Session, prepared_uri: str) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / PREPARED_SESSION
            save_session(session, path)
            self._blobs.put_file(path, prepared_uri)

    def _load_prepared(self, uris: list[str], prepared_uri: str) -> Session:
        session = load_session(Path(self._blobs.local_path(prepared_uri)))
        if session.platform != "CPU":
            # XProf's converters read the xplane files themselves: give them this process's copies.
            by_name = {uri.rsplit("/", 1)[-1]: uri for uri in uris}
            for host in session.hosts:
                if host.path.name in by_name:
                    host.path = Path(self._blobs.local_path(by_name[host.path.name]))
        return session


@dataclass
class Dependencies:
    bus: Bus
    blobs: BlobStore
    state: StateStore
    sessions: SessionLoader
    investigators: dict[str, Callable[[], Investigator]] = field(default_factory=lambda: {"rules": RuleEngine})
    on_event: Callable[[str, dict[str, Any]], None] = lambda stage, info: None  # progress reporting
    profile_root: str = ""  # gs://BUCKET (or a folder): where a manual capture's run/session is looked up
    quiet_period_s: float = 30.0  # register: a session is complete once no file of it arrived for this long
    default_investigator: str = "rules"  # for sessions that register announces
    sleep: Callable[[float], None] = time.sleep
    profiler: Any = None  # the Profiler port (xdiag.pipeline.ports.Profiler): the capture stage calls targets through it
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
