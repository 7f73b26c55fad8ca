"""The Gemini investigator: Gemini on Vertex AI investigates with function calling over the follow-up tools.

The loop, as the managed service runs it:
1. A healthy snapshot is OPTIMAL without calling the model.
2. Otherwise the health snapshot and the broad tools' summaries go to the model, quoted as data.
3. The model forms hypotheses and calls follow-up tools (declarations generated from the tool registry); each call
   goes through the stage's `call_tool`, which enforces the budget of four, refuses unknown tools and bad arguments;
   refusals go back to the model as errors and are recorded.
4. A last request asks for the diagnosis under a response schema; its findings are checked against the tool
   outputs (numbers that appear in none make a finding unverified; a finding with nothing that checks out is dropped),
   and an answer that calls the session OPTIMAL is refused (the snapshot it was given is not healthy).
5. Any failure (Vertex error, timeout, quota, an unparseable answer) falls back to the rule engine, and the
   diagnosis says why. Cost and audit (model, calls, tokens, latency, tool calls) go into `Diagnosis.audit`.

Credentials are Google's Application Default Credentials; nothing here holds a key. What leaves the project is the
health snapshot, the broad tools' summaries and the follow-up results, never the profile itself.
"""

from __future__ import annotations

import bisect
import importlib
import importlib.util
import json
import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from xdiag.investigators import MAX_FOLLOW_UP_CALLS
from xdiag.investigators.health import HealthSnapshot
from xdiag.investigators.rules import CallTool, RuleEngine
from xdiag.investigators.verdict import claims_optimal
from xdiag.model import (
    Diagnosis,
    Evidence,
    Finding,
    FollowUpCall,
    GroundingCheck,
    InvestigatorAudit,
    ModelCall,
    Status,
    ToolResult,
    ToolStatus,
)
from xdiag.tools import FOLLOW_UP_TOOLS, REGISTRY

PROMPT_VERSION = "v1"
DEFAULT_MODEL = "gemini-2.5-flash"
DEFAULT_LOCATION = "us-central1"
RETRY_STATUS_CODES = frozenset({408, 429, 500, 502, 503, 504})
MAX_INVESTIGATION_TURNS = MAX_FOLLOW_UP_CALLS + 2
"""Model turns with tools before the answer is asked for, whatever the model still wants: bounds the cost."""
FALLBACK_NOTE = "rule engine; Gemini unavailable: "


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


# --- prompts ---------------------------------------------------------------------------------------------------


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
    """What the model is given first: the health snapshot and each broad tool's status and summary."""
    return compact({
        "health_snapshot": health.as_dict(),
        "broad_tools": {
            name: {"status": r.status.value, "summary": r.summary, **({"reason": r.reason} if r.reason else {}),
                   "source": r.source}
            for name, r in sorted(results.items())
        },
    }, max_items=30)


def function_response(result: ToolResult) -> dict[str, Any]:
    """A follow-up result as the model sees it: summary and (trimmed) detail, or the reason it has none."""
    if result.status == ToolStatus.OK:
        return {"status": "ok", "source": result.source, "summary": fit(result.summary, 8_000),
                "detail": fit(result.detail, 24_000)}
    if result.status == ToolStatus.NOT_AVAILABLE:
        return {"status": "not_available", "reason": result.reason}
    return {"error": result.reason or "the tool failed"}


# --- function declarations and the answer schema ---------------------------------------------------------------

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
        raise GeminiUnavailable(f"unparseable answer ({where}: {first.get('msg')}): {_clip(text, 120)!r}") from None


# --- grounding ---------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers_in_text(text: str) -> list[tuple[str, float]]:
    return [(m.group(), float(m.group())) for m in _NUMBER.finditer(text)]


_STANDALONE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def _quoted_numbers(prose: str) -> list[str]:
    """The numbers a sentence quotes (59.6% or 30 ms), not digits inside names (bf16, fusion.1, f32[8,128])."""
    return [m.group() for m in _STANDALONE_NUMBER.finditer(re.sub(r"\w+\[[^\]]*\]", " ", prose))]


