"""What every stage is given: the ports, the session loader and the settings (`Dependencies`)."""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xdiag.analysis import prepared as prepared_tables
from xdiag.analysis.xprof import XPROF_VIEWS_ENV, start_views
from xdiag.analysis.xprof.session_views import adopt_stored_views, adopt_views, broad_view_calls, prefetch_views
from xdiag.errors import ProfileError
from xdiag.profile import scratch
from xdiag.investigators import HealthSnapshot, RuleEngine
from xdiag.model import Diagnosis, ToolResult
from xdiag.pipeline.layout import PREPARED_DIR, PREPARED_SUFFIX, host_summary_uri, inputs_key, prepared_host_uri
from xdiag.pipeline.ports import BlobInfo, BlobStore, Bus, StateStore
from xdiag.pipeline.runs import CaptureSettings, MonitorSettings
from xdiag.profile.compact import load_session, save_session
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES, assemble_session, read_threads
from xdiag.profile.session import ReadAhead, read_session
from xdiag.profile.space import Session
from xdiag.profile.trace_json import trace_format
from xdiag.sizes import readable_size
from xdiag.tools import host_summary

log = logging.getLogger(__name__)


class Investigator(Protocol):
    name: str

    def investigate(
        self,
        health: HealthSnapshot,
        results: dict[str, ToolResult],
        call_tool: Callable[[str, dict[str, Any], str], ToolResult | None],
    ) -> Diagnosis: ...


def _local_key(paths: list[Path]) -> tuple[str, ...]:
    return tuple(sorted(str(Path(path).resolve()) for path in paths))


def _prepared_uri(key: tuple[BlobInfo, ...], output: str) -> str:
    """The prepared session of exactly these inputs, in the session's output folder."""
    return f"{output.rstrip('/')}/{PREPARED_DIR}/{inputs_key(list(key))}{PREPARED_SUFFIX}"


def _summary_uri(prepared_uri: str) -> str:
    """The session's tables assembled from its hosts' summaries (xdiag.tools.host_summary), beside its prepared file."""
    return prepared_uri.removesuffix(PREPARED_SUFFIX) + host_summary.SUFFIX


def _views_uri(prepared_uri: str) -> str:
    """XProf's views recorded with a prepared session (xdiag.analysis.xprof.stored), beside it."""
    return prepared_uri.removesuffix(PREPARED_SUFFIX) + ".xprof-views.json"


