"""Stage `render` (`reports` → `summary.html`): the report and analysis.json written into the analysis' own folder
and, for the session's current analysis, beside the profile."""

from __future__ import annotations

import time

from xdiag.model import Analysis, ReportReady, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import inputs_key
from xdiag.pipeline.runs import run_path
from xdiag.pipeline.stages.analysis_record import (
    analysis_inputs,
    is_current,
    join_uri,
    live_files,
    load_analysis,
    save_analysis,
    work_folder,
)
from xdiag.pipeline.stages.tool_runs import load_results
from xdiag.pipeline.topics import CLAIMS


def render(message: ReportReady, deps: Dependencies) -> None:
    """Writes summary.html and analysis.json into the analysis' own folder and, for the session's current analysis,
    beside the profile; marks the analysis DONE (or FAILED). One render per report request."""
    from xdiag.pipeline.previous import compare_with_previous
    from xdiag.report import render_summary_html

    analysis = load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}")
    if analysis.status in ("DONE", "FAILED") and analysis.report_uri and deps.blobs.exists(analysis.report_uri):
        return  # rendered already: a redelivery writes no second report
    if not is_current(deps, analysis):
        return
    if not deps.state.create(CLAIMS, f"{analysis.analysis_id}.render.{message.attempt}", {"at": utc_now()}):
        return  # a copy delivered at the same time renders it; a lost render is the sweeper's to repeat
    started = time.perf_counter()
    results = load_results(deps, analysis)
    if analysis.status != "FAILED":
        analysis.status = "DONE"
    own, beside = work_folder(analysis), analysis.output_uri
    analysis.report_uri = join_uri(beside, "summary.html")
    analysis.timeline["render"] = utc_now()
    previous = compare_with_previous(deps, analysis, results) if analysis.status == "DONE" else None
    html = render_summary_html(analysis, results, previous=previous)
    analysis.timings_ms["render"] = round((time.perf_counter() - started) * 1000, 1)
    assembling = _being_assembled(deps, analysis)
    if assembling and own != beside:
        analysis.report_uri = join_uri(own, "summary.html")  # its own report only: the session's waits for its files
    folders = [own] if assembling and own != beside else [own, beside] if own != beside else [beside]
    for folder in folders:
        if folder == beside and not is_current(deps, analysis):
            return  # superseded meanwhile: the session's report is the newer analysis'
        deps.blobs.put(join_uri(folder, "summary.html"), html.encode(), "text/html; charset=utf-8")
        deps.blobs.put(join_uri(folder, "analysis.json"), analysis.model_dump_json(indent=2).encode(),
                       "application/json")
    save_analysis(deps, analysis)
    deps.on_event("render", {"report": analysis.report_uri, "status": analysis.status})


def _being_assembled(deps: Dependencies, analysis: Analysis) -> bool:
    """True where the session's folder holds other files than the analysis covers (a host uploaded after its
    announcement, a replaced file): a newer analysis of them is coming, and the session's report is that one's."""
    if not deps.profile_root or not analysis.inputs:
        return False
    live = live_files(deps, deps.profile_root, run_path(deps.state, analysis.run_id), analysis.session_id)
    return bool(live) and inputs_key(live) != inputs_key(analysis_inputs(analysis))
