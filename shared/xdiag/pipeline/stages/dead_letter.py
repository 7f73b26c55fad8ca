"""Stage `dead_letter` (`<topic>-dead-letter` → state): a message Pub/Sub gave up on, recorded, and the analysis it
belonged to let finish without it."""

from __future__ import annotations


from xdiag.model import (
    CaptureReady,
    DeadLetter,
    HostMapRun,
    InvestigationReady,
    ReportReady,
    Status,
    ToolDone,
    ToolResult,
    ToolRun,
    ToolStatus,
    utc_now,
)
from xdiag.pipeline.deps import Dependencies
from xdiag.pipeline.layout import host_file_key, state_key
from xdiag.pipeline.stages.analysis_record import fail_analysis, load_analysis, save_analysis
from xdiag.pipeline.stages.map_host import input_of, reduce_when_mapped
from xdiag.pipeline.stages.tool_runs import record_tool
from xdiag.pipeline.topics import (
    DEAD_LETTERS,
    MESSAGE_TYPES,
    TERMINAL,
    TOPIC_TOOL_RESULTS,
    host_maps_collection,
    letter_key,
    tools_collection,
)
from xdiag.tools import BROAD_TOOLS


DEAD_LETTER_EXCERPT_BYTES = 8 * 1024  # what a dead letter keeps in Firestore; the whole payload goes to the bucket


DEAD_LETTER_FOLDER = "xdiag-dead-letters"  # gs://BUCKET/xdiag-dead-letters/<topic>/<key>: outside any run's folder


def dead_letter(message: DeadLetter, deps: Dependencies) -> None:
    """Records a message that ended on a dead-letter topic (a bounded excerpt in Firestore, the whole payload in the
    bucket); where it belonged to an analysis, lets that analysis finish without it (a tool run becomes a failed
    tool, a lost stage fails the analysis). The letter's own ids are checked before they are used."""
    key = letter_key(message.source_topic, message.data)
    raw = message.data.encode("utf-8", errors="replace")
    record = {**message.model_dump(), "data": raw[:DEAD_LETTER_EXCERPT_BYTES].decode("utf-8", errors="replace"),
              "size_bytes": len(raw), "truncated": len(raw) > DEAD_LETTER_EXCERPT_BYTES, "at": utc_now()}
    if deps.profile_root:
        record["payload_uri"] = deps.blobs.put(
            f"{deps.profile_root}/{DEAD_LETTER_FOLDER}/{state_key(message.source_topic)}/{key}", raw,
            "application/octet-stream")
    deps.state.set(DEAD_LETTERS, key, record)
    deps.on_event("dead_letter", {"topic": message.source_topic, "reason": message.reason[:300]})
    message_type = MESSAGE_TYPES.get(message.source_topic)
    try:
        original = message_type.model_validate_json(message.data) if message_type else None
    except ValueError:
        return  # malformed, or an id outside the grammar: it belonged to nothing
    analysis = load_analysis(deps, original.analysis_id) if getattr(original, "analysis_id", None) else None
    if analysis is None or analysis.status in TERMINAL:
        return
    if isinstance(original, ToolRun):
        if original.tool not in BROAD_TOOLS:
            return
        if deps.state.get(tools_collection(analysis.analysis_id), original.tool) is None:
            reason = f"the tool's run was dead-lettered: {message.reason}"
            record_tool(deps, analysis, ToolResult(tool=original.tool, status=ToolStatus.FAILED, reason=reason))
        deps.bus.publish(TOPIC_TOOL_RESULTS, ToolDone(analysis_id=analysis.analysis_id, tool=original.tool,
                                                     attempt=original.attempt))
    elif isinstance(original, HostMapRun):
        info = input_of(analysis, original)
        if info is None or analysis.status != "MAPPING_HOSTS":
            return
        deps.state.create(host_maps_collection(analysis.analysis_id), host_file_key(info), {
            "status": "FAILED", "uri": info.uri, "host": info.uri.rsplit("/", 1)[-1], "finished_at": utc_now(),
            "reason": f"{info.uri.rsplit('/', 1)[-1]}: its map was dead-lettered: {message.reason}"})
        reduce_when_mapped(deps, analysis, original.attempt)
    elif isinstance(original, (CaptureReady, InvestigationReady)):
        fail_analysis(deps, analysis, f"stage for {message.source_topic} was dead-lettered: {message.reason}")
    elif isinstance(original, ReportReady):
        analysis.status, analysis.result = "FAILED", Status.FAILED
        analysis.failure_reason = f"rendering failed: {message.reason}"
        save_analysis(deps, analysis)