class SessionLoader:
    """Reads a session once per process and keeps the most recent sessions in memory, keyed by the exact inputs
    (every file's URI, generation and size): a replaced file or one more host is another session, never the old one.

    With `prepare` on (the cloud, where every stage is its own process), the first reader (register, during the quiet
    period; else collect) also stores the decoded session as one file, named by the same key, in the session's
    output folder, with the tables every tool builds first (xdiag.analysis.prepared); later readers of the same inputs
    memory-map that file instead of parsing the profile again, and take the tables instead of building them (see
    xdiag.profile.compact). Whoever stores it also records XProf's views of a device session beside it (its
    conversions started before its read), so that the tool instances answer them without converting
    (xdiag.analysis.xprof.stored).
    With `prefetch_views` on (one process runs every tool), XProf's conversions of a device session start in worker
    processes before it is read (the files' plane names tell a device profile), and run while xdiag's own read and
    tools do.
    With `map_hosts_from` set (the cloud), a session of that many host files or more is never decoded in one process:
    the map stage decodes each file in its own invocation (`map_host_file`, one prepared file per file version), and
    the first reader of the session assembles those (`maps_hosts`).
    """

    def __init__(self, blobs: BlobStore, max_bytes: int = DEFAULT_MAX_PROFILE_BYTES, keep: int = 2, progress=None,
                 prepare: bool = False, prefetch_views: bool = False, map_hosts_from: int = 0):
        self._blobs, self._max_bytes, self._keep, self._progress = blobs, max_bytes, keep, progress
        self._prepare, self._prefetch_views = prepare, prefetch_views
        self.map_hosts_from = map_hosts_from if prepare else 0
        self._sessions: dict[tuple[BlobInfo, ...], Session] = {}
        self._started_views: dict[tuple[str, ...], Any] = {}  # local paths -> views a caller started (take_views)
        self._read_ahead: dict[tuple[str, ...], ReadAhead] = {}  # local path -> its read a caller started (take_read)
        self.read_ms: dict[tuple[BlobInfo, ...], float] = {}
        self._lock = threading.Lock()  # concurrent deliveries in one process read a session once
        self._preparing = threading.Lock()

    def load(self, inputs: list[BlobInfo], name: str, output: str | None = None, events: bool = False) -> Session:
        """The session of exactly these file versions; ProfileError where one is gone or was replaced since. A session
        the map stage decoded is the one assembled from its hosts' summaries, without events (what the broad tools
        read), unless `events` is asked for (the follow-ups): then its hosts' columns, mapped."""
        with self._lock:
            return self._load(tuple(sorted(inputs, key=lambda i: i.uri)), name, output, events)

    def close(self) -> None:
        with self._lock:
            for session in self._sessions.values():
                session.close()
            self._sessions.clear()
            for views in self._started_views.values():
                if views is not None:
                    views.close()
            self._started_views.clear()
            for read in self._read_ahead.values():
                read.close()
            self._read_ahead.clear()

    def take_views(self, paths: list[Path], views: Any) -> None:
        """XProf's views of these local files, started by the caller before it built this loader
        (`xdiag.analysis.xprof.start_views`, which `xdiag analyze` calls before its own imports): the load of exactly
        these files adopts them instead of starting its own (None: the caller found none to make, so the load does not
        look again). Closed with the loader if no load takes them."""
        with self._lock:
            previous = self._started_views.pop(_local_key(paths), None)
            if previous is not None:
                previous.close()
            self._started_views[_local_key(paths)] = views

    def take_read(self, read: ReadAhead) -> None:
        """A file's read that the caller began before it built this loader (`xdiag analyze`): the load of exactly that
        file version, under the same session name, takes its session instead of reading the file again; any other
        load reads for itself. Closed with the loader if no load takes it."""
        with self._lock:
            previous = self._read_ahead.pop(_local_key([read.path]), None)
            if previous is not None:
                previous.close()
            self._read_ahead[_local_key([read.path])] = read

    @property
    def max_bytes(self) -> int:
        """The largest session (all its files together) this loader reads."""
        return self._max_bytes

    def maps_hosts(self, inputs: list[BlobInfo]) -> bool:
        """True where the session's host files are decoded one per map invocation, not together by its reader."""
        return bool(self.map_hosts_from) and len(inputs) >= self.map_hosts_from

    def map_host_file(self, info: BlobInfo, output: str) -> tuple[str, int]:
        """The map stage of one host file: decodes exactly this version (an xplane or a PyTorch trace) and stores its
        columns and HLO modules at `prepared_host_uri`; returns (that URI, bytes written). ProfileError where the
        file cannot be read, FileNotFoundError where it was replaced or deleted. Whatever it decoded goes back to the
        system before it returns: one instance maps host after host at the peak of its largest."""
        from xdiag.profile.reader import return_freed_memory_to_the_os

        uri = prepared_host_uri(output, info)
        if self._blobs.exists(uri) and self._blobs.exists(host_summary_uri(output, info)):
            return uri, int(getattr(self._blobs.stat(uri), "size", 0) or 0)
        try:
            with scratch.folder("map") as folder:
                out = folder / "host.xdiag"
                size, _ = host_summary.map_and_summarize(Path(self._blobs.local_path(info.uri, info.generation)), out,
                                                         threads=read_threads(0))
                self._blobs.put_file(host_summary.summary_path(out), host_summary_uri(output, info))
                self._blobs.put_file(out, uri)  # last: its presence says the host is mapped
            return uri, size
        finally:
            gc.collect()
            return_freed_memory_to_the_os()

    def _assemble_mapped(self, key: tuple[BlobInfo, ...], name: str, output: str) -> Session:
        """The session of the map stage's prepared host files, in the session's file order: `read_session`'s, column
        for column, with each host's columns mapped from its file, not held in memory."""
        read = []
        for info in key:
            loaded = load_session(Path(self._blobs.local_path(prepared_host_uri(output, info))))
            host = loaded.hosts[0]
            host.path = Path(host.path.name)  # the map instance's copy: only the name holds here
            read.append((host, loaded.hlo_modules))
        return assemble_session(read, name)

    def prepare(self, inputs: list[BlobInfo], name: str, output: str) -> bool:
        """Reads the session and stores it prepared, keeping nothing in memory: what register does with the quiet
        period's wait, so that collect and the tools only map the prepared file. Only where this loader prepares,
        the session is not stored yet and no other preparation runs in this process (a delivery never queues
        behind another session's read: its own quiet period runs meanwhile). False where it did not; an unreadable
        session is left to collect, which records why."""
        key = tuple(sorted(inputs, key=lambda i: i.uri))
        prepared = _prepared_uri(key, output)
        if not self._prepare or self.maps_hosts(inputs) or not self._preparing.acquire(blocking=False):
            return False  # (a session the map stage decodes host by host is never read whole, here neither)
        early = None
        try:
            if self._blobs.exists(prepared):
                return True
            paths = [self._blobs.local_path(i.uri, i.generation) for i in key]
            early = start_views(paths, self._max_bytes)  # a device session's conversions, while it is read
            session = read_session(paths, name=name, max_bytes=self._max_bytes,
                                   threads=read_threads(early.workers_converting if early is not None else 0))
            try:
                self._store_prepared(session, prepared, early)
            finally:
                session.close()
            return True
        except (ProfileError, FileNotFoundError):
            return False
        finally:
            if early is not None:
                early.close()
            self._preparing.release()

    def _assembled_summary(self, key: tuple[BlobInfo, ...], output: str, summary: str) -> tuple[dict | None, str]:
        """(the session's tables assembled from its hosts' summaries, stored at `summary` where not stored yet, ""),
        or (None, why they cannot be: host_summary.NotSummarized; the session is assembled from its columns)."""
        if self._blobs.exists(summary):
            stored = host_summary.decode(self._blobs.get(summary))
            if stored.get("format") == host_summary.ASSEMBLED_FORMAT:
                return stored, ""
        try:
            assembled = host_summary.assemble(host_summary.decode(self._blobs.get(
                host_summary_uri(output, info))) for info in key)
        except (host_summary.NotSummarized, FileNotFoundError) as exc:
            log.info("the session of %s is assembled from its hosts' columns: %s", summary, exc)
            return None, str(exc)
        self._blobs.put(summary, host_summary.encode(assembled), "application/gzip")
        return assembled, ""

    def _load(self, key: tuple[BlobInfo, ...], name: str, output: str | None, events: bool = False) -> Session:
        mapped = bool(output) and self.maps_hosts(list(key))
        cached = (key, events and mapped)
        if cached not in self._sessions:
            started = time.perf_counter()
            prepared = _prepared_uri(key, output) if output else None
            try:
                assembled, why_not = (self._assembled_summary(key, output, _summary_uri(prepared)) if mapped
                                      else (None, ""))
                if assembled is not None and not events:  # the reduce and the broad tools: no host's columns
                    session = host_summary.summary_session(assembled, name)
                    self._adopt_host_views(session, key, prepared)
                elif assembled is not None:  # the follow-ups: the events of the hosts that matter, mapped, as
                    session = host_summary.summary_session(assembled, name)  # many as fit the session limit
                    self._adopt_host_views(session, key, prepared)
                    for position in host_summary.hosts_within([info.size for info in key],
                                                              host_summary.hosts_that_matter(session), self._max_bytes):
                        loaded = load_session(Path(self._blobs.local_path(prepared_host_uri(output, key[position]))))
                        host_summary.take_events(session, position, loaded)
                elif prepared and self._prepare and self._blobs.exists(prepared):
                    session = self._load_prepared(key, prepared)
                elif prepared and self.maps_hosts(list(key)):  # the reduce, from the hosts' columns
                    total = sum(info.size for info in key)
                    if total > self._max_bytes:
                        raise ProfileError(
                            f"the session's {len(key)} host files are {readable_size(total)} together, over the "
                            f"{readable_size(self._max_bytes)} limit per session (XDIAG_MAX_PROFILE_GIB: what the "
                            f"reduce and each tool instance map where a session's hosts cannot be summarised: "
                            f"{why_not}); capture a shorter window or raise the limit "
                            "with their memory")
                    session = self._assemble_mapped(key, name, output)
                    early = None
                    if session.platform != "CPU":  # XProf's converters read the xplane files themselves
                        by_name = {i.uri.rsplit("/", 1)[-1]: i for i in key}
                        for host in session.hosts:
                            found = by_name[host.path.name]
                            host.path = Path(self._blobs.local_path(found.uri, found.generation))
                        early = start_views(session.paths, self._max_bytes)
                    adopt_views(session, early)
                    self._store_prepared(session, prepared, early)
                else:
                    paths = [self._blobs.local_path(i.uri, i.generation) for i in key]
                    local_key = _local_key(paths)
                    if local_key in self._started_views:  # the caller's, or None where it found none to make
                        early = self._started_views.pop(local_key)
                    elif self._prefetch_views or (prepared and self._prepare):
                        early = start_views(paths, self._max_bytes)  # converting while the session is read
                    else:
                        early = None
                    threads = read_threads(early.workers_converting if early is not None else 0)
                    stored = bool(prepared and self._prepare)  # stored whole, every host's columns, for the tools
                    ahead = self._read_ahead.pop(local_key, None)
                    if ahead is not None and not (len(key) == 1 and ahead.name == name
                                                  and ahead.of(key[0].size, key[0].generation)):
                        ahead.close()  # another version of the file, or another session's name: read afresh
                        ahead = None
                    try:
                        session = ahead.take() if ahead is not None else read_session(
                            paths, name=name, max_bytes=self._max_bytes, progress=self._progress, threads=threads,
                            worker=host_summary.__name__, on_mapped=functools.partial(
                                _adopt_summaries, max_bytes=self._max_bytes, whole=stored),
                            limit_each_host=not stored)
                    except BaseException:
                        if early is not None:
                            early.close()
                        raise
                    if ahead is not None:  # read_ms counts the read's own time, not the wait for its end
                        started = time.perf_counter() - ahead.read_ms / 1000
                    adopt_views(session, early)
                    if len(session.hosts) > 1:
                        _views_within_limits(session, self._max_bytes)
                    if stored:  # register did not (its quiet period ran out first): here, so the tool instances
                        self._store_prepared(session, prepared, session.cache.get("xprof_views"))  # need not convert
            except FileNotFoundError as exc:
                raise ProfileError(f"profile object missing or replaced since the analysis began: {exc}") from None
            while len(self._sessions) >= self._keep:
                self._sessions.pop(next(iter(self._sessions))).close()
            self._sessions[cached] = session
            self.read_ms[key] = (time.perf_counter() - started) * 1000
            if self._prefetch_views:
                prefetch_views(session)
        return self._sessions[cached]

    def _adopt_host_views(self, session: Session, key: tuple[BlobInfo, ...], prepared: str) -> None:
        """XProf's views of a device session assembled from its hosts' summaries: of every host where the files fit
        the session limit and XProf's memory here together, else of the hosts that matter that fit, each view naming
        the hosts it covers (xdiag.analysis.xprof.host_subset). Recorded once beside the session (by the reduce, the
        first to load it), answered from the record by each tool instance, which fetches the files only for a view
        not recorded."""
        from xdiag.analysis.xprof import XprofViews
        from xdiag.analysis.xprof.host_subset import HostSubsetViews, NoHostViews
        from xdiag.analysis.xprof.stored import StoredViews

        if session.platform == "CPU" or os.environ.get(XPROF_VIEWS_ENV, "1") == "0":
            return
        chosen, limit = _hosts_for_views(session, [info.size for info in key], self._max_bytes)
        if not chosen:
            session.cache["xprof_views"] = NoHostViews(
                f"XProf's views read the xplane files, and each host that matters is over the "
                f"{readable_size(limit)} they may read here on its own (the session limit, XDIAG_MAX_PROFILE_GIB, or "
                "what XProf's conversions may take of this instance's memory, XDIAG_XPROF_MEMORY_GIB)")
            return

        def local_files() -> list[Path]:  # XProf's converters read the chosen hosts' xplane files: our copies
            for position in chosen:
                info = key[position]
                session.hosts[position].path = Path(self._blobs.local_path(info.uri, info.generation))
            return [session.hosts[position].path for position in chosen]

        def covering(views: Any) -> Any:
            if len(chosen) == len(key):
                return views
            return HostSubsetViews(views, [session.hosts[k].hostname for k in chosen], len(key))

        views_uri = _views_uri(prepared)
        stored = self._recorded_views(views_uri)
        if stored is not None:
            session.cache["xprof_views"] = covering(StoredViews(stored, local_files))
            return
        session.cache["xprof_views"] = covering(XprofViews(local_files()))
        self._store_views(session, session.cache["xprof_views"], views_uri)

    def _store_prepared(self, session: Session, prepared_uri: str, views: Any = None) -> None:
        """The decoded session with its shared tables, and first the record of `views` (XProf's views of a device
        session, or None), so that whoever finds the prepared file finds the record with it."""
        if views is not None:
            self._store_views(session, views, _views_uri(prepared_uri))
        try:  # the tables every tool builds first, built once here (xdiag.analysis.prepared)
            tables = prepared_tables.export(session)
        except Exception:  # noqa: BLE001 - each tool then builds them and records what fails, as without them
            log.warning("the prepared session %s goes without its shared tables", prepared_uri, exc_info=True)
            tables = None
        with scratch.folder("session") as folder:
            path = folder / "session.xdiag"
            save_session(session, path, tables)
            self._blobs.put_file(path, prepared_uri, cache_source=True)  # a temporary file, ours alone

    def _store_views(self, session: Session, views: Any, views_uri: str) -> None:
        """XProf's views the broad tools ask for, recorded beside the prepared session. Best effort: without the
        record each tool instance converts for itself, as before."""
        from xdiag.analysis.xprof.stored import record
        from xdiag.tools.get_peak_allocations import busiest_module

        try:
            busiest = busiest_module(session)
            recorded = record(views, broad_view_calls(busiest.display_name if busiest is not None else None))
            self._blobs.put(views_uri, json.dumps(recorded).encode(), "application/json")
        except Exception:  # noqa: BLE001 - an optimisation: the tools still convert what they need
            log.warning("XProf's views of %s are not recorded", views_uri, exc_info=True)

    def _load_prepared(self, key: tuple[BlobInfo, ...], prepared_uri: str) -> Session:
        session = load_session(Path(self._blobs.local_path(prepared_uri)))
        prepared_tables.adopt(session)
        if session.platform == "CPU":
            return session
        by_name = {i.uri.rsplit("/", 1)[-1]: i for i in key}

        def local_files() -> list[Path]:  # XProf's converters read the xplane files themselves: this process's copies
            for host in session.hosts:
                if host.path.name in by_name:
                    found = by_name[host.path.name]
                    host.path = Path(self._blobs.local_path(found.uri, found.generation))
            return session.paths

        stored = self._recorded_views(_views_uri(prepared_uri))
        if stored is None:
            local_files()
        else:  # the files are fetched only for a view the record does not hold
            adopt_stored_views(session, stored, local_files)
        return session

    def _recorded_views(self, views_uri: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._blobs.get(views_uri))
        except FileNotFoundError:
            return None
        except ValueError:  # not JSON: the tools convert, as without a record
            log.warning("XProf's views recorded at %s cannot be read; the tools convert", views_uri)
            return None


