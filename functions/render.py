"""Cloud Function `render`: a ReportReady on `reports` → summary.html and analysis.json beside the profile,
the analysis DONE (or FAILED) in Firestore."""

import functions_framework
from xdiag.pipeline import stages
from xdiag.cloud.runtime import pubsub_stage


@functions_framework.cloud_event
@pubsub_stage(stages.TOPIC_REPORTS)
def render(message, deps):
    stages.render(message, deps)
