"""The processes XProf's converters run in (`Conversions.prefetch`, conversions.py): how many, how they start, what
they run.

Apart from the conversions so that the forkserver the workers fork from imports XProf's client, this module and
`forkserver_setup` alone, not numpy and xdiag's views (~0.2 s less), and so that starting it (`start_server`)
imports nothing heavy either: the first worker's op_stats conversion is what the first view waits for. Nothing here
may import more than the standard library and, in the workers, XProf's client.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import re
import sys
import tempfile
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

CONCURRENCY_ENV = "XDIAG_XPROF_PROCESSES"
"""How many processes `Conversions.prefetch` may run XProf's converters in at once (default: the
CPUs this process may use, for sessions of PREFETCH_MIN_BYTES or more, else 0); 0 turns prefetching
off, so every conversion runs in-process on demand. Where groups outnumber workers, a worker converts
them in turn and reuses the memory the last one freed. One worker fewer than the CPUs (leaving one to
xdiag's own analysis) was measured on the 85 MiB H200 bench profile on 2 cores: ~2 s less CPU (one
worker converting op_stats then memory_profile instead of two each faulting in ~1.6 GB of fresh
memory at once) but no faster: 7.5-8.3 s against 7.4-7.8 s whole (medians of 4, three sittings).
glibc's malloc on transparent huge pages in the workers (GLIBC_TUNABLES glibc.malloc.hugetlb=1) cut
each conversion's system time alone, but with two workers faulting at once it cost 9.6 against 7.4 s
whole, so the workers run with the environment they inherit."""

PREFETCH_MIN_BYTES = 16 * 2**20
"""Sessions smaller than this (all files together) convert in-process unless `XDIAG_XPROF_PROCESSES`
says otherwise: worker processes cost CPU to start (the forkserver's Python start-up and imports, each worker's
fork), about what such a profile's conversions take (about 0.1 s of CPU per MiB). On the 6.4 MiB H200
recompilation profile, 2 cores: 1.28 s whole with workers against 1.32 s in-process, for 1.85 against 1.45 s of
CPU (medians of 5); the 0.8-6.4 MiB real device profiles were 15-60% faster in-process before the forkserver got
lighter. The 85 MiB one gains from the workers."""

LATER_GROUPS_NICENESS = 10
"""How much lower the priority of workers converting the groups after the first (memory_profile, smart_suggestion,
utilization_viewer) is. The views wait for the first group (op_stats: the overview, the first tool) long before
they ask for the others, so where busy processes outnumber the cores the first worker gets the CPU."""


def processes_allowed(session_bytes: int) -> int:
    configured = os.environ.get(CONCURRENCY_ENV, "").strip()
    if configured:
        try:
            return max(0, int(configured))
        except ValueError:
            log.warning("%s=%r is not a number; using the CPU count", CONCURRENCY_ENV, configured)
    if session_bytes < PREFETCH_MIN_BYTES:
        return 0
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def context() -> multiprocessing.context.BaseContext:
    """A forkserver that has imported XProf's client and this module once; each worker is a cheap fork of it
    (forking the caller instead would copy its threads' locks). It also imports `forkserver_setup`, so that the
    workers never run the caller's main script again."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(
        ["xprof.cli.internal.oss.xprof_client", __name__, "xdiag.analysis.xprof.forkserver_setup"]
    )
    return forkserver


def start_server(session_bytes: int) -> None:
    """Starts the forkserver now where `prefetch` would use workers for a session this large (a Python start-up and
    XProf's client import, ~0.15 s, on a core the caller's own start-up leaves free) instead of at the first
    submit, after the private copy is written. Does nothing where prefetching is off; where the forkserver cannot
    start, prefetch meets the same error and the views convert in-process."""
    if processes_allowed(session_bytes) == 0:
        return
    try:
        ensure_server()
    except Exception as error:
        log.debug("no forkserver for XProf's workers: %s", error)


ALLOCATOR_ENV = "XDIAG_XPROF_ALLOCATOR"
"""The malloc XProf's workers run with: `mimalloc` (the default; the library of the pinned cmeel-mimalloc wheel),
`system` (glibc's), or the path of another malloc library to preload. XProf's converters build the whole XSpace as
C++ protobuf objects, ~15x the file's size, and spent a sixth of their samples in glibc's malloc and free (perf, the
85 MiB H200 bench profile); with mimalloc its op_stats and memory_profile conversions each take 13% less CPU, alone
(medians of 6; bench/README.md, "Measured design choices"). Transparent huge pages stay off for it
(MIMALLOC_ALLOW_THP=0): on
the 2-core VMs here, faulting them in cost more system time than the page faults they save (op_stats 1.6 s of system
time against 0.3 s). A caller's own LD_PRELOAD is left as it is."""

