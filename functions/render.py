"""Cloud Function `render`: a ReportReady on `reports` → summary.html and analysis.json beside the profile,
the analysis DONE (or FAILED) in Firestore."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.render import render as render_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_REPORTS)
def render(message, deps):
    render_stage(message, deps)
