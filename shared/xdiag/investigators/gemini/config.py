"""How to reach Gemini on Vertex AI (`GeminiConfig`), and how a failure to get a usable diagnosis is reported
(`GeminiUnavailable`, whose message goes into the report)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MODEL = "gemini-2.5-flash"
DEFAULT_LOCATION = "us-central1"


@dataclass(frozen=True)
class GeminiConfig:
    """Where and how to reach Gemini on Vertex AI."""

    project: str
    location: str = DEFAULT_LOCATION
    model: str = DEFAULT_MODEL
    base_url: str | None = None  # a private endpoint (or a test server); None: Vertex AI's public endpoint
    timeout_s: float = 60.0  # per request
    max_attempts: int = 3  # per request: 1 + retries on 429/5xx and transport errors
    backoff_s: float = 2.0  # first retry delay; doubles each retry, with jitter
    deadline_s: float = 300.0  # the whole investigation; past it no new request is started
    temperature: float = 0.2

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> GeminiConfig:
        """VERTEX_PROJECT, VERTEX_LOCATION, VERTEX_MODEL, VERTEX_BASE_URL; explicit overrides win when not None."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "project": env.get("VERTEX_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT") or "",
            "location": env.get("VERTEX_LOCATION") or DEFAULT_LOCATION,
            "model": env.get("VERTEX_MODEL") or DEFAULT_MODEL,
            "base_url": env.get("VERTEX_BASE_URL") or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values["project"]:
            raise ValueError(
                "the Gemini investigator needs a Google Cloud project: pass --project or set VERTEX_PROJECT"
            )
        return cls(**values)


class GeminiUnavailable(Exception):
    """Gemini could not give a usable diagnosis; the message says why (it goes into the report)."""


def clip(text: str, n: int = 300) -> str:
    """`text` on one line, cut to `n` characters: for the messages of GeminiUnavailable and the audit."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
