"""Cloud Function `run_tool`: a ToolRun on `tool-runs` → one tool over the session, its result stored, a
ToolDone on `tool-results`."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.tool_runs import run_tool as run_tool_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_TOOL_RUNS)
def run_tool(message, deps):
    run_tool_stage(message, deps)
