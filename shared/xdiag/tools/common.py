"""Small helpers the tool modules share."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from xdiag.analysis.xprof import XPROF_VIEWS_ENV
from xdiag.profile.trace_json import KINETO, trace_format
from xdiag.errors import NotAvailable, XdiagError
from xdiag.profile.space import Session

HOST_PLANE_SOURCE = "xdiag host-plane analysis (XLA:CPU ops on the CPU client threads, step annotations)"
TORCH_CPU_SOURCE = ("xdiag host-plane analysis (PyTorch CPU ops and the backend's collectives on each rank's threads, "
                    "step annotations)")
DEVICE_PLANE_SOURCE = "xdiag device-plane analysis"
XPROF_SOURCE = "XProf converters (xprof {version})"


def ms(ps: float | np.ndarray) -> float:
    return round(float(ps) / 1e9, 4)


def percent(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def xprof_source() -> str:
    try:
        from importlib.metadata import version

        return XPROF_SOURCE.format(version=version("xprof"))
    except Exception:  # pragma: no cover - xprof is a pinned dependency
        return XPROF_SOURCE.format(version="?")




def host_plane_source(session: Session) -> str:
    """Where a CPU profile's numbers come from: XLA:CPU ops, or a CPU-only PyTorch run's ops (a Kineto trace)."""
    return TORCH_CPU_SOURCE if trace_format(session) == KINETO else HOST_PLANE_SOURCE


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
        from xdiag.analysis.xprof import XprofViews

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


def broad_view_calls(session: Session) -> list[tuple[str, dict[str, Any]]]:
    """The XProf views the broad tools ask for on this session, with the arguments they pass (the session's busiest
    HLO module for get_peak_allocations): what register records once for every tool instance
    (`xdiag.analysis.xprof.stored`)."""
    from xdiag.analysis.xprof.stored import BROAD_CALLS
    from xdiag.tools.get_peak_allocations import busiest_module

    module = busiest_module(session)
    return [*BROAD_CALLS, *([("peak_allocations", {"module": module.display_name})] if module is not None else [])]


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
