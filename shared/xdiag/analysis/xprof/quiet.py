"""Keeping XProf quiet: it logs a great deal from C++ to fd 2 and from Python to the root logger.

While a conversion runs, fd 2 goes to a scratch file and records from xprof's modules are demoted; both are re-logged
at DEBUG on this module's logger (and the caller gets the stderr lines, where XProf's reason for not reading a file
is). The switch is process-wide, so whatever another thread writes to fd 2 during a conversion lands in that DEBUG
record too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from xdiag.analysis.xprof.common import xprof_api
from xdiag.analysis.xprof.worker import flush_stderr

log = logging.getLogger(__name__)


class _DemoteXprofRecords(logging.Filter):
    """Drops log records emitted from xprof's own modules and re-logs them at DEBUG here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.pathname.startswith(xprof_api().package_dir):
            log.debug("xprof %s: %s", record.levelname, record.getMessage())
            return False
        return True


class _QuietXprof:
    """While any conversion runs (in any thread), fd 2 goes to a scratch file and xprof's Python
    log records are demoted; each caller gets the stderr text written during its own window."""

    _LOGGERS = ("", "absl", "tensorboard")

    def __init__(self) -> None:
        self._thread = threading.local()  # nesting depth per thread: only the outermost window logs
        self._lock = threading.Lock()
        self._users = 0
        self._saved_fd: int | None = None
        self._scratch: Any = None
        self._filter = _DemoteXprofRecords()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[list[str]]:
        lines: list[str] = []
        depth = getattr(self._thread, "depth", 0)
        self._thread.depth = depth + 1
        start = self._enter()
        try:
            yield lines
        finally:
            self._thread.depth = depth
            lines.extend(self._exit(start, outermost=depth == 0))

    def _enter(self) -> int | None:
        with self._lock:
            if self._users == 0:
                flush_stderr()
                try:
                    scratch = tempfile.TemporaryFile()
                    saved = os.dup(2)
                    os.dup2(scratch.fileno(), 2)
                except OSError:  # no usable fd 2: let XProf talk
                    return None
                self._scratch, self._saved_fd = scratch, saved
                for name in self._LOGGERS:
                    logging.getLogger(name).addFilter(self._filter)
            self._users += 1
            return os.lseek(self._scratch.fileno(), 0, os.SEEK_CUR)

    def _exit(self, start: int | None, outermost: bool) -> list[str]:
        if start is None:
            return []
        flush_stderr()
        with self._lock:
            fd = self._scratch.fileno()
            end = os.lseek(fd, 0, os.SEEK_CUR)
            text = os.pread(fd, max(0, end - start), start).decode("utf-8", errors="replace")
            self._users -= 1
            if self._users == 0:
                os.dup2(self._saved_fd, 2)
                os.close(self._saved_fd)
                self._scratch.close()
                self._scratch = self._saved_fd = None
                for name in self._LOGGERS:
                    logging.getLogger(name).removeFilter(self._filter)
        if outermost and text.strip():
            log.debug("XProf stderr:\n%s", text[-20_000:])
        return text.splitlines()


quiet = _QuietXprof()
"""`with quiet() as stderr_lines:` around anything that may run an XProf conversion."""
