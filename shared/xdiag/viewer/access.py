"""Who sees which sessions in the viewer on Cloud Run: the readers of their runs, as the control plane decides.

Cloud Run's IAM lets in the viewer's members (`roles/run.invoker`); within it, a session is listed and answered only
for its run's owners, readers and the administrators (xdiag.identity: the same rule, the same caller as the
control plane's, read from the ID token Cloud Run's front end checked). A run nobody claimed (uploaded straight
to the bucket) is the administrators'. Runs are read from Firestore, each at most every RUN_REFRESH_S, so that a
page's dozens of requests cost one read per run and a change of readers shows within that time.

Off (`xdiag view`, on the user's own machine) unless XDIAG_VIEWER_AUTH=iam.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xdiag.identity import CERTS_URL_ENV, CLOUD_RUN_ENV, GOOGLE_CERTS_URL, Identity, listed_values
from xdiag.pipeline.run_index import DocumentReader, get_run, run_for_path

AUTH_ENV = "XDIAG_VIEWER_AUTH"
AUDIENCE_ENV = "XDIAG_VIEWER_AUDIENCE"  # the viewer's URLs: the audiences its callers' ID tokens name
ADMINS_ENV = "XDIAG_VIEWER_ADMINS"  # who reads every run (the control plane's administrators)
CALLER_KEY = "xdiag.caller"  # where the guard leaves the verified caller in a request's WSGI environ
RUN_REFRESH_S = 10.0


@dataclass
class RunReaders:
    identity: Identity
    state: DocumentReader
    clock: Any = time.monotonic
    _runs: dict[str, tuple[float, Mapping[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunReaders | None:
        """The rule of XDIAG_VIEWER_AUTH=iam over the project's Firestore; None where the viewer has no such rule."""
        if env.get(AUTH_ENV) != "iam":
            return None
        from google.cloud import firestore

        identity = Identity(iam=True, audiences=listed_values(env.get(AUDIENCE_ENV)),
                            admins=frozenset(listed_values(env.get(ADMINS_ENV))),
                            certs_url=env.get(CERTS_URL_ENV) or GOOGLE_CERTS_URL,
                            on_cloud_run=bool(env.get(CLOUD_RUN_ENV)))
        return cls(identity, FirestoreRuns(firestore.Client(project=env.get("GOOGLE_CLOUD_PROJECT") or None)))

    def caller(self, environ: Mapping[str, Any]) -> str:
        """The request's verified caller; Unauthenticated (401) without one."""
        headers = {name: environ[key] for name, key in (("X-Serverless-Authorization", "HTTP_X_SERVERLESS_AUTHORIZATION"),
                                                         ("Authorization", "HTTP_AUTHORIZATION")) if environ.get(key)}
        return self.identity.caller(headers)

    def may_read(self, caller: str, session: str) -> bool:
        """Whether `caller` may see `session` (`<run folder>/<session>`, as XProf names it)."""
        return self.identity.may_read(self._run(session.rsplit("/", 1)[0]), caller)

    def _run(self, folder: str) -> Mapping[str, Any]:
        now = self.clock()
        with self._lock:
            cached = self._runs.get(folder)
        if cached and now - cached[0] < RUN_REFRESH_S:
            return cached[1]
        run = get_run(self.state, run_for_path(self.state, folder)) or {}
        with self._lock:
            self._runs[folder] = (now, run)
        return run


@dataclass(frozen=True)
class FirestoreRuns:
    """Reads documents straight from Firestore: the viewer only reads runs (flat fields), and its image carries no
    more of xdiag than this package's modules (xdiag.cloud.firestore is the pipeline's full adapter)."""

    client: Any

    def get(self, collection: str, key: str) -> dict[str, Any] | None:
        snapshot = self.client.collection(collection).document(key).get()
        return snapshot.to_dict() if snapshot.exists else None
