"""Links into XProf's viewer for one session: the URL of a tool page of `<run path>/<session>`.

XProf's frontend reads `run`, `tag` (the tool) and `host` from the page's query string, so a link opens the
session's tool directly. The viewer is `xdiag view` on this machine (http://127.0.0.1:8791, its default port) or,
in the cloud, the Cloud Run service `infra/viewer.tf` deploys (XDIAG_VIEWER_URL); both name sessions as the bucket
does, so one link works for both.
"""

from __future__ import annotations

import os
from urllib.parse import urlencode

DEFAULT_VIEWER_URL = "http://127.0.0.1:8791"
VIEWER_URL_ENV = "XDIAG_VIEWER_URL"
# the viewer's tools a report links to: XProf's tool names
TOOLS = (("trace viewer", "trace_viewer@"), ("op profile", "op_profile"), ("memory viewer", "memory_viewer"),
         ("roofline", "roofline_model"), ("overview", "overview_page"))


def viewer_url() -> str:
    return (os.environ.get(VIEWER_URL_ENV) or DEFAULT_VIEWER_URL).rstrip("/")


def session_link(run_path: str, session_id: str, tool: str, base_url: str | None = None, host: str | None = None) -> str:
    query = {"run": f"{run_path.strip('/')}/{session_id}", "tag": tool}
    if host:
        query["host"] = host
    return f"{base_url or viewer_url()}/?{urlencode(query)}"


def viewer_links(run_path: str, session_id: str, base_url: str | None = None) -> list[tuple[str, str]]:
    """(label, URL) for each tool page of the session a report links to."""
    return [(label, session_link(run_path, session_id, tool, base_url)) for label, tool in TOOLS]


def run_path_of(output_uri: str, run_id: str) -> str:
    """The run's folder as the viewer names it: from the analysis' place in the bucket
    (`<root>/<run path>/plugins/profile/<session>/xdiag`), else (a local analysis) the run id."""
    head, sep, _ = (output_uri or "").partition("/plugins/profile/")
    if sep and head.startswith("gs://"):
        return head.removeprefix("gs://").partition("/")[2] or run_id
    return run_id


def viewer_links_for(analysis) -> list[tuple[str, str]]:
    """A report's links to its session in the viewer (`xdiag view`, or the viewer the deployment names)."""
    return viewer_links(run_path_of(analysis.output_uri or "", analysis.run_id), analysis.session_id)
