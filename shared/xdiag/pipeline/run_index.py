"""Where a run's document is: the document id of a run or session name, a run's document, and the run a bucket
folder belongs to. It imports nothing but the standard library, so the Cloud Run viewer (infra/viewer) reads runs
the way the pipeline and the control plane do without their dependencies."""

from __future__ import annotations

from typing import Any, Protocol

RUNS = "runs"


class DocumentReader(Protocol):
    def get(self, collection: str, key: str) -> dict[str, Any] | None: ...


def state_key(name: str) -> str:
    """A run or session name as a document id (Firestore ids hold no slash)."""
    return name.replace("/", "~")


def get_run(state: DocumentReader, run_id: str) -> dict[str, Any] | None:
    return state.get(RUNS, state_key(run_id))


def run_for_path(state: DocumentReader, path: str) -> str:
    """The run whose folder is `path` (a run registered through the SDK lives in PREFIX/<run>); else the path itself."""
    last = path.rsplit("/", 1)[-1]
    if last != path:
        doc = get_run(state, last)
        if doc and doc.get("path") == path:
            return last
    return path
