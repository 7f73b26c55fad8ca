"""XProf's views of an xdiag session: made once per session and kept in its cache, adopted from views started before
the read or recorded by another process, and asked for by the tools as an enrichment that never fails them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof import XPROF_VIEWS_ENV
from xdiag.errors import NotAvailable, XdiagError
from xdiag.profile.space import Session
from xdiag.profile.trace_json import trace_format


def views(session: Session):
    """XProf's own views of a device profile, built once per session (on a private copy)."""
    if os.environ.get(XPROF_VIEWS_ENV, "1") == "0":
        raise NotAvailable(f"XProf's converters are turned off ({XPROF_VIEWS_ENV}=0, or xdiag analyze --no-xprof-views)")
    read_from = trace_format(session)
    if read_from is not None:
        raise NotAvailable(f"XProf's converters read *.xplane.pb files; this session was read from a {read_from}, "
                           "which XProf's views cannot open (Perfetto UI or chrome://tracing can)")
    if session.platform == "CPU":
        raise NotAvailable(
            "XProf's converters need a /device:* plane; this is a CPU profile (XLA:CPU ops run on host threads)"
        )
    if "xprof_views" not in session.cache:
        from xdiag.analysis.xprof.views import XprofViews

        session.cache["xprof_views"] = XprofViews(session.paths)
    return session.cache["xprof_views"]


def adopt_views(session: Session, early) -> None:
    """Makes views from `xdiag.analysis.xprof.start_views` the session's own (the ones `views` returns)."""
    if early is None:
        return
    if session.platform == "CPU" or "xprof_views" in session.cache:
        early.close()
        return
    session.cache["xprof_views"] = early


def broad_view_calls(peak_module: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The XProf views the broad tools ask for on a session, with the arguments they pass (`peak_module`, the
    display name of the HLO module get_peak_allocations sizes by default, where the session has one): what register
    records once for every tool instance (`xdiag.analysis.xprof.stored`)."""
    from xdiag.analysis.xprof.stored import BROAD_CALLS

    return [*BROAD_CALLS, *([("peak_allocations", {"module": peak_module})] if peak_module is not None else [])]


def adopt_stored_views(session: Session, stored: dict[str, Any], files: Callable[[], list[Path]]) -> None:
    """Makes XProf's views recorded for this session (`xdiag.analysis.xprof.stored.record`) the session's own: its
    tools answer them without converting; `files` gives the local xplane files for a view the record lacks."""
    from xdiag.analysis.xprof.stored import StoredViews

    if session.platform != "CPU" and "xprof_views" not in session.cache:
        session.cache["xprof_views"] = StoredViews(stored, files)


def prefetch_views(session: Session) -> None:
    """Starts XProf's conversions for a device session in worker processes, so they run while xdiag's
    own tools do (where one process runs every tool); nothing for CPU profiles or with the views off."""
    try:
        views(session).prefetch()
    except XdiagError:  # the tools that use the views meet the same error and report it
        return


def try_view(session: Session, method: str, **kwargs) -> tuple[dict[str, Any] | None, str | None]:
    """(view, None) or (None, reason): XProf views are an enrichment, never a reason to fail a tool."""
    try:
        return getattr(views(session), method)(**kwargs), None
    except NotAvailable as exc:
        return None, str(exc)
    except Exception as exc:  # XProf's converters log and return nothing on many inputs
        return None, f"XProf {method} failed: {type(exc).__name__}: {exc}"
