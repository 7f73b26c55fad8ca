"""Cloud Function `sweep`: a tick on `sweeps` (Cloud Scheduler, every minute) → every analysis past its deadline
repaired (its lost stage published again) or, after the bounded repairs, FAILED with the reason."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.sweep import sweep as sweep_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_SWEEPS)
def sweep(message, deps):
    sweep_stage(message, deps)
