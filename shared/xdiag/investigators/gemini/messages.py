"""What xdiag sends Gemini: the versioned prompts, the health snapshot and tool outputs quoted as data (trimmed to
fit), and the follow-up tools' function declarations generated from the tool registry."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from importlib import resources
from string import Template
from typing import Any

from xdiag.idioms import candidates as idiom_candidates
from xdiag.investigators import MAX_FOLLOW_UP_CALLS
from xdiag.investigators.health import HealthSnapshot
from xdiag.investigators.levers import candidates_record
from xdiag.model import ToolResult, ToolStatus
from xdiag.tools import FOLLOW_UP_TOOLS, REGISTRY

PROMPT_VERSION = "v1"


def load_prompt(name: str, version: str = PROMPT_VERSION) -> str:
    """The text of prompts/<name>.<version>.md, with $max_follow_up_calls filled in."""
    text = (resources.files("xdiag.investigators") / "prompts" / f"{name}.{version}.md").read_text(encoding="utf-8")
    return Template(text).safe_substitute(max_follow_up_calls=MAX_FOLLOW_UP_CALLS)


def quote_data(value: Any) -> str:
    """JSON for a <profile_data> block: profile strings cannot close the block or pass for markup."""
    text = json.dumps(value, ensure_ascii=False, indent=1, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def compact(value: Any, max_items: int = 20, max_chars: int = 400) -> Any:
    """A JSON-safe copy with lists cut to `max_items`, strings to `max_chars`, non-finite numbers as None."""
    if isinstance(value, Mapping):
        return {str(k): compact(v, max_items, max_chars) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        head = [compact(v, max_items, max_chars) for v in value[:max_items]]
        return head + ([f"… {len(value) - max_items} more"] if len(value) > max_items else [])
    if isinstance(value, str):
        return value if len(value) <= max_chars else value[:max_chars] + "…"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def fit(value: Any, limit_chars: int) -> Any:
    """`compact` with fewer list items until the JSON fits in `limit_chars` (or the shortest form)."""
    for items in (20, 10, 5, 2):
        shrunk = compact(value, max_items=items, max_chars=400 if items > 5 else 160)
        if len(json.dumps(shrunk, ensure_ascii=False)) <= limit_chars:
            break
    return shrunk


def opening_data(health: HealthSnapshot, results: dict[str, ToolResult]) -> dict[str, Any]:
    """What the model is given first: the health snapshot, each broad tool's status and summary (the program's
    anatomy among them), and the candidate levers the rule engine chooses from (xdiag.investigators.levers), those
    whose premise the profile contradicts marked not_offered."""
    anatomy = results.get("get_program_anatomy")
    compute = health.breakdown_percent.get("compute")
    return compact({
        "health_snapshot": health.as_dict(),
        "candidate_levers": (candidates_record(anatomy.summary, compute) if anatomy is not None and anatomy.ok
                             else []),
        "candidate_idioms": (idiom_candidates(anatomy.summary.get("idioms") or [], _setting(results))
                             if anatomy is not None and anatomy.ok else []),
        "broad_tools": {
            name: {"status": r.status.value, "summary": r.summary, **({"reason": r.reason} if r.reason else {}),
                   "source": r.source}
            for name, r in sorted(results.items())
        },
    }, max_items=30)


def _setting(results: dict[str, ToolResult]) -> dict[str, Any]:
    """The program's platform, vendor and framework, as get_device_information says them: an idiom's change is
    chosen by them."""
    device = results.get("get_device_information")
    return device.summary if device is not None and device.ok else {}


def function_response(result: ToolResult) -> dict[str, Any]:
    """A follow-up result as the model sees it: summary and (trimmed) detail, or the reason it has none."""
    if result.status == ToolStatus.OK:
        return {"status": "ok", "source": result.source, "summary": fit(result.summary, 8_000),
                "detail": fit(result.detail, 24_000)}
    if result.status == ToolStatus.NOT_AVAILABLE:
        return {"status": "not_available", "reason": result.reason}
    return {"error": result.reason or "the tool failed"}


_TYPES = {"string": "STRING", "integer": "INTEGER", "number": "NUMBER", "boolean": "BOOLEAN"}


def function_declarations() -> list[Any]:
    """One FunctionDeclaration per follow-up tool, generated from the registry (name, question, parameters)."""
    from google.genai import types

    declarations = []
    for name in FOLLOW_UP_TOOLS:
        spec = REGISTRY[name]
        parameters = None
        if spec.parameters:
            parameters = types.Schema(
                type="OBJECT",
                properties={
                    arg: types.Schema(type=_TYPES[p.get("type", "string")], description=p.get("description", ""))
                    for arg, p in spec.parameters.items()
                },
                required=[arg for arg, p in spec.parameters.items() if p.get("required")] or None,
            )
        declarations.append(types.FunctionDeclaration(name=name, description=spec.question, parameters=parameters))
    return declarations