def _key(text: str) -> str:
    """A metric or field name as compared: lower case, words joined by `_` (`Step time (ms)` → `step_time_ms`)."""
    return "_".join(re.findall(r"[a-z0-9]+", text.lower()))


class _Numbers:
    """A sorted set of numbers; a token matches one to its own precision (0.93 quotes 0.9298)."""

    def __init__(self) -> None:
        self._found: set[float] = set()
        self._sorted: list[float] | None = None

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._found.add(abs(float(value)))
            self._sorted = None

    def __bool__(self) -> bool:
        return bool(self._found)

    def contains(self, token: str) -> bool:
        if self._sorted is None:
            self._sorted = sorted(self._found)
        x = float(token)
        if "e" in token.lower():
            tolerance = abs(x) * 1e-3
        else:
            decimals = len(token.split(".", 1)[1]) if "." in token else 0
            tolerance = 0.5 * 10 ** -decimals + abs(x) * 1e-9
        i = bisect.bisect_left(self._sorted, x - tolerance)
        return i < len(self._sorted) and self._sorted[i] <= x + tolerance


class ToolNumbers:
    """The numbers each tool's outputs hold, and under which metric: a field's own numbers under its name (at any
    depth), and a row's numbers under each name the row carries (an op's time under the op's name)."""

    def __init__(self, outputs: Mapping[str, list[Any]]):
        self._tool: dict[str, _Numbers] = {}
        self._metric: dict[tuple[str, str], _Numbers] = {}
        self.everything = _Numbers()
        for tool, values in outputs.items():
            for value in values:
                self._walk(tool, value, ())

    def _numbers(self, tool: str, metric: str) -> _Numbers:
        return self._metric.setdefault((tool, metric), _Numbers())

    def _walk(self, tool: str, value: Any, names: tuple[str, ...]) -> list[float]:
        """Indexes `value` reached under the field names `names`; returns the numbers it holds."""
        found: list[float] = []
        if isinstance(value, bool) or value is None:
            return found
        if isinstance(value, (int, float)):
            found = [float(value)] if math.isfinite(value) else []
        elif isinstance(value, str):
            found = [n for _, n in _numbers_in_text(value)]
        elif isinstance(value, Mapping):
            labels = [_key(v) for v in value.values() if isinstance(v, str) and 0 < len(v) <= 200]
            row: list[float] = []
            for k, v in value.items():
                row += self._walk(tool, v, (*names[-1:], _key(str(k))))
            for label in labels:  # a row's numbers count under the op (or host, or module) it names
                for number in row:
                    self._numbers(tool, label).add(number)
            found = row
        elif isinstance(value, (list, tuple)):
            for v in value:
                found += self._walk(tool, v, names)
        for number in found:
            self._tool.setdefault(tool, _Numbers()).add(number)
            self.everything.add(number)
            for name in names[-1:]:
                self._numbers(tool, name).add(number)
        return found

    def of_tool(self, tool: str) -> _Numbers:
        return self._tool.get(tool) or _Numbers()

    def of_metric(self, tool: str, metric: str) -> _Numbers | None:
        """The numbers the tool reported under `metric` (a field name, a dotted path's last field, or a row's name);
        None where the tool's output has no such metric."""
        words = metric.split()
        candidates = [_key(metric), *(_key(w) for w in reversed(words)),
                      *(_key(part) for w in reversed(words) for part in reversed(re.split(r"[.\[\]/:]+", w)))]
        for candidate in candidates:
            numbers = self._metric.get((tool, candidate))
            if numbers:
                return numbers
        return None


def _value(text: str) -> Any:
    """The model writes values as strings; numbers go into the evidence as numbers."""
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return int(number) if re.fullmatch(r"[-+]?\d+", text.strip()) else number


