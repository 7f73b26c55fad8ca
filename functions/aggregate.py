"""Cloud Function `aggregate` (fan-in): a ToolDone on `tool-results` → once every broad tool is in, one
InvestigationReady on `investigations`, claimed with a create-if-absent write."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.tool_runs import aggregate as aggregate_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_TOOL_RESULTS)
def aggregate(message, deps):
    aggregate_stage(message, deps)
