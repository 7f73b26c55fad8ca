"""A scripted stand-in for Vertex AI's `generateContent` REST endpoint, for tests only.

It is NOT Vertex AI and no model runs here: it is a small HTTP server on 127.0.0.1 that answers
`POST /v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent`
with the responses a test scripted, in order, in the JSON shape Vertex AI uses (candidates, content parts with
`text` or `functionCall`, `usageMetadata`), and records every request it received so the test can assert on what
xdiag sent. xdiag talks to it through the real google-genai client (`HttpOptions(base_url=…)`), with a static
test token as credentials. No real Vertex AI can be reached from the machines these tests run on.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.oauth2.credentials import Credentials

TEST_TOKEN = "xdiag-test-token"
PATH = re.compile(r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
                  r"/publishers/google/models/(?P<model>[^/:]+):generateContent$")


def static_credentials() -> Credentials:
    """A static bearer token: what the fake server accepts (it is no real Google credential)."""
    return Credentials(token=TEST_TOKEN)


@dataclass
class Reply:
    """A scripted HTTP reply: status, body (JSON-able, or raw bytes for garbage) and an optional delay."""

    status: int = 200
    body: Any = None
    delay_s: float = 0.0


def usage(prompt: int = 1000, output: int = 100, thoughts: int = 0) -> dict[str, int]:
    return {"promptTokenCount": prompt, "candidatesTokenCount": output, "thoughtsTokenCount": thoughts,
            "totalTokenCount": prompt + output + thoughts}


def _response(parts: list[dict[str, Any]], tokens: dict[str, int] | None = None) -> Reply:
    return Reply(body={
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
        "usageMetadata": tokens or usage(),
        "modelVersion": "scripted-stand-in",
    })


def calls(*calls: tuple[str, dict[str, Any]], text: str = "", tokens: dict[str, int] | None = None) -> Reply:
    """A model turn that calls these functions (name, args), optionally after some text."""
    parts = ([{"text": text}] if text else []) + [{"functionCall": {"name": n, "args": a}} for n, a in calls]
    return _response(parts, tokens)


def text(content: str, tokens: dict[str, int] | None = None) -> Reply:
    """A model turn with text only (the end of the tool-calling phase, or a raw answer)."""
    return _response([{"text": content}], tokens)


def answer(summary: str, findings: list[dict[str, Any]], hypotheses: list[str] | None = None,
           tokens: dict[str, int] | None = None) -> Reply:
    """The structured diagnosis, as the response schema asks for it."""
    body = {"summary": summary, "hypotheses": hypotheses or [], "findings": findings}
    return text(json.dumps(body), tokens)


def error(status: int, reason: str, message: str) -> Reply:
    """A Google API error body, e.g. 429 RESOURCE_EXHAUSTED."""
    return Reply(status=status, body={"error": {"code": status, "status": reason, "message": message}})


Step = Reply | Callable[[dict[str, Any]], Reply]


@dataclass
class Request:
    project: str
    location: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]

    def texts(self) -> list[str]:
        """Every text part of the conversation sent, in order."""
        return [p["text"] for c in self.body.get("contents", []) for p in c.get("parts", []) if "text" in p]

    def function_responses(self) -> list[dict[str, Any]]:
        return [p["functionResponse"] for c in self.body.get("contents", []) for p in c.get("parts", [])
                if "functionResponse" in p]

    def declared_functions(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for t in self.body.get("tools", []) for d in t.get("functionDeclarations", [])}

    @property
    def system_instruction(self) -> str:
        return "".join(p.get("text", "") for p in self.body.get("systemInstruction", {}).get("parts", []))


@dataclass
class FakeVertex:
    """The stand-in server: `script` is consumed one step per request (a step may be a function of the request)."""

    script: list[Step]
    requests: list[Request] = field(default_factory=list)
    unscripted: int = 0  # requests that arrived after the script ran out (answered 500)

    def __post_init__(self) -> None:
        fake = self
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                match = PATH.match(self.path)
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if not match:
                    return self._send(error(404, "NOT_FOUND", f"no such method: {self.path}"))
                if self.headers.get("authorization") != f"Bearer {TEST_TOKEN}":
                    return self._send(error(401, "UNAUTHENTICATED", "missing or wrong bearer token"))
                body = json.loads(raw or b"{}")
                with lock:
                    fake.requests.append(Request(**match.groupdict(), headers=dict(self.headers), body=body))
                    step = fake.script.pop(0) if fake.script else None
                    if step is None:
                        fake.unscripted += 1
                if step is None:
                    return self._send(error(500, "INTERNAL", "the test's script has no step for this request"))
                self._send(step(body) if callable(step) else step)

            def _send(self, reply: Reply) -> None:
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json; charset=UTF-8")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> FakeVertex:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