def ground(
    answer: GeminiAnswer, tools_with_output: set[str], numbers: ToolNumbers
) -> tuple[list[Finding], list[GroundingCheck]]:
    """The answer checked against the tool outputs, metric by metric: each evidence value must be a number the
    cited tool reported under the cited metric (its note's numbers, somewhere in that tool's output); the numbers
    in a finding's title must come from the tools it cites, and those in the summary from some tool. What did not
    check out is recorded, with what was done: unverified, or dropped where no evidence row held."""
    findings, checks = [], []
    for f in answer.findings:
        evidence, reasons = [], []
        for e in f.evidence:
            problems = []
            if e.tool not in tools_with_output:
                problems.append(f"cites {e.tool!r}, which gave no output in this analysis")
            else:
                under_metric = numbers.of_metric(e.tool, e.metric)
                values = [tok for tok, _ in _numbers_in_text(f"{e.value}")]
                if values and under_metric is None:
                    problems.append(f"{e.tool} reported no metric {e.metric!r}")
                elif under_metric is not None:
                    wrong = [tok for tok in values if not under_metric.contains(tok)]
                    if wrong:
                        problems.append(f"{e.tool} {e.metric}: {', '.join(dict.fromkeys(wrong))} is not what "
                                        f"{e.tool} reported as {e.metric!r}")
                in_tool = numbers.of_tool(e.tool)
                stray = [tok for tok, _ in _numbers_in_text(e.note) if not in_tool.contains(tok)]
                if stray:
                    problems.append(f"{e.tool} {e.metric} note: {', '.join(dict.fromkeys(stray))} appear(s) in no "
                                    f"output of {e.tool}")
            reasons += problems
            evidence.append(Evidence(tool=e.tool, metric=e.metric, value=_value(e.value), note=e.note,
                                     verified=not problems))
        verified_rows = sum(e.verified for e in evidence)
        if not evidence or not verified_rows:
            checks.append(GroundingCheck(finding=f.title, action="dropped",
                                         reasons=reasons or ["no evidence quoted from a tool output"]))
            continue
        cited = {e.tool for e in f.evidence if e.tool in tools_with_output}
        in_title = [tok for tok in _quoted_numbers(f.title)
                    if not any(numbers.of_tool(tool).contains(tok) for tool in cited)]
        if in_title:
            reasons.append(f"title: {', '.join(dict.fromkeys(in_title))} appear(s) in none of the cited tools' "
                           f"outputs ({', '.join(sorted(cited))})")
        if reasons:
            checks.append(GroundingCheck(finding=f.title, action="unverified", reasons=reasons))
        findings.append(Finding(priority=f.priority, key=f.key, title=f.title, whats_happening=f.whats_happening,
                                evidence=evidence, expected_impact=f.expected_impact, fix=f.fix,
                                verified=not reasons))
    in_summary = [tok for tok in _quoted_numbers(answer.summary) if not numbers.everything.contains(tok)]
    if in_summary:
        checks.append(GroundingCheck(finding="summary", action="unverified",
                                     reasons=[f"summary: {', '.join(dict.fromkeys(in_summary))} appear(s) in no tool "
                                              "output"]))
    findings.sort(key=lambda x: x.priority)  # stable: the model's order within a priority
    return findings, checks


# --- the investigator --------------------------------------------------------------------------------------------


