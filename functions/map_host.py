"""Cloud Function `map_host`: a HostMapRun on `host-maps` → one host file of a many-host session decoded and stored
prepared; the last host's delivery announces the session again on `captures` (collect's reduce)."""

import functions_framework
from xdiag.cloud.runtime import pubsub_stage
from xdiag.pipeline import topics
from xdiag.pipeline.stages.map_host import map_host as map_host_stage


@functions_framework.cloud_event
@pubsub_stage(topics.TOPIC_HOST_MAPS)
def map_host(message, deps):
    map_host_stage(message, deps)
