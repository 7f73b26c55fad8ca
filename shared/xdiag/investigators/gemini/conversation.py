"""One investigation's requests to Gemini: bounded retries with backoff on 429/5xx and transport errors, the
investigation's deadline, token and latency accounting into the audit, and reading a response's content."""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from xdiag.investigators.gemini.config import GeminiConfig, GeminiUnavailable, clip
from xdiag.model import InvestigatorAudit, ModelCall

RETRY_STATUS_CODES = frozenset({408, 429, 500, 502, 503, 504})


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection and timeout errors (google-genai uses httpx2, older releases httpx)."""
    found = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


@dataclass
class Conversation:
    """The requests of one investigation, against its deadline, each accounted in its audit."""

    client: Any
    config: GeminiConfig
    audit: InvestigatorAudit
    started: float
    sleep: Callable[[float], None]
    transport_errors: tuple[type[BaseException], ...] = field(default_factory=_transport_errors)

    def generate(self, contents: list[Any], request_config: Any, phase: Literal["investigate", "answer"]) -> Any:
        """One model request with bounded retries and backoff on 429/5xx and transport errors."""
        from google.genai import errors

        for attempt in range(1, self.config.max_attempts + 1):
            if time.monotonic() - self.started > self.config.deadline_s:
                raise GeminiUnavailable(f"the investigation ran past its deadline of {self.config.deadline_s:g} s")
            call = ModelCall(phase=phase, attempt=attempt)
            self.audit.calls.append(call)
            self.audit.model_calls += 1
            self.audit.retries += int(attempt > 1)
            began = time.perf_counter()
            try:
                response = self.client.models.generate_content(
                    model=self.config.model, contents=contents, config=request_config)
            except errors.APIError as exc:
                call.error = f"{exc.code} {exc.status or ''}".strip()
                retry = exc.code in RETRY_STATUS_CODES
                reason = (f"quota exhausted ({exc.code} {exc.status or 'RESOURCE_EXHAUSTED'})" if exc.code == 429
                          else f"Vertex AI error {exc.code} {exc.status or ''}".rstrip()) + f": {clip(exc.message or exc, 200)}"
            except self.transport_errors as exc:
                timeout = "Timeout" in type(exc).__name__
                call.error = type(exc).__name__
                retry = True
                reason = (f"timeout after {self.config.timeout_s:g} s" if timeout
                          else f"cannot reach Vertex AI ({type(exc).__name__}: {clip(exc, 160)})")
            except ValueError as exc:  # a body that is not a generateContent response (JSON or schema)
                call.error = type(exc).__name__
                retry = False
                reason = f"unparseable response from Vertex AI ({type(exc).__name__}: {clip(exc, 160)})"
            else:
                self._account(call, response)
                return response
            finally:
                call.latency_ms = round((time.perf_counter() - began) * 1000, 1)
                self.audit.latency_ms = round(self.audit.latency_ms + call.latency_ms, 1)
            if not retry or attempt == self.config.max_attempts:
                tries = f" ({attempt} attempts)" if attempt > 1 else ""
                raise GeminiUnavailable(reason + tries)
            delay = self.config.backoff_s * 2 ** (attempt - 1)
            self.sleep(delay * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def _account(self, call: ModelCall, response: Any) -> None:
        usage = getattr(response, "usage_metadata", None)
        if usage is None:
            return
        call.prompt_tokens = usage.prompt_token_count or 0
        call.output_tokens = usage.candidates_token_count or 0
        call.thoughts_tokens = usage.thoughts_token_count or 0
        call.total_tokens = usage.total_token_count or (call.prompt_tokens + call.output_tokens + call.thoughts_tokens)
        self.audit.prompt_tokens += call.prompt_tokens
        self.audit.output_tokens += call.output_tokens
        self.audit.thoughts_tokens += call.thoughts_tokens
        self.audit.total_tokens += call.total_tokens


def candidate_content(response: Any) -> Any:
    candidates = getattr(response, "candidates", None) or []
    content = candidates[0].content if candidates else None
    if content is None or not content.parts:
        finish = getattr(candidates[0], "finish_reason", None) if candidates else None
        blocked = getattr(getattr(response, "prompt_feedback", None), "block_reason", None)
        raise GeminiUnavailable(f"unparseable answer: no content (finish reason {finish or blocked or 'none'})")
    return content


def response_text(content: Any) -> str:
    return "".join(p.text for p in content.parts if p.text and not p.thought)
