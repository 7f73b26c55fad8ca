"""Reading a session: its host files in this process (xdiag.profile.reader), or host by host in worker processes,
each host mapped (xdiag.profile.hosts_map). The one entry point that chooses, above both, so neither imports the
other's caller."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from xdiag.profile.hosts_map import read_session_by_host
from xdiag.profile.reader import DEFAULT_MAX_PROFILE_BYTES, READ_THREADS, Progress, read_session_in_process
from xdiag.profile.space import Session

BY_HOST_ENV = "XDIAG_READ_BY_HOST"
"""`0`: a session of several hosts is read in this process, every host at once, as before the host-by-host read
(the bench compares the two)."""


def read_session(
    paths: list[Path],
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_PROFILE_BYTES,
    progress: Progress | None = None,
    threads: int = READ_THREADS,
    by_host: bool | None = None,
    **map_options,
) -> Session:
    """Reads every host file of one capture into a Session, decoding up to `threads` lines at once (1 where other
    processes need the cores more: XProf's conversions that the analysis waits for). A session of several hosts is
    read host by host, each in its own worker process, and mapped (xdiag.profile.hosts_map): its memory is not the sum
    of its hosts'. `map_options` go to that read (`hosts_map.read_session_by_host`: worker, on_mapped)."""
    if by_host is None:
        by_host = os.environ.get(BY_HOST_ENV, "1") != "0"
    if len(paths) >= 2 and by_host:
        return read_session_by_host(paths, name=name, max_bytes=max_bytes, progress=progress, workers=threads,
                                    **map_options)
    return read_session_in_process(paths, name=name, max_bytes=max_bytes, progress=progress, threads=threads)


class ReadAhead:
    """One file's session read in a thread of its own from the moment the caller knows the file (`xdiag analyze`,
    before it imports the pipeline, the tools and the report): the compiled decoder and numpy's sorts release the
    GIL, so on a second core the read goes on under those imports (19.3 MiB CPU capture: the read and those imports
    take 320-360 ms one after the other, 260 ms side by side). The loader of exactly this file version takes the session
    (`SessionLoader.take_read`); a read that failed raises its error there, as the loader's own read would have."""

    def __init__(self, path: Path, name: str, max_bytes: int = DEFAULT_MAX_PROFILE_BYTES,
                 progress: Progress | None = None, threads: int = READ_THREADS) -> None:
        self.path, self.name = Path(path), name
        self.version = _version(self.path)  # (size, mtime in ns) when the read began
        self.read_ms = 0.0
        self._session: Session | None = None
        self._error: BaseException | None = None
        self._taken = self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(max_bytes, progress, threads), daemon=True,
                                        name="xdiag-read-ahead")
        self._thread.start()

    def _read(self, max_bytes: int, progress: Progress | None, threads: int) -> None:
        started = time.perf_counter()
        session = None
        try:
            session = read_session_in_process([self.path], name=self.name, max_bytes=max_bytes, progress=progress,
                                              threads=threads)
        except BaseException as exc:  # noqa: BLE001 - handed to the taker, who raises it where its own read would
            self._error = exc
        self.read_ms = (time.perf_counter() - started) * 1000
        with self._lock:
            if self._closed and session is not None:
                session.close()
            else:
                self._session = session

    def of(self, size: int, generation: str) -> bool:
        """Whether this read is of the file version the loader was asked for (a local file's generation is its mtime
        in ns) and the file stayed that version while it was read."""
        self._thread.join()
        return self.version == (size, generation) == _version(self.path)

    def take(self) -> Session:
        """The session, once the read is done; the read's error where it failed."""
        self._thread.join()
        with self._lock:
            if self._closed and not self._taken:
                raise RuntimeError(f"the read of {self.path.name} was closed: nothing to take")
            self._taken = True
            if self._error is not None:
                raise self._error
            assert self._session is not None
            return self._session

    def close(self) -> None:
        """Releases the session where nobody took it. A read still going on is not waited for (an analysis that
        cannot write its outputs says so at once): it releases its session when it ends, or ends with the process;
        it holds memory only, the in-process read writing no file."""
        with self._lock:
            self._closed = True
            if not self._taken and self._session is not None:
                self._session.close()
                self._session = None


def _version(path: Path) -> tuple[int, str] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_size, str(info.st_mtime_ns)
