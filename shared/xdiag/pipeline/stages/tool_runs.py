"""Stages `run_tool` (`tool-runs` → `tool-results`) and `aggregate` (`tool-results` → `investigations`): one broad
tool run on the session and its result stored, and the fan-in that claims the investigation once every broad tool
has a result; `load_results` reads those results back for the later stages."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from xdiag.errors import PoisonMessage, ProfileError, UnknownTool
from xdiag.model import Analysis, InvestigationReady, ToolDone, ToolResult, ToolRun, ToolStatus, utc_now
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.stages.analysis_record import analysis_session, is_current, join_uri, load_analysis, work_folder
from xdiag.pipeline.topics import ANALYSES, CLAIMS, TERMINAL, TOPIC_INVESTIGATIONS, TOPIC_TOOL_RESULTS, tools_collection
from xdiag.tools import BROAD_TOOLS
from xdiag.tools import run_tool as execute_tool


def store_result(deps: Dependencies, analysis: Analysis, result: ToolResult, name: str) -> str:
    """A tool's full result as tools/<name>.json in the analysis' own folder; returns its URI."""
    uri = join_uri(work_folder(analysis), f"tools/{name}.json")
    deps.blobs.put(uri, result.model_dump_json(indent=2).encode(), "application/json")
    return uri


def record_tool(deps: Dependencies, analysis: Analysis, result: ToolResult) -> None:
    """The tool's full output to the blob store, its status and summary to its own document."""
    uri = store_result(deps, analysis, result, result.tool)
    deps.state.set(
        tools_collection(analysis.analysis_id),
        result.tool,
        {"status": result.status.value, "reason": result.reason, "summary": result.summary, "uri": uri,
         "duration_ms": round(result.duration_ms, 2), "source": result.source, "finished_at": utc_now()},
    )


def run_tool(message: ToolRun, deps: Dependencies) -> None:
    """Runs one broad tool on the session and stores its result; a second delivery only re-announces it (which the
    fan-in takes as it took the first). The analysis and the tool's record come in one read, the fan-out's cost
    being its round trips; whether a newer analysis superseded this one is the fan-in's check once every tool is in
    (`aggregate` marks it SUPERSEDED; the tool runs of a repair after that see the status and stop)."""
    if message.tool not in BROAD_TOOLS:
        raise PoisonMessage(f"tool {message.tool!r} is not one of the broad tools an analysis runs")
    analysis_doc, recorded = deps.state.get_many(
        [(ANALYSES, message.analysis_id), (tools_collection(message.analysis_id), message.tool)])
    if analysis_doc is None:
        raise LookupError(f"unknown analysis {message.analysis_id!r}: collect has not recorded it")
    analysis = Analysis.model_validate(analysis_doc)
    if analysis.status in TERMINAL:
        return  # finished, failed or superseded: nothing waits for this tool any more
    if recorded is None:
        try:
            session = analysis_session(deps, analysis)
            result = execute_tool(session, message.tool, message.args)
        except (ProfileError, UnknownTool) as exc:
            result = ToolResult(tool=message.tool, status=ToolStatus.FAILED, reason=str(exc))
        record_tool(deps, analysis, result)
        deps.on_event("run_tool", {"tool": message.tool, "status": result.status.value, "duration_ms": result.duration_ms})
    deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=message.tool,
                                                 attempt=message.attempt))


def aggregate(message: ToolDone, deps: Dependencies) -> None:
    """Fan-in: when every broad tool has a result, claim the investigation exactly once. The tools' records are read
    first: every delivery but the last ends there, in one round trip (three before), and only the last reads the
    analysis and whether a newer one superseded it."""
    if message.tool not in BROAD_TOOLS:
        raise PoisonMessage(f"tool {message.tool!r} is not one of the broad tools an analysis runs")
    done = {key for key, _ in deps.state.list(tools_collection(message.analysis_id))}
    if done and not set(BROAD_TOOLS) <= done:
        return  # more results to come: the last one's delivery goes on
    analysis = load_analysis(deps, message.analysis_id)
    if analysis is None:
        raise PoisonMessage(f"unknown analysis {message.analysis_id!r}: no analysis was recorded, so no tool of it ran")
    if not done or analysis.status != "RUNNING_TOOLS" or not is_current(deps, analysis):
        return  # a stray message (no result), an investigation claimed already (or finished), or a superseded analysis
    if deps.state.create(CLAIMS, f"{analysis.analysis_id}.investigate", {"at": utc_now()}):
        deps.state.update(ANALYSES, analysis.analysis_id, {"status": "INVESTIGATING", "updated_at": utc_now()})
        deps.on_event("aggregate", {"tools": len(done)})
        deps.bus.publish(TOPIC_INVESTIGATIONS, InvestigationReady(analysis_id=analysis.analysis_id,
                                                                  attempt=message.attempt))


def load_results(deps: Dependencies, analysis: Analysis) -> dict[str, ToolResult]:
    """Every recorded tool result whose output is still in the blob store, fetched at once (a round trip each)."""

    def fetch(uri: str) -> ToolResult | None:
        try:
            return ToolResult.model_validate_json(deps.blobs.get(uri))
        except FileNotFoundError:
            return None

    stored = [(tool, doc["uri"]) for tool, doc in deps.state.list(tools_collection(analysis.analysis_id))
              if doc.get("uri")]
    with ThreadPoolExecutor(max_workers=max(1, min(len(stored), 16))) as pool:
        fetched = pool.map(fetch, [uri for _, uri in stored])
        return {tool: result for (tool, _), result in zip(stored, fetched) if result is not None}