def _clip(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection and timeout errors (google-genai uses httpx2, older releases httpx)."""
    found = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _int_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """JSON numbers may arrive as 5.0 for an integer parameter: make them ints (validation stays the stage's)."""
    params = REGISTRY[name].parameters if name in REGISTRY else {}
    return {
        k: int(v) if params.get(k, {}).get("type") == "integer" and isinstance(v, float) and v.is_integer() else v
        for k, v in args.items()
    }


@dataclass
class _Conversation:
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
                          else f"Vertex AI error {exc.code} {exc.status or ''}".rstrip()) + f": {_clip(exc.message or exc, 200)}"
            except self.transport_errors as exc:
                timeout = "Timeout" in type(exc).__name__
                call.error = type(exc).__name__
                retry = True
                reason = (f"timeout after {self.config.timeout_s:g} s" if timeout
                          else f"cannot reach Vertex AI ({type(exc).__name__}: {_clip(exc, 160)})")
            except ValueError as exc:  # a body that is not a generateContent response (JSON or schema)
                call.error = type(exc).__name__
                retry = False
                reason = f"unparseable response from Vertex AI ({type(exc).__name__}: {_clip(exc, 160)})"
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


def _candidate_content(response: Any) -> Any:
    candidates = getattr(response, "candidates", None) or []
    content = candidates[0].content if candidates else None
    if content is None or not content.parts:
        finish = getattr(candidates[0], "finish_reason", None) if candidates else None
        blocked = getattr(getattr(response, "prompt_feedback", None), "block_reason", None)
        raise GeminiUnavailable(f"unparseable answer: no content (finish reason {finish or blocked or 'none'})")
    return content


def _text(content: Any) -> str:
    return "".join(p.text for p in content.parts if p.text and not p.thought)


class GeminiInvestigator:
    """Gemini on Vertex AI behind the investigator interface; falls back to the rule engine when it fails."""

    name = "gemini"

    def __init__(self, config: GeminiConfig, credentials: Any = None, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self._credentials = credentials  # None: Application Default Credentials
        self._sleep = sleep

    def _client(self) -> Any:
        from google import genai
        from google.genai import types

        http = types.HttpOptions(api_version="v1", timeout=int(self.config.timeout_s * 1000),
                                 **({"base_url": self.config.base_url} if self.config.base_url else {}))
        return genai.Client(vertexai=True, project=self.config.project, location=self.config.location,
                            credentials=self._credentials, http_options=http)

    def investigate(self, health: HealthSnapshot, results: dict[str, ToolResult], call_tool: CallTool) -> Diagnosis:
        if health.healthy:
            diagnosis = RuleEngine().investigate(health, results, call_tool)
            diagnosis.investigator = self.name
            diagnosis.investigator_note = "the health snapshot is clean: OPTIMAL without calling the model"
            return diagnosis
        audit = InvestigatorAudit(model=self.config.model, location=self.config.location,
                                  prompt_version=PROMPT_VERSION)
        made: list[FollowUpCall] = []
        try:
            return self._investigate(health, results, call_tool, audit, made)
        except Exception as exc:  # any failure of the model path: the analysis still gets a diagnosis
            reason = str(exc) if isinstance(exc, GeminiUnavailable) else f"{type(exc).__name__}: {_clip(exc, 200)}"
            audit.fallback_reason = reason
            diagnosis = RuleEngine().investigate(health, results, call_tool)
            diagnosis.follow_up_calls[:0] = made  # Gemini's calls spent part of the same budget
            diagnosis.investigator_note = FALLBACK_NOTE + reason
            diagnosis.audit = audit
            return diagnosis

    def _investigate(self, health: HealthSnapshot, results: dict[str, ToolResult], call_tool: CallTool,
                     audit: InvestigatorAudit, made: list[FollowUpCall]) -> Diagnosis:
        from google.genai import types

        try:
            client = self._client()
        except Exception as exc:  # no ADC, no project: say so
            raise GeminiUnavailable(f"cannot create the Vertex AI client ({type(exc).__name__}: {_clip(exc, 200)})") from None
        chat = _Conversation(client, self.config, audit, time.monotonic(), self._sleep)
        system = load_prompt("system")
        opening = Template(load_prompt("investigate")).safe_substitute(profile_data=quote_data(opening_data(health, results)))
        contents = [types.Content(role="user", parts=[types.Part(text=opening)])]
        with_tools = types.GenerateContentConfig(
            system_instruction=system,
            tools=[types.Tool(function_declarations=function_declarations())],
            tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="AUTO")),
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
            temperature=self.config.temperature,
        )
        outputs: dict[str, list[Any]] = {"health_snapshot": [health.as_dict()]}
        for name, r in results.items():
            outputs.setdefault(name, []).append(r.model_dump(mode="json", include={"summary", "detail", "reason"}))
        cited = {name for name, r in results.items() if r.status != ToolStatus.FAILED}
        for _ in range(MAX_INVESTIGATION_TURNS):
            content = _candidate_content(chat.generate(contents, with_tools, "investigate"))
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                break
            thinking = _clip(_text(content), 200)
            replies = []
            for fc in calls:
                name, args = fc.name or "", _int_args(fc.name or "", dict(fc.args or {}))
                result = call_tool(name, args, thinking)
                if result is None:
                    reason = f"refused: the limit of {MAX_FOLLOW_UP_CALLS} follow-up calls is reached; give your conclusion"
                    audit.tool_calls.append(FollowUpCall(tool=name, args=args, hypothesis=thinking,
                                                         status=ToolStatus.FAILED, reason=reason))
                    payload: dict[str, Any] = {"error": reason}
                else:
                    record = FollowUpCall(tool=name, args=args, hypothesis=thinking, status=result.status,
                                          reason=result.reason)
                    audit.tool_calls.append(record)
                    if not (result.reason or "").startswith("refused"):
                        made.append(record)
                        outputs.setdefault(name, []).append(
                            result.model_dump(mode="json", include={"summary", "detail", "reason"}))
                        if result.status != ToolStatus.FAILED:
                            cited.add(name)
                    payload = function_response(result)
                replies.append(types.Part(function_response=types.FunctionResponse(id=fc.id, name=name, response=payload)))
            contents.append(types.Content(role="user", parts=replies))
        ask = types.Part(text=load_prompt("answer"))
        if contents[-1].role == "user":
            contents[-1].parts.append(ask)
        else:
            contents.append(types.Content(role="user", parts=[ask]))
        answer_config = types.GenerateContentConfig(
            system_instruction=system,
            response_mime_type="application/json",
            response_schema=GeminiAnswer,
            temperature=self.config.temperature,
        )
        answer = parse_answer(_text(_candidate_content(chat.generate(contents, answer_config, "answer"))))
        if claims_optimal(answer.summary):
            # Only a healthy snapshot is OPTIMAL, and that one never reaches the model.
            raise GeminiUnavailable("its answer calls the session OPTIMAL or healthy, but the health snapshot is not: "
                                    + "; ".join(health.unhealthy_because or []))
        findings, checks = ground(answer, cited, ToolNumbers(outputs))
        audit.grounding = checks
        if not findings:
            raise GeminiUnavailable(
                f"none of its {len(answer.findings)} finding(s) cited evidence found in the tool outputs"
                if answer.findings else "its answer had no findings for an unhealthy profile")
        unverified = sum(not f.verified for f in findings)
        dropped = sum(c.action == "dropped" for c in checks)
        summary_unverified = any(c.finding == "summary" for c in checks)
        note = f"{self.config.model} on Vertex AI ({self.config.location}), prompts {PROMPT_VERSION}"
        if unverified or dropped:
            note += f"; grounding: {unverified} finding(s) unverified, {dropped} dropped"
        if summary_unverified:
            note += "; the summary quotes numbers no tool reported"
        return Diagnosis(
            status=Status.NEEDS_ATTENTION,
            summary=answer.summary,
            findings=findings,
            hypotheses=answer.hypotheses,
            follow_up_calls=list(made),
            investigator=self.name,
            investigator_note=note,
            audit=audit,
        )


def gemini_factory(config: GeminiConfig, credentials: Any = None) -> Callable[[], GeminiInvestigator]:
    """For `Dependencies.investigators["gemini"]`; ValueError when google-genai is not installed."""
    try:
        installed = importlib.util.find_spec("google.genai") is not None
    except ModuleNotFoundError:  # no `google` namespace package at all
        installed = False
    if not installed:
        raise ValueError("the Gemini investigator needs google-genai: pip install 'xdiag[gemini]'")
    return lambda: GeminiInvestigator(config, credentials=credentials)


def investigators_from_env(env: Mapping[str, str] | None = None) -> dict[str, Callable[[], Any]]:
    """{"gemini": factory} when VERTEX_PROJECT (or XDIAG_INVESTIGATOR=gemini) configures it; else {}.

    Raises ValueError when XDIAG_INVESTIGATOR=gemini but no project is set.
    """
    env = os.environ if env is None else env
    wanted = env.get("XDIAG_INVESTIGATOR", "").strip().lower() == "gemini"
    if not wanted and not env.get("VERTEX_PROJECT"):
        return {}
    return {"gemini": gemini_factory(GeminiConfig.from_env(env))}
