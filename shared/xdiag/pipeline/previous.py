"""This session against the run's previous one: when a run already has an analysed session, render compares the new
session with the latest earlier one (xdiag.compare) and writes `diff-previous.json` and `diff-previous.html` beside
summary.html, whose "Compared with the previous session" section quotes the headline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xdiag.model import Analysis, ToolResult
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.topics import ANALYSES, sessions_collection

if TYPE_CHECKING:
    from xdiag.compare.sessions import SessionDiff

DIFF_JSON, DIFF_HTML = "diff-previous.json", "diff-previous.html"


def previous_analysis(deps: Dependencies, analysis: Analysis) -> dict[str, Any] | None:
    """The run's latest other session analysed (DONE) before this analysis began; None for a run's first."""
    earlier = []
    for _, session in deps.state.list(sessions_collection(analysis.run_id)):
        if session.get("session_id") == analysis.session_id or not session.get("analysis_id"):
            continue
        doc = deps.state.get(ANALYSES, session["analysis_id"])
        if doc and doc.get("status") == "DONE" and doc.get("output_uri") and \
                str(doc.get("created_at")) < str(analysis.created_at):
            earlier.append(doc)
    return max(earlier, key=lambda doc: str(doc.get("created_at")), default=None)


def compare_with_previous(deps: Dependencies, analysis: Analysis, results: dict[str, ToolResult]) -> SessionDiff | None:
    """The comparison with the previous session, written beside the report (`analysis.report_uri`, set before the
    call); None where there is none (or its outputs are gone: the report then has no such section, and this
    analysis is not held up)."""
    previous = previous_analysis(deps, analysis)
    if previous is None:
        return None
    # imported only here: a run's first session (every `xdiag analyze`) compares with nothing
    from xdiag.compare.html import render_diff_html
    from xdiag.compare.outputs import load_outputs
    from xdiag.compare.sessions import SessionOutputs, compare_sessions

    try:
        before = load_outputs(deps.blobs, previous["output_uri"], f"{previous['run_id']}/{previous['session_id']}")
    except (FileNotFoundError, ValueError, LookupError):
        return None
    after = SessionOutputs(label=f"{analysis.run_id}/{analysis.session_id}", analysis=analysis.model_dump(mode="json"),
                           tools={name: result.model_dump(mode="json") for name, result in results.items()})
    diff = compare_sessions(before, after)
    # beside summary.html, which links them
    base = analysis.report_uri.rsplit("/", 1)[0] if analysis.report_uri else analysis.output_uri.rstrip("/")
    deps.blobs.put(f"{base}/{DIFF_JSON}", diff.model_dump_json(indent=2).encode(), "application/json")
    deps.blobs.put(f"{base}/{DIFF_HTML}", render_diff_html(diff).encode(), "text/html; charset=utf-8")
    return diff