def _hosts_for_views(session: Session, sizes: list[int], max_bytes: int) -> tuple[list[int], int]:
    """(the positions of the hosts XProf's views of a many-host session read in this process, the bytes they may
    read): every host where their files fit together under the session limit and what XProf's conversions may take
    of this process's memory (xdiag.analysis.xprof.memory_budget), else the hosts that matter that fit; possibly
    none."""
    from xdiag.analysis.xprof import memory_budget

    in_memory = memory_budget.largest_profile_bytes()
    limit = max_bytes if in_memory is None else min(max_bytes, in_memory)
    return host_summary.hosts_within(sizes, host_summary.hosts_that_matter(session), limit), limit


def _views_within_limits(session: Session, max_bytes: int) -> None:
    """XProf's views of a many-host device session read in this process whose files together are over the session
    limit or more than XProf's conversions may take of its memory (xdiag.analysis.xprof.memory_budget): those of the
    hosts that matter that fit both, each view naming them (host_subset), instead of none. Where not even one fits,
    the views say why, as before."""
    from xdiag.analysis.xprof.host_subset import HostSubsetViews
    from xdiag.analysis.xprof.views import XprofViews

    if session.platform == "CPU" or os.environ.get(XPROF_VIEWS_ENV, "1") == "0" or trace_format(session):
        return
    chosen, _ = _hosts_for_views(session, [host.size_bytes for host in session.hosts], max_bytes)
    if not chosen or len(chosen) == len(session.hosts):
        return
    started = session.cache.pop("xprof_views", None)
    if started is not None:
        started.close()
    subset = XprofViews([session.hosts[k].path for k in chosen])
    session.cache["xprof_views"] = HostSubsetViews(subset, [session.hosts[k].hostname for k in chosen],
                                                   len(session.hosts))
    log.info("session %s: XProf's views of %d of its %d hosts, those that matter within the session limit and "
             "XProf's memory here", session.name, len(chosen), len(session.hosts))


