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

The investigator and its factories are here; the parts it runs are modules beside it: `config` (where to reach
Vertex AI, GeminiUnavailable), `messages` (prompts, data and tool declarations sent), `conversation` (requests with
retries and accounting), `answer` (the response schema) and `grounding` (the answer checked against tool outputs).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Mapping
from string import Template
from typing import Any

from xdiag.investigators import MAX_FOLLOW_UP_CALLS
from xdiag.investigators.gemini.answer import GeminiAnswer, parse_answer
from xdiag.investigators.gemini.config import GeminiConfig, GeminiUnavailable, clip
from xdiag.investigators.gemini.conversation import Conversation, candidate_content, response_text
from xdiag.investigators.gemini.grounding import ToolNumbers, ground
from xdiag.investigators.gemini.messages import (
    PROMPT_VERSION,
    function_declarations,
    function_response,
    load_prompt,
    opening_data,
    quote_data,
)
from xdiag.investigators.health import HealthSnapshot
from xdiag.investigators.rules import CallTool, RuleEngine
from xdiag.investigators.verdict import claims_optimal
from xdiag.model import Diagnosis, FollowUpCall, InvestigatorAudit, Status, ToolResult, ToolStatus
from xdiag.tools import REGISTRY

MAX_INVESTIGATION_TURNS = MAX_FOLLOW_UP_CALLS + 2
"""Model turns with tools before the answer is asked for, whatever the model still wants: bounds the cost."""
FALLBACK_NOTE = "rule engine; Gemini unavailable: "


def _int_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """JSON numbers may arrive as 5.0 for an integer parameter: make them ints (validation stays the stage's)."""
    params = REGISTRY[name].parameters if name in REGISTRY else {}
    return {
        k: int(v) if params.get(k, {}).get("type") == "integer" and isinstance(v, float) and v.is_integer() else v
        for k, v in args.items()
    }


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
            reason = str(exc) if isinstance(exc, GeminiUnavailable) else f"{type(exc).__name__}: {clip(exc, 200)}"
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
            raise GeminiUnavailable(f"cannot create the Vertex AI client ({type(exc).__name__}: {clip(exc, 200)})") from None
        chat = Conversation(client, self.config, audit, time.monotonic(), self._sleep)
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
            content = candidate_content(chat.generate(contents, with_tools, "investigate"))
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                break
            thinking = clip(response_text(content), 200)
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
        answer = parse_answer(response_text(candidate_content(chat.generate(contents, answer_config, "answer"))))
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
