"""Cloud Function `monitor`: step times on `step-times` → a baseline per run → a `bad` verdict on `alerts` when
the step time degrades past the margin for the window."""

import functions_framework
from xdiag.pipeline import stages
from xdiag.cloud.runtime import pubsub_stage
from xdiag.capture.monitor import monitor as monitor_stage


@functions_framework.cloud_event
@pubsub_stage(stages.TOPIC_STEP_TIMES)
def monitor(message, deps):
    monitor_stage(message, deps)
