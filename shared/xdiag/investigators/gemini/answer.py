"""The diagnosis Gemini must answer with: the response schema (`GeminiAnswer`) and parsing the answer's text."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from xdiag.investigators.gemini.config import GeminiUnavailable, clip


class AnswerEvidence(BaseModel):
    tool: str = Field(description="the tool whose output holds the value, e.g. get_step_trace")
    metric: str = Field(description="the field or op quoted, as named in that tool's output")
    value: str = Field(description="the value exactly as the tool reported it")
    note: str = Field(description="units or context; may be empty")


class AnswerFinding(BaseModel):
    priority: Literal["P0", "P1", "P2"]
    key: str = Field(description="snake_case kind of problem, e.g. layout_copies, input_bound, host_sync")
    title: str
    whats_happening: str = Field(description="what happens, naming the ops, shapes and layouts involved")
    evidence: list[AnswerEvidence]
    expected_impact: str = Field(description="how much step time or memory the fix can win")
    fix: str = Field(description="the framework, sharding or compiler change to make")


class GeminiAnswer(BaseModel):
    """The diagnosis Gemini returns under the response schema."""

    summary: str = Field(description="3 to 5 sentences: verdict, main cause with its share of step time, first step")
    hypotheses: list[str]
    findings: list[AnswerFinding]


def parse_answer(text: str) -> GeminiAnswer:
    """The answer's JSON (a ```json fence is tolerated); GeminiUnavailable when it is not the schema's."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        return GeminiAnswer.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "answer"
        raise GeminiUnavailable(f"unparseable answer ({where}: {first.get('msg')}): {clip(text, 120)!r}") from None
