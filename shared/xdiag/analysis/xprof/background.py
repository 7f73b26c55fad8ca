"""XProf's views of a large device session, converted beside `xdiag analyze` in a process of their own and kept per
file version, so that the diagnosis never waits for them and no later analysis converts them again.

On a 74 MiB TPU v5e profile (kv_decode's lines replicated, 1.46M events) XProf's conversions were 15 of the 17.8 s
of a default analysis and its 912 MiB peak, against 2.5 s and 210 MiB for xdiag's own (bench/README.md, "TPU
profiles"). For a session of `worker.PREFETCH_MIN_BYTES` or more, `background_views` therefore starts one detached
process (`python -m xdiag.analysis.xprof.background [--niceness=N] FOLDER FILE...`, at a lower priority unless the
report waits for it) that converts the views the broad tools ask for (`stored.BROAD_CALLS`) and writes them as one
record (`stored.record`) into FOLDER, the file version's folder of the local cache; the analysis takes them from
the record where it is there, waits for it at most `wait_s` after the process started, and otherwise goes on without
them: each view then says it is not available and why (still converting, where the record will be, or the
converter's failure). A second analysis of the same file versions, with the record there, converts nothing.
Smaller sessions convert in line as before (`start_views`): there the conversions cost about what a process start
costs.

A record is written once, by whichever process holds FOLDER's lock (`LOCK`: its pid); another analysis of the same
files meanwhile waits for that process's record instead of starting a second conversion.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof.views import ViewMethods
from xdiag.analysis.xprof.worker import allocator_environment
from xdiag.errors import NotAvailable
from xdiag.fresh_files import replace_with, verified, with_digest
from xdiag.profile import scratch
from xdiag.sizes import readable_size

RECORD = "views.json"
"""The record of the views (`stored.record`), written whole (a rename) when every view is converted."""
LOCK = ".converting.pid"
"""Held (created exclusively, holding the converter's pid) while a process converts into the folder."""
FAILED = "failed.txt"
"""Why the last conversion into the folder ended without a record."""
CONVERTER_NICENESS = 10
"""How much lower the converter's priority is than the analysis' where the analysis does not wait for it: on a busy
machine xdiag's own tools go first. Where the report waits for the views (`xdiag analyze --xprof-wait`) they are what
it waits for, so the converter keeps the analysis' priority."""
_POLL_S = 0.05
IN_LINE_VIEWS = frozenset({"memory_profile", "peak_allocations"})
"""Views the analysis answers itself, never waited for, where the record does not hold them: xdiag's own memory
figures on TPUs and GPUs are XProf's memory_profile, which reads the host planes alone, so it converts a copy without
the device planes (`session_dir.copy_without_device_planes`: 0.4 s and 20 MiB on the 87.6 MiB TPU v5e capture,
against 1.2 s and 620 MiB whole); peak_allocations reads the HLO protos of the metadata plane, which that copy keeps."""


def record_path(folder: Path) -> Path:
    return Path(folder) / RECORD


def read_record(folder: Path) -> dict[str, Any] | None:
    """The views recorded in `folder`, or None where there is no readable record."""
    try:
        kept = verified(record_path(folder).read_bytes())  # a truncated, flipped or planted record is not served
        return None if kept is None else json.loads(kept)
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def converting_pid(folder: Path) -> int | None:
    """The pid of a live process converting into `folder`, or None (a stale lock is removed)."""
    lock = Path(folder) / LOCK
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    if pid and _pid_alive(pid):
        return pid
    with contextlib.suppress(OSError):
        lock.unlink()
    return None


def start_converter(files: Sequence[Path], folder: Path, niceness: int = CONVERTER_NICENESS) -> int | None:
    """Starts the detached converter of `files` into `folder` (unless one converts there already); its pid, or None
    where none could start. It runs on the malloc XProf's workers run on (`worker.allocator_environment`): on the
    87.6 MiB TPU v5e capture XProf's op_stats conversion then peaks at 1,060 MiB instead of 1,280-1,310 MiB, in
    15-25% less CPU (single runs, 2 cores at load 3.5-4). `niceness`: how much lower its priority is."""
    running = converting_pid(folder)
    if running is not None:
        return running
    Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        (Path(folder) / FAILED).unlink()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, f"--niceness={int(niceness)}", str(folder),
             *(str(Path(f).absolute()) for f in files)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **allocator_environment()},
        )
    except OSError:
        return None
    return process.pid


