"""Cloud Function `render`: a ReportReady on `reports` → summary.html and analysis.json beside the profile,
the analysis DONE (or FAILED) in Firestore."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import stages, topics


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_REPORTS)
def render(message, deps):
    stages.render(message, deps)
