"""Cloud Function `collect`: a CaptureReady on `captures` → the analysis recorded, one ToolRun per broad tool
on `tool-runs`."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import stages, topics


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_CAPTURES)
def collect(message, deps):
    stages.collect(message, deps)