class BackgroundViews(ViewMethods):
    """The views of files a detached converter writes into `folder`: answered from its record, which each view waits
    for until `wait_s` after `started` (monotonic seconds), else NotAvailable with where they are converted."""

    def __init__(self, files: Sequence[Path], folder: Path, pid: int | None, wait_s: float,
                 started: float | None = None, refused: str | None = None):
        """`refused`: why no converter is started (`memory_budget.refusal`): the views say so, and only
        IN_LINE_VIEWS, which read the host planes, are converted."""
        self.files, self.folder, self.pid, self.wait_s = list(files), Path(folder), pid, wait_s
        self.refused = refused
        self.started = time.monotonic() if started is None else started
        self._stored: Any = None  # StoredViews, once the record is read
        self._start_at_close = False
        self._asked = False  # a converter is started at close only for views a tool asked for (not a failed read's)
        self._host_planes: Any = None  # XprofViews of copies without the device planes (IN_LINE_VIEWS)
        self._host_folder: str | None = None

    def stored(self) -> Any:
        """The recorded views, where the record is there or comes before the wait runs out; else None. Before it
        waits, the process hands the memory it freed back to the system (`return_freed_memory_to_the_os`): on the
        87.6 MiB TPU v5e capture `xdiag analyze --xprof-wait` held 247 MiB while XProf's converter beside it peaked,
        43 MiB of it freed by xdiag's own tools and kept by malloc."""
        from xdiag.analysis.xprof.stored import StoredViews
        from xdiag.profile.reader import return_freed_memory_to_the_os

        if self._stored is None:
            deadline = self.started + self.wait_s
            trimmed = False
            while True:
                recorded = read_record(self.folder)
                if recorded is not None:
                    self._stored = StoredViews(recorded, lambda: self.files)
                    break
                if time.monotonic() >= deadline or self.pid is None or not _pid_alive(self.pid):
                    break
                if not trimmed:  # the analysis waits beside XProf's converter at its largest: hand back what it freed
                    return_freed_memory_to_the_os()
                    trimmed = True
                time.sleep(_POLL_S)
        return self._stored

    def missing_reason(self) -> str:
        """Why the views are not in this analysis, and where they will be."""
        if self.refused:
            return self.refused
        size = readable_size(sum(Path(f).stat().st_size for f in self.files if Path(f).exists()))
        try:
            failed = (self.folder / FAILED).read_text().strip()
        except OSError:
            failed = ""
        if failed:
            return f"XProf's conversion of this {size} session failed in its own process: {failed}"
        if self.pid is None and not self._start_at_close:
            return f"XProf's converter for this {size} session could not be started"
        when = ("after this analysis" if self.pid is None else f"beside this analysis (pid {self.pid})")
        return (f"XProf's views of this {size} session are converted {when}, in a process of their own, so that "
                f"the diagnosis does not wait for them (it waits {self.wait_s:g} s: xdiag analyze --xprof-wait). "
                f"They are kept per file version in {self.folder}: the next `xdiag analyze`, `xdiag tool` or MCP "
                "call on these files answers them without converting")

    def _answer(self, method: str, **arguments: Any) -> dict:
        self._asked = True
        if method in IN_LINE_VIEWS:
            recorded = self._stored if self._stored is not None else (
                self.stored() if read_record(self.folder) is not None else None)
            if recorded is None or not recorded.holds(method, **arguments):
                return self._host_plane_views()._answer(method, **arguments)
        stored = self.stored()
        if stored is None:
            raise NotAvailable(self.missing_reason())
        return stored._answer(method, **arguments)

    def _host_plane_views(self) -> Any:
        from xdiag.analysis.xprof.session_dir import copy_without_device_planes
        from xdiag.analysis.xprof.views import XprofViews

        if self._host_planes is None:
            self._host_folder = str(scratch.make("xprof-host-planes"))
            copies = []
            for path in self.files:
                copies.append(Path(self._host_folder) / Path(path).name)
                copy_without_device_planes(Path(path), copies[-1])
            self._host_planes = XprofViews(copies)
        return self._host_planes

    def prefetch(self) -> int:
        """Nothing to start here: the converter started with this object."""
        return 0

    @property
    def workers_converting(self) -> int:
        """No worker of this process converts (the read may take every core; the converter runs at a lower
        priority)."""
        return 0

    def close(self) -> None:
        """Starts the converter now where it was left for the end of the analysis (`background_views`)."""
        if self._host_planes is not None:
            self._host_planes.close()
            self._host_planes = None
        if self._host_folder is not None:
            shutil.rmtree(self._host_folder, ignore_errors=True)
            self._host_folder = None
        if self._stored is not None:
            self._stored.close()
        elif self.pid is None and self._start_at_close and self._asked and read_record(self.folder) is None:
            self.pid = start_converter(self.files, self.folder)
        self._start_at_close = False


