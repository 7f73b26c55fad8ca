"""Cloud Function `control_plane` (HTTP): the run registry. The ML Diagnostics SDK's self-hosted contract
(`PATCH /v1/machineLearningRuns/{id}`) and xdiag's endpoints: profiler targets, runs, sessions, analyses,
on-demand captures, continuous profiling (see xdiag.control.plane)."""

import functions_framework
from xdiag.control import plane
from xdiag.cloud.runtime import http_handler


@functions_framework.http
@http_handler
def control_plane(deps, access, method, path, query, headers, body):
    return plane.handle(deps, access, method, path, query, headers, body)
