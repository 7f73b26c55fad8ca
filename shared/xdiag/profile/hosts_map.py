"""A many-host session read host by host: each host's file decoded by a worker process, its columns written to a
file of its own and mapped back, so that the analysing process never holds every host's columns at once.

Read in one process (`session.read_session(..., by_host=False)`), a session's memory is the sum of its hosts' decoded
columns: `xdiag analyze` of 24 hosts of a 20 MiB CPU capture peaked at 589 MiB against 130 MiB for one host. Here each
host is the map's unit: `workers` worker processes (a fresh interpreter each, one per core at most) take the hosts one
after another, decode each exactly as `read_host` does, write its columns and HLO modules to a prepared file
(`compact.save_session`) and hand its memory back before the next, so a worker's peak is its largest host. The
analysing process maps those files: a column costs it memory only while an analysis reads it, and the passes over
every host's columns (the op table, host-event queries, the profile's bounds, the tools that scan lines) hand each
host's pages back when they move on to the next (`HostProfile.release_pages`, `Session.host_by_host`). What it holds
of its own is what the analyses derive: the op table, the steps, the per-step rows. The same analysis peaked at
126 MiB (bench/README.md, "Many-host sessions"). The session is `read_session`'s, column for column (origin, host names,
HLO modules), so every tool answers the same (tests/test_hosts_map.py).
"""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from xdiag.errors import ProfileError
from xdiag.profile import scratch
from xdiag.profile.compact import load_session, save_session
from xdiag.profile.reader import (
    DEFAULT_MAX_PROFILE_BYTES,
    Progress,
    assemble_session,
    read_host,
    return_freed_memory_to_the_os,
    session_bytes,
)
from xdiag.profile.locate import is_trace_file
from xdiag.profile.read_bounds import READ_SECONDS, READ_SECONDS_PER_MIB
from xdiag.profile.space import HloModule, HostProfile, Session
from xdiag.profile.trace_json import read_trace_host
from xdiag.sizes import readable_size

_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKER_START_SECONDS = 60.0
"""A worker's own time beside its read's bound (xdiag.profile.read_bounds): a fresh interpreter's imports, and the
host's columns written (a second or two); past both, the worker is killed and the host's read fails."""


def host_seconds(size: int) -> float:
    """How long a worker may take over one host file of `size` bytes before it is killed."""
    return WORKER_START_SECONDS + READ_SECONDS + READ_SECONDS_PER_MIB * size / 2**20


def map_workers(hosts: int, limit: int | None = None) -> int:
    """Hosts decoded at once: one per core (or `limit`), no more than the hosts (each worker holds one decoded host)."""
    return max(1, min(_CPUS, hosts, limit or _CPUS))


def map_host(path: Path, out: Path, threads: int = 1) -> tuple[str, int]:
    """The map stage of one host: decodes `path` (an xplane or a Chrome/Kineto trace) and writes its columns and its
    HLO modules to `out`, times relative to each line's own timestamp as read, decoding up to `threads` lines at once.
    Returns (hostname, bytes written)."""
    host, _, size = map_host_read(path, out, threads)
    return host.hostname, size


def map_host_read(path: Path, out: Path, threads: int = 1) -> tuple[HostProfile, list[HloModule], int]:
    """map_host, and the host as decoded with its HLO modules (for what else the map makes of it)."""
    host, modules = (read_trace_host(path), []) if is_trace_file(path) else read_host(path, threads=threads)
    size = save_session(Session(name=host.hostname, hosts=[host], hlo_modules=modules, origin_ns=0), out)
    return host, modules, size


def _mapped_host(path: Path, source: Path) -> tuple[HostProfile, list[HloModule]]:
    loaded = load_session(path)
    host = loaded.hosts[0]
    host.path = source
    return host, loaded.hlo_modules


