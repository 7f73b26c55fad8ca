"""Reading a session: its host files in this process (xdiag.profile.reader), or host by host in worker processes,
each host mapped (xdiag.profile.hosts_map). The one entry point that chooses, above both, so neither imports the
other's caller."""

from __future__ import annotations

import os
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
