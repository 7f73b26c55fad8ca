"""Cloud Function `monitor`: step times on `step-times` → a baseline per run → a `bad` verdict on `alerts` when
the step time degrades past the margin for the window."""

import functions_framework
from xdiag.capture.monitor import monitor as monitor_stage
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_STEP_TIMES)
def monitor(message, deps):
    monitor_stage(message, deps)
