"""Cloud Function `investigate`: an InvestigationReady on `investigations` → the diagnosis (OPTIMAL, or
findings from at most four follow-up tool calls), a ReportReady on `reports`."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.investigate import investigate as investigate_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_INVESTIGATIONS)
def investigate(message, deps):
    investigate_stage(message, deps)
