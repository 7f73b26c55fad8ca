"""This session against its baseline: when a run already has an analysed session, render compares the new session
with one (xdiag.compare) and writes `diff-previous.json` and `diff-previous.html` beside summary.html, whose top says
what changed since ("step +18% since <session>: `train.py:62` +40 ms") and whose "Compared with …" section quotes
the headline. The analysis records its baseline (`Analysis.baseline`), which the run's sessions list shows.

The baseline: for an automatic capture (kind `auto`: a degradation alert, or xdiag's own monitor's `bad` verdict)
the run's last healthy session, the latest earlier one that was analysed and is not itself an automatic capture
(an automatic capture is taken because the run got slower; the question is what changed since it was well); for
any other session, the run's latest earlier analysed session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xdiag.model import Analysis, ToolResult
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.runs import KIND_AUTO
from xdiag.pipeline.topics import ANALYSES, sessions_collection

if TYPE_CHECKING:
    from xdiag.compare.sessions import SessionDiff

DIFF_JSON, DIFF_HTML = "diff-previous.json", "diff-previous.html"
PREVIOUS, LAST_HEALTHY = "previous session", "last healthy session"


def _kind(deps: Dependencies, analysis: Analysis) -> str | None:
    session = deps.state.get(sessions_collection(analysis.run_id), state_key(analysis.session_id))
    return (session or {}).get("kind")


def baseline_analysis(deps: Dependencies, analysis: Analysis) -> tuple[dict[str, Any] | None, str]:
    """(the baseline's analysis document, its role), or (None, role) for a run with none: the run's last healthy
    session for an automatic capture, else its latest other session analysed (DONE) before this analysis began."""
    role = LAST_HEALTHY if _kind(deps, analysis) == KIND_AUTO else PREVIOUS
    earlier = []
    for _, session in deps.state.list(sessions_collection(analysis.run_id)):
        if session.get("session_id") == analysis.session_id or not session.get("analysis_id"):
            continue
        if role == LAST_HEALTHY and session.get("kind") == KIND_AUTO:
            continue
        doc = deps.state.get(ANALYSES, session["analysis_id"])
        if doc and doc.get("status") == "DONE" and doc.get("output_uri") and \
                str(doc.get("created_at")) < str(analysis.created_at):
            earlier.append(doc)
    return max(earlier, key=lambda doc: str(doc.get("created_at")), default=None), role


def previous_analysis(deps: Dependencies, analysis: Analysis) -> dict[str, Any] | None:
    return baseline_analysis(deps, analysis)[0]


def compare_with_previous(deps: Dependencies, analysis: Analysis, results: dict[str, ToolResult]) -> SessionDiff | None:
    """The comparison with the baseline, written beside the report (`analysis.report_uri`, set before the call) and
    recorded on the analysis (`analysis.baseline`); None where there is none (or its outputs are gone: the report
    then has no such section, and this analysis is not held up)."""
    previous, role = baseline_analysis(deps, analysis)
    if previous is None:
        return None
    # imported only here: a run's first session (every `xdiag analyze`) compares with nothing
    from xdiag.compare.html import render_diff_html
    from xdiag.compare.outputs import load_outputs
    from xdiag.compare.sessions import SessionOutputs, compare_sessions, what_changed_since

    try:
        before = load_outputs(deps.blobs, previous["output_uri"], f"{previous['run_id']}/{previous['session_id']}")
    except (FileNotFoundError, ValueError, LookupError):
        return None
    after = SessionOutputs(label=f"{analysis.run_id}/{analysis.session_id}", analysis=analysis.model_dump(mode="json"),
                           tools={name: result.model_dump(mode="json") for name, result in results.items()})
    diff = compare_sessions(before, after)
    diff.baseline_role = role
    # beside summary.html, which links them
    base = analysis.report_uri.rsplit("/", 1)[0] if analysis.report_uri else analysis.output_uri.rstrip("/")
    deps.blobs.put(f"{base}/{DIFF_JSON}", diff.model_dump_json(indent=2).encode(), "application/json")
    deps.blobs.put(f"{base}/{DIFF_HTML}", render_diff_html(diff).encode(), "text/html; charset=utf-8")
    analysis.baseline = {"run_id": previous["run_id"], "session_id": previous["session_id"],
                         "analysis_id": previous.get("analysis_id"), "role": role, "verdict": diff.verdict,
                         "since": what_changed_since(diff), "diff_uri": f"{base}/{DIFF_HTML}"}
    return diff
