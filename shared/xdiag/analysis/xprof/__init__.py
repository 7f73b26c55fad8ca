"""XProf's own converters over a device session: one module per view, each a `build(views)` that `views.XprofViews`
calls once per session and memoises; `common` holds what the views share, `conversions` runs XProf's conversions
(in-process or in the processes of `worker`, imported alone there, so this package imports the views only when asked
for them), `session_dir` makes the private folder XProf reads, `quiet` keeps XProf's logging down, `stored` keeps
views computed once for other processes, and `session_views` gives an xdiag session its views."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xdiag.analysis.xprof.views import XprofViews

__all__ = ["XPROF_VIEWS_ENV", "XprofViews", "analysis_views", "start_views"]

XPROF_VIEWS_ENV = "XDIAG_XPROF_VIEWS"
"""Set to 0 to skip XProf's converters: on large device profiles they cost several seconds per view."""


def _device_bytes(paths: Sequence[Path], max_bytes: int | None) -> int | None:
    """The bytes of a session XProf's views are made for: the views on, xplane files of a device profile within
    `max_bytes`; else None (a CPU profile, a trace, a session the read will refuse and say why)."""
    import os

    from xdiag.errors import XdiagError
    from xdiag.profile.locate import is_trace_file
    from xdiag.profile.reader import plane_names
    from xdiag.profile.space import platform_of

    if os.environ.get(XPROF_VIEWS_ENV, "1") == "0" or any(is_trace_file(Path(path)) for path in paths):
        return None  # (a Chrome/Kineto trace: XProf's converters read xplanes only)
    try:
        size = sum(Path(path).stat().st_size for path in paths)
        if (max_bytes is not None and size > max_bytes) or platform_of(
            name for path in paths for name in plane_names(Path(path))
        ) == "CPU":
            return None
    except (XdiagError, OSError, ValueError):  # the read meets the same problem and says what it is
        return None
    return size


def start_views(paths: Sequence[Path], max_bytes: int | None = None) -> XprofViews | None:
    """XProf's views of a session about to be read, their conversions already started (`XprofViews.prefetch`), where
    the views are on and the files' plane names show a device profile; else None: a CPU profile, a session over
    `max_bytes` or files the read will refuse and say why.

    Imports the views and the reader alone, not the tools, so that a caller can start the conversions before its own
    imports: `xdiag analyze` calls it (through `analysis_views`) as soon as the session is located (on two cores the
    conversions then take the core those imports leave idle; bench/README.md, "Measured design choices"), the loader
    where no caller did."""
    from xdiag.errors import XdiagError

    size = _device_bytes(paths, max_bytes)
    if size is None:
        return None
    try:
        from xdiag.analysis.xprof import worker

        worker.start_server(size)  # starts while the views' copy is made
        from xdiag.analysis.xprof.views import XprofViews

        early = XprofViews(sorted(Path(path) for path in paths))
    except (XdiagError, OSError, ValueError):  # the read meets the same problem and says what it is
        return None
    try:
        early.prefetch()
    except XdiagError:  # the views meet it again when asked, and report it
        pass
    return early


def analysis_views(paths: Sequence[Path], max_bytes: int | None, keep_in: Callable[[], Path] | Path,
                   wait_s: float) -> Any:
    """XProf's views for `xdiag analyze` of these files, started now: for a device session of
    `worker.PREFETCH_MIN_BYTES` or more whose conversions fit in memory (or whose views are kept already), converted
    beside the analysis by a detached process and kept in `keep_in` (the file version's folder of the local cache, or
    what gives it), waited for at most `wait_s` (`background`); where they would not fit, the views that read the
    host planes alone (`background.refused_views`); for a smaller session, in line as `start_views` does; None where
    there are none to make."""
    size = _device_bytes(paths, max_bytes)
    if size is None:
        return None
    from xdiag.analysis.xprof import background, memory_budget, worker

    if worker.processes_allowed(size) == 0:
        return start_views(paths, max_bytes)  # cheap enough in line
    files = sorted(Path(path) for path in paths)
    folder = keep_in() if callable(keep_in) else Path(keep_in)
    refused = memory_budget.refusal(size)
    if background.read_record(folder) is None and refused is not None:
        return background.refused_views(files, folder, refused)
    return background.background_views(files, folder, wait_s)


def __getattr__(name: str) -> Any:
    if name == "XprofViews":
        from xdiag.analysis.xprof.views import XprofViews

        return XprofViews
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