def _adopt_summaries(session: Session, prepared: list[Path], max_bytes: int, whole: bool) -> None:
    """A session read host by host takes the tables assembled from its hosts' summaries (host_summary.adopt_mapped).
    Where it cannot, its tools read every host's columns: ProfileError where its files together are over `max_bytes`
    (checked here unless the read checked it already: `whole`)."""
    why_not = host_summary.adopt_mapped(session, prepared)
    if not why_not:
        return
    log.info("session %s: its tools build their tables from its columns (%s)", session.name, why_not)
    if not whole and session.size_bytes > max_bytes:
        raise ProfileError(
            f"the session's {len(session.hosts)} host files are {readable_size(session.size_bytes)} together, over "
            f"the {readable_size(max_bytes)} limit per session that binds where its hosts cannot be summarised "
            f"({why_not}); analyse fewer hosts, capture a shorter window or raise --max-profile-gib")


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
    multi_host_quiet_period_s: float = 120.0  # …this long where the run has several hosts and not all are in yet
    stage_deadline_s: float = 900.0  # an analysis with no progress for this long is repaired by the sweeper
    max_repairs: int = 3  # repairs before the sweeper fails the analysis with the reason
    investigation_deadline_s: float = 300.0  # the whole investigation, follow-up tool calls included
    max_hosts: int = 256  # host files one session may have (beyond: FAILED with the reason)
    max_host_file_bytes: int = 2 * 2**30  # the largest host file the map stage decodes in one invocation
    default_investigator: str = "rules"  # for sessions that register announces
    sleep: Callable[[float], None] = time.sleep
    profiler: Any = None  # the Profiler port (xdiag.pipeline.ports.Profiler): the capture stage calls targets through it
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