def read_session_by_host(
    paths: list[Path],
    name: str | None = None,
    max_bytes: int = DEFAULT_MAX_PROFILE_BYTES,
    workers: int | None = None,
    progress: Progress | None = None,
    worker: str = __name__,
    on_mapped: Callable[[Session, list[Path]], None] | None = None,
    limit_each_host: bool = False,
) -> Session:
    """Every host file of one capture decoded by worker processes (at most `workers` at once) into a private
    temporary folder, mapped, and the folder removed (a mapped file stays readable until it is unmapped: its disk
    space goes with the session); the same Session as `read_session`. `worker` is the module the workers run (one
    that speaks `main`'s protocol and may write more beside each host's file); `on_mapped(session, files)` is given
    the session and each host's file, in the session's order, before the folder goes. `max_bytes` bounds the files
    together, or with `limit_each_host` each file (a caller whose tools read the hosts' summaries, which checks the
    whole only where they cannot stand in for the columns)."""
    for path in paths if limit_each_host else ():
        size = path.stat().st_size if path.exists() else 0
        if size > max_bytes:
            raise ProfileError(f"{path.name} is {readable_size(size)}, over the {readable_size(max_bytes)} limit per "
                               "host file; capture a shorter window or raise --max-profile-gib")
    total = session_bytes(paths, sys.maxsize if limit_each_host else max_bytes)
    ordered = sorted(paths)
    with scratch.folder("hosts") as mapped:  # removed on SIGTERM too; swept at the next start if killed
        outs = [mapped / f"host-{index:05d}.xdiag" for index in range(len(ordered))]
        count = map_workers(len(ordered), workers)
        # the cores the read may use, shared out: two hosts on four cores decode two lines at once each
        _map_hosts(ordered, outs, count, max(1, (workers or _CPUS) // count), progress, total, worker)
        read = [_mapped_host(out, path) for path, out in zip(ordered, outs)]
        session = assemble_session(read, name or paths[0].parent.name)
        if on_mapped is not None:
            on_mapped(session, outs)
    return session


def _map_hosts(paths: list[Path], outs: list[Path], workers: int, threads: int, progress: Progress | None,
               total: int, module: str = __name__) -> None:
    """map_host of each path into its out (`threads` lines at once), by `workers` worker processes (`python -m
    module`: a fresh interpreter, nothing of the caller's program imported again or inherited), each taking the next host as it
    finishes one and handing the host's memory back before the next (its peak is its largest host, not the sum).
    A host that cannot be read stops the map: no host is started after it, and the failure of the first such file
    (in the session's order) is raised, a ProfileError with the worker's reason, which names the file. A worker
    that does not answer within `host_seconds` of the file's size is killed: a hung worker fails its host."""
    jobs = list(enumerate(zip(paths, outs)))
    lock = threading.Lock()
    failures: dict[int, str] = {}
    done = [0]

    def next_job() -> tuple[int, tuple[Path, Path]] | None:
        with lock:
            return jobs.pop(0) if jobs and not failures else None

    def serve() -> None:
        errors = tempfile.TemporaryFile()  # not a pipe: a worker that writes much there must not block on it
        worker = subprocess.Popen(
            [sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=errors, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        try:
            while (job := next_job()) is not None:
                index, (path, out) = job
                bound = host_seconds(path.stat().st_size if path.exists() else 0)
                stopped = threading.Event()

                def stop() -> None:  # the answer's readline returns "" once the worker is killed
                    stopped.set()
                    worker.kill()

                timer = threading.Timer(bound, stop)
                timer.start()
                try:
                    send_message(worker.stdin, {"path": str(path), "out": str(out), "threads": threads})
                    answer = receive_message(worker.stdout) or {}
                except (OSError, ValueError):  # BrokenPipeError: it had died already; a garbled answer
                    answer = {}
                finally:
                    timer.cancel()
                if "ok" in answer:
                    with lock:
                        done[0] += path.stat().st_size
                        if progress:
                            progress(f"read {len(paths)} hosts", done[0], total)
                    continue
                if isinstance(answer.get("failed"), str):
                    reason = answer["failed"]
                else:  # the worker died (out of memory, a crash): its last words
                    worker.kill()
                    errors.seek(0)
                    lines = errors.read().decode("utf-8", "replace").strip().splitlines()
                    reason = (f"{path.name}: the host's reader did not answer within {bound:.0f} s and was stopped"
                              if stopped.is_set() else
                              f"{path.name}: the host's reader exited with status {worker.wait()}: "
                              f"{lines[-1] if lines else 'no output'}")
                with lock:
                    failures[index] = reason
                return
        finally:
            if worker.poll() is None:
                try:
                    worker.stdin.close()
                except OSError:
                    pass
                try:
                    worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            worker.stdout.close()
            errors.close()

    servers = [threading.Thread(target=serve, daemon=True) for _ in range(workers)]
    for server in servers:
        server.start()
    for server in servers:
        server.join()
    if failures:
        raise ProfileError(failures[min(failures)])


MAX_MESSAGE_BYTES = 2**24
"""The most a message between the analysing process and a map worker may hold (a request is two paths and a
number, an answer a size or a reason): a longer length prefix is a garbled stream, not a message."""


def send_message(stream, message: dict) -> None:
    """`message` to the other process as one frame: its JSON (ASCII, so any file name, tabs, newlines and bytes
    that are not UTF-8 included, travels as escapes) after its length in 4 bytes. No file name can end a frame or
    start another, as a line of tab-separated fields let `x<TAB>victim.txt<TAB>1<NL>` do (issue 62)."""
    data = json.dumps(message, ensure_ascii=True).encode("ascii")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def receive_message(stream) -> dict | None:
    """The next frame send_message wrote to `stream`, or None where the stream ends (the other process exited or
    closed it). ValueError for a frame cut short, too long or not a JSON object."""
    head = stream.read(4)
    if not head:
        return None
    if len(head) < 4:
        raise ValueError("a message's length cut short")
    (size,) = struct.unpack(">I", head)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {size} bytes, over the {MAX_MESSAGE_BYTES} bytes a message may hold")
    data = stream.read(size)
    if len(data) < size:
        raise ValueError("a message cut short")
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("a message that is not a JSON object")
    return message


def main() -> int:
    """`python -m xdiag.profile.hosts_map`: a map worker. Reads requests on stdin, `{"path", "out", "threads"}`
    framed by send_message, maps each host (map_host) and answers on stdout, a frame per host: `{"ok": BYTES}`, or
    `{"failed": REASON}` where the file cannot be read (a ProfileError). Its memory goes back to the system after
    each host."""
    return serve_maps(lambda path, out, threads: map_host(path, out, threads)[1])


def serve_maps(map_one: Callable[[Path, Path, int], int]) -> int:
    """A map worker's loop (main's protocol) around `map_one(path, out, threads) -> bytes written`. The answers go
    to the stdout the worker was started with; what the worker's code or its libraries print goes to stderr, so no
    print can garble a frame."""
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    while (request := receive_message(requests)) is not None:
        try:
            size = map_one(Path(request["path"]), Path(request["out"]), int(request["threads"]))
            answer: dict = {"ok": size}
        except ProfileError as exc:
            answer = {"failed": " ".join(str(exc).split())}
        gc.collect()
        return_freed_memory_to_the_os()
        send_message(answers, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
