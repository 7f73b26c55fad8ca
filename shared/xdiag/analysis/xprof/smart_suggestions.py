"""The `smart_suggestions` view. XProf's rule-based suggestions: suggestion_count; detail.suggestions (rule, text).

Built once per session by XprofViews (runner.py), which memoises it. Where the converter cannot
suggest anything (`views.may_have_suggestions()`, see runner.py) the answer is its empty report's,
without the conversion (seconds on large profiles).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from xdiag.analysis.xprof.common import DEFAULT_TOP_N
from xdiag.errors import NotAvailable

if TYPE_CHECKING:
    from xdiag.analysis.xprof.runner import XprofViews


def build(views: XprofViews) -> dict:
    if not views.may_have_suggestions():
        views.require_readable()
        return _view([])
    page = views.page("smart_suggestion")
    if page is None:
        raise NotAvailable("XProf's smart_suggestion converter returned nothing for this profile")
    suggestions = [
        {
            "rule": item.get("ruleName") or item.get("rule_name"),
            "text": re.sub(r"<[^>]+>", "", str(item.get("suggestionText") or item.get("suggestion_text"))).strip(),
        }
        for item in page.get("suggestions", [])
        if isinstance(item, dict)
    ]
    return _view(suggestions)


def _view(suggestions: list[dict]) -> dict:
    return {"suggestion_count": len(suggestions), "detail": {"suggestions": suggestions[:DEFAULT_TOP_N]}}