def adopt_kept_views(session: Any, folder: Path) -> None:
    """A session's views from the record kept in `folder`, where there is one (`xdiag tool`, the MCP server)."""
    from xdiag.analysis.xprof.session_views import adopt_stored_views

    recorded = read_record(folder)
    if recorded is not None:
        adopt_stored_views(session, recorded, lambda: session.paths)


def refused_views(files: Sequence[Path], folder: Path, refused: str) -> BackgroundViews:
    """The views of a device session whose conversions would not fit in memory (`refused` says so): none converted
    but IN_LINE_VIEWS, which read the host planes alone (a 2 GB TPU host's memory figures come from them, and its whole
    private copy, 9 s of CPU and 780 MiB for nothing else, is never made)."""
    return BackgroundViews(files, folder, None, 0.0, refused=refused)


def background_views(files: Sequence[Path], folder: Path, wait_s: float) -> BackgroundViews:
    """The views of a device session's `files` from the record in `folder`, converted there by a detached process
    where no record is there yet: started now where the analysis may wait for it (`wait_s` > 0), else when the
    analysis closes the views, so that its conversions never take a core from xdiag's own tools (on 2 cores the
    74 MiB TPU profile's own analysis took 5.9 s beside them, 2.5 s alone)."""
    if read_record(folder) is not None:
        return BackgroundViews(files, folder, None, wait_s)
    if wait_s > 0:  # the report waits for it: it goes at the analysis' priority
        return BackgroundViews(files, folder, start_converter(files, folder, niceness=0), wait_s)
    views = BackgroundViews(files, folder, converting_pid(folder), wait_s)
    views._start_at_close = views.pid is None
    return views


def convert_into(folder: Path, files: Sequence[Path], niceness: int = CONVERTER_NICENESS) -> int:
    """The converter's work: every view the broad tools ask for, recorded into `folder` (see the module docstring),
    at `niceness` below the caller's priority. Returns the exit status (0 also where another process holds the lock:
    its record will come)."""
    from xdiag.analysis.xprof.conversions import ConversionTooLarge
    from xdiag.analysis.xprof.stored import BROAD_CALLS, record
    from xdiag.analysis.xprof.views import XprofViews

    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = folder / LOCK
    try:
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        if converting_pid(folder) is not None:
            return 0
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(descriptor, str(os.getpid()).encode())
        os.close(descriptor)
        if niceness > 0:
            with contextlib.suppress(OSError):
                os.nice(niceness)
        try:
            with XprofViews(list(files), memory_from_host_planes=True) as views:
                recorded = record(views, BROAD_CALLS)
                if views.conversions.too_large:
                    raise ConversionTooLarge(views.conversions.too_large)
        except Exception as error:  # noqa: BLE001 - said in the folder, read by the views that wait for it
            (folder / FAILED).write_text(f"{type(error).__name__}: {error}\n")
            return 1
        replace_with(record_path(folder), with_digest(json.dumps(recorded).encode()), mode=0o600)
        return 0
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


if __name__ == "__main__":
    scratch.exit_on_sigterm()  # its private copy goes with it
    arguments = sys.argv[1:]
    niceness = CONVERTER_NICENESS
    if arguments and arguments[0].startswith("--niceness="):
        niceness = int(arguments.pop(0).partition("=")[2])
    sys.exit(convert_into(Path(arguments[0]), [Path(f) for f in arguments[1:]], niceness))
