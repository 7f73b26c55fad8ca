"""XProf's own converters over a device session: one module per view, each a `build(views)` that the runner
(`XprofViews`) calls once per session and memoises; `common` holds what the views share."""

from xdiag.analysis.xprof.runner import XprofViews

__all__ = ["XprofViews"]
