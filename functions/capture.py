"""Cloud Function `capture`: a message on `alerts` (a Cloud Monitoring incident, a monitor's verdict, a manual or
snapshot request) → a profile captured from the run's registered targets, written to the bucket, a CaptureReady
on `captures`."""

import functions_framework
from xdiag.capture.stage import capture as capture_stage
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_ALERTS)
def capture(message, deps):
    capture_stage(message, deps)
