"""XProf's own converters over a device session: one module per view, each a `build(views)` that the runner
(`XprofViews`) calls once per session and memoises; `common` holds what the views share, `worker` what the converter
worker processes run (imported alone there, so this package imports the runner only when asked for it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xdiag.analysis.xprof.runner import XprofViews

__all__ = ["XprofViews"]


def __getattr__(name: str) -> Any:
    if name == "XprofViews":
        from xdiag.analysis.xprof.runner import XprofViews

        return XprofViews
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
