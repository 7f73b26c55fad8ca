"""get_smart_suggestions: what does XProf itself suggest for this profile?"""

from __future__ import annotations

from xdiag.analysis.xprof.session_views import views
from xdiag.errors import NotAvailable, ProfileError
from xdiag.profile.space import Session
from xdiag.tools.common import xprof_source
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_smart_suggestions",
    "XProf's own smart suggestions for a TPU/GPU profile (its rule-based advice), passed through as it gives them.",
)
def get_smart_suggestions(session: Session) -> ToolOutput:
    """summary: suggestions (count), first. detail: XProf's suggestions. Not available on CPU profiles, nor where
    XProf cannot read the file (a fact of that file, kept with its answers)."""
    try:
        view = views(session).smart_suggestions()
    except ProfileError as exc:
        raise NotAvailable(f"XProf has no suggestions for this profile: {exc}") from None
    suggestions = view.get("suggestions") or view.get("detail", {}).get("suggestions") or []
    if not suggestions and not view:
        raise NotAvailable("XProf produced no smart suggestions for this profile")
    summary = {k: v for k, v in view.items() if k != "detail"}
    summary.setdefault("suggestions", len(suggestions))
    return ToolOutput(summary, {"xprof": view}, xprof_source())
