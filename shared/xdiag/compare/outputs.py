"""An analysed session's outputs, read back from where the analysis wrote them (a local folder or the bucket):
`analysis.json` and every `tools/*.json` beside it."""

from __future__ import annotations

import json

from xdiag.compare.sessions import SessionOutputs
from xdiag.errors import XdiagError

ANALYSIS_FILE = "analysis.json"


def load_outputs(blobs, output_uri: str, label: str) -> SessionOutputs:
    """`output_uri` is the folder holding analysis.json (`…/<session>/xdiag` in a bucket, `--out` locally)."""
    base = output_uri.rstrip("/")
    try:
        analysis = json.loads(blobs.get(f"{base}/{ANALYSIS_FILE}"))
    except FileNotFoundError:
        raise XdiagError(f"{label}: no {ANALYSIS_FILE} in {base} (is it an analysed session?)") from None
    tools = {}
    # Tool outputs sit in tools/ beside analysis.json, or under the analysis' own folder (its work_uri) where the
    # session's current analysis.json is a copy of it.
    own = (analysis.get("work_uri") or analysis.get("output_uri") or base).rstrip("/")
    for folder in dict.fromkeys((f"{base}/tools/", f"{own}/tools/")):
        for info in blobs.list(folder):
            name = info.uri[len(folder):]
            if "/" in name or not name.endswith(".json"):
                continue
            tools.setdefault(name.removesuffix(".json"), json.loads(blobs.get(info.uri)))
    return SessionOutputs(label=label, analysis=analysis, tools=tools)
