"""The `smart_suggestions` view. XProf's rule-based suggestions: suggestion_count; detail.suggestions (rule, text).

Built once per session by XprofViews (views.py), which memoises it. Where the converter cannot
suggest anything (`views.may_have_suggestions()`, see views.py) the answer is its empty report's,
without the conversion (seconds on large profiles).
"""

from __future__ import annotations

import re

from xdiag.analysis.xprof.common import DEFAULT_TOP_N, ViewSource
from xdiag.errors import NotAvailable


def build(views: ViewSource) -> dict:
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