_MIMALLOC_DIST = "cmeel-mimalloc"
_PRELOAD_ENV = "LD_PRELOAD"
_MIMALLOC_THP_ENV = "MIMALLOC_ALLOW_THP"
_SERVER_LOCK = threading.Lock()


def allocator_library(choice: str | None = None) -> str | None:
    """The shared library XProf's workers preload as their malloc (`ALLOCATOR_ENV`), or None for the system's:
    also where the choice names a file that is not there or the mimalloc wheel is not installed (a platform it
    has no wheel for)."""
    choice = (os.environ.get(ALLOCATOR_ENV, "") if choice is None else choice).strip() or "mimalloc"
    if choice == "system" or sys.platform != "linux":
        return None
    if choice != "mimalloc":
        return choice if os.path.isfile(choice) else None
    import importlib.metadata  # here, not at the top: the forkserver imports this module and never needs it

    try:
        dist = importlib.metadata.distribution(_MIMALLOC_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if re.fullmatch(r"libmimalloc\.so\.\d+", file.name):
            path = str(dist.locate_file(file))
            if os.path.isfile(path):
                return path
    return None


def allocator_environment(environment: dict[str, str] | None = None) -> dict[str, str]:
    """What a process that runs XProf's converters adds to `environment` (this process's by default) to start with
    `allocator_library` as its malloc: LD_PRELOAD and mimalloc's option, none where the environment preloads a
    library of its own or the system's malloc is chosen."""
    environment = os.environ if environment is None else environment
    library = None if environment.get(_PRELOAD_ENV) else allocator_library()
    if library is None:
        return {}
    added = {_PRELOAD_ENV: library}
    if environment.get(_MIMALLOC_THP_ENV) is None:
        added[_MIMALLOC_THP_ENV] = "0"
    return added


def ensure_server() -> None:
    """Starts the forkserver, if it is not running, with `allocator_library` preloaded. The loader reads LD_PRELOAD
    only when a program starts, so it is set in this process's environment just while the forkserver is spawned
    (under a lock; a process another thread spawns in that instant would get the allocator too, which changes
    nothing but its speed). The workers are forks of the forkserver and inherit it."""
    context()
    with _SERVER_LOCK:
        added = allocator_environment()
        if not added:
            multiprocessing.forkserver.ensure_running()
            return
        os.environ[_PRELOAD_ENV] = added[_PRELOAD_ENV]
        if _MIMALLOC_THP_ENV in added:
            os.environ[_MIMALLOC_THP_ENV] = added[_MIMALLOC_THP_ENV]
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            del os.environ[_PRELOAD_ENV]  # there was none: allocator_environment adds one only then
            if _MIMALLOC_THP_ENV in added:
                del os.environ[_MIMALLOC_THP_ENV]


def mapped_allocator() -> str | None:
    """The malloc library mapped into this process other than glibc's (run in a worker, it tells what the workers
    use), from /proc/self/maps; None for glibc's or where /proc is not there."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip().rpartition(" ")[2]
                if re.search(r"lib(mimalloc|jemalloc|tcmalloc)[^/]*\.so", path):
                    return path
    except OSError:
        pass
    return None


def flush_stderr() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()


def picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def convert(
    run_dir: str, conversions: list[tuple[str, dict[str, Any]]], niceness: int = 0
) -> list[tuple[Any, str, float]]:
    """Each conversion as the router's local client runs it in-process, with fd 2 captured per conversion; returns
    (outcome or exception, stderr text, CPU seconds) for each. `niceness` first lowers this process's priority, for
    the rest of its life (an unprivileged process cannot raise it again): prefetch submits the group the views wait
    for first, and at 0, so a lowered worker only ever takes groups submitted after it."""
    from xprof.cli.internal.oss import xprof_client  # preloaded by the forkserver

    if niceness:
        with contextlib.suppress(OSError):
            os.nice(niceness)
    client = xprof_client.LocalXprofClient()
    results: list[tuple[Any, str, float]] = []
    for tool_name, params in conversions:
        cpu_started = time.process_time()
        with tempfile.TemporaryFile() as scratch:
            flush_stderr()
            saved = os.dup(2)
            os.dup2(scratch.fileno(), 2)
            try:
                outcome: Any = client.fetch(tool_name, run_dir, **params)
            except Exception as error:
                outcome = picklable(error)
            finally:
                flush_stderr()
                os.dup2(saved, 2)
                os.close(saved)
            scratch.seek(0)
            text = scratch.read().decode("utf-8", errors="replace")
        results.append((outcome, text, time.process_time() - cpu_started))
    return results
