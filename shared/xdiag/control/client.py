"""A small client of the control plane's HTTP API (standard library only: a workload imports it too).

`ControlPlaneClient(url, token)`: `url` is the control plane's base URL (`http://127.0.0.1:PORT`, or the function's
URL); a URL with a password (`http://xdiag:TOKEN@HOST:PORT`, the form the ML Diagnostics SDK is given) carries
the token itself. Every method returns the decoded JSON answer or raises ControlPlaneError with the status and
the control plane's reason.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from xdiag.errors import XdiagError


class ControlPlaneError(XdiagError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="~")


class ControlPlaneClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ControlPlaneError(0, f"control plane URL {url!r} is not http(s)://HOST[:PORT]")
        self.token = token or (urllib.parse.unquote(parts.password) if parts.password else None)
        netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                query: dict[str, str] | None = None) -> dict[str, Any]:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")[:500] or exc.reason
            raise ControlPlaneError(exc.code, message) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ControlPlaneError(0, f"control plane unreachable at {self.url}: {reason}") from None
        return json.loads(raw) if raw else {}

    # --- runs -----------------------------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/runs")["runs"]

    def run(self, run: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/runs/{_quote(run)}")

    def create_run(self, run: str, display_name: str | None = None, base_blob_path: str | None = None) -> dict:
        """The SDK's upsert: PATCH /v1/machineLearningRuns/{run}?allow_missing=true."""
        body: dict[str, Any] = {"logicalId": run, "displayName": display_name or run}
        mask = ["logical_id", "display_name"]
        if base_blob_path:
            body["baseBlobPath"], mask = base_blob_path, [*mask, "base_blob_path"]
        return self.request("PATCH", f"/v1/machineLearningRuns/{_quote(run)}", body,
                            {"update_mask": ",".join(mask), "allow_missing": "true"})

    def sessions(self, run: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/runs/{_quote(run)}/sessions")["sessions"]

    def session(self, run: str, session: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/runs/{_quote(run)}/sessions/{_quote(session)}")

    # --- targets, captures, continuous profiling, step times -------------------------------------------

    def add_target(self, run: str, name: str, host: str, port: int) -> dict[str, Any]:
        return self.request("POST", f"/v1/runs/{_quote(run)}/targets", {"name": name, "host": host, "port": port})

    def targets(self, run: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/runs/{_quote(run)}/targets")["targets"]

    def capture(self, run: str, **request: Any) -> dict[str, Any]:
        return self.request("POST", f"/v1/runs/{_quote(run)}/captures", {k: v for k, v in request.items() if v is not None})

    def continuous(self, run: str, action: str, **request: Any) -> dict[str, Any]:
        return self.request("POST", f"/v1/runs/{_quote(run)}/continuous:{action}",
                            {k: v for k, v in request.items() if v is not None})

    def report_steps(self, run: str, target: str, points: list[dict[str, Any]]) -> dict[str, Any]:
        return self.request("POST", f"/v1/runs/{_quote(run)}/steps", {"target": target, "points": points})
