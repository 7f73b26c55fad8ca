"""Cloud Function `collect`: a CaptureReady on `captures` → the analysis recorded, one ToolRun per broad tool
on `tool-runs`."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.collect import collect as collect_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_CAPTURES)
def collect(message, deps):
    collect_stage(message, deps)
