"""Cloud Function `register`: an object finalize on the profile bucket (Eventarc, or the bucket's Pub/Sub
notification on `profile-uploads`) → records the host's file; after the quiet period, the whole session
on `captures`."""

import functions_framework
from xdiag.cloud.runtime import storage_stage
from xdiag.pipeline.stages.register import register as register_stage


@functions_framework.cloud_event
@storage_stage
def register(upload, deps):
    register_stage(upload, deps)
