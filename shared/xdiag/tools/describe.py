"""What a tool takes and returns, read from the registry: `xdiag tool NAME --help`, `xdiag tools --json` and the MCP
server's schemas all come from here.

A tool's question and argument specs are its registration (`registry.tool`); each argument's default is its
function's; what it returns is its docstring, `summary: <fields>. detail: <what>.`, as every tool writes it. The
fields are the names in the summary part: words with an underscore, `a_{b,c}` (a_b and a_c), `<part>_percent` and
`xprof_*` (any name of that form), `a/b_c` (a_c and b_c), and bare words listed on their own between commas;
`summary/detail: as OTHER_TOOL, …` takes the other tool's fields.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

from xdiag.tools.registry import REGISTRY, ToolSpec

_NAME = r"(?:[a-z<]|\{[a-z0-9_,]+\})[a-z0-9_<>*]*(?:\{[a-z0-9_,]+\}[a-z0-9_<>*]*)*"
_FIELD = re.compile(rf"(?<![\w.'/{{<*-])({_NAME}(?:/{_NAME})?)(?!['\w(])")
_SEPARATORS = re.compile(r"[,;]\s*|\.\s+|:\s+")
_BARE = re.compile(r"^([a-z][a-z0-9]*)[.\s]*$")


@dataclass(frozen=True)
class Returns:
    summary: str  # the docstring's summary part, as written
    detail: str  # its detail part ("" where it has none)
    fields: tuple[str, ...]  # the summary's field names, as patterns (see the module's docstring)


def returns(spec: ToolSpec) -> Returns:
    """What the tool's summary and detail hold, from its docstring."""
    doc = " ".join((inspect.getdoc(spec.func) or "").split())
    match = re.match(r"summary(?:/detail)?:\s*(.*?)(?:\s*\bdetail:\s*(.*))?$", doc)
    if match is None:
        return Returns("", "", ())
    summary, detail = match.group(1).strip(), (match.group(2) or "").strip()
    same_as = re.match(r"as (\w+)\b", summary)  # "summary/detail: as aggregate_xplane_events, …"
    if same_as and same_as.group(1) in REGISTRY:
        return Returns(summary, detail, returns(REGISTRY[same_as.group(1)]).fields)
    return Returns(summary, detail, _fields(summary))


def _fields(summary: str) -> tuple[str, ...]:
    found: list[tuple[int, str]] = []
    for match in _FIELD.finditer(summary):
        if any(mark in match.group(1) for mark in "_{<*") and match.group(1) not in REGISTRY:  # a tool named in prose
            found += [(match.start(), name) for name in _alternatives(match.group(1))]
    depth, top = 0, []
    for ch in summary:  # the summary outside parentheses: its list items
        depth += ch in "([{"
        top.append(ch if depth == 0 else " ")
        depth -= ch in ")]}"
    text = "".join(top)
    separators = list(_SEPARATORS.finditer(text))
    starts, ends = [0, *(m.end() for m in separators)], [*(m.start() for m in separators), len(text)]
    for start, end in zip(starts, ends):
        bare = _BARE.match(text[start:end].strip())
        if bare:
            found.append((start, bare.group(1)))
    return tuple(dict.fromkeys(name for _, name in sorted(found)))


def _alternatives(token: str) -> list[str]:
    """`a/b_c` → a_c, b_c; `a_x/y` → a_x, a_y; else the token."""
    if "/" not in token:
        return [token]
    head, tail = token.split("/", 1)
    if "_" in tail and "_" not in head:
        return [head + tail[tail.index("_"):], tail]
    if "_" in head and "_" not in tail:
        return [head, head[: head.rindex("_") + 1] + tail]
    return [head, tail]


def field_patterns(fields: tuple[str, ...]) -> list[re.Pattern[str]]:
    """Each documented field as a pattern a returned key must match: braces expanded, `<part>` and `*` any name."""
    patterns = []
    for field in fields:
        for name in _expanded(field):
            parts = re.split(r"(<[^>]*>|\*)", name)
            patterns.append(re.compile("".join(".+" if i % 2 else re.escape(p) for i, p in enumerate(parts)) + "$"))
    return patterns


def _expanded(field: str) -> list[str]:
    braces = re.search(r"\{([^}]*)\}", field)
    if braces is None:
        return [field]
    return [name for alt in braces.group(1).split(",")
            for name in _expanded(field[: braces.start()] + alt + field[braces.end():])]


def arguments(spec: ToolSpec) -> dict[str, dict[str, Any]]:
    """Each argument: type, description, required, default (the function's), and its limits where it has them."""
    signature = inspect.signature(spec.func).parameters
    described = {}
    for arg, param in spec.parameters.items():
        default = signature[arg].default if arg in signature else param.get("default", inspect.Parameter.empty)
        described[arg] = {
            "type": param.get("type", "string"),
            "description": param.get("description", ""),
            "required": bool(param.get("required")),
            **({"default": default} if default is not inspect.Parameter.empty else {}),
            **{key: param[key] for key in ("minimum", "maximum", "enum", "format", "max_length") if key in param},
        }
    return described


def input_schema(spec: ToolSpec, extra: dict[str, dict[str, Any]] | None = None,
                 extra_required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON Schema of the tool's arguments (with `extra` properties first, e.g. the profile's path)."""
    properties: dict[str, Any] = dict(extra or {})
    for arg, described in arguments(spec).items():
        schema: dict[str, Any] = {"type": described["type"]}
        if described["description"]:  # an argument its name and bounds say (MCP's max_rows, offset): none
            schema["description"] = described["description"]
        for key, json_key in (("minimum", "minimum"), ("maximum", "maximum"), ("enum", "enum"),
                              ("max_length", "maxLength"), ("default", "default")):
            if key in described and described[key] is not None:
                schema[json_key] = described[key]
        if described.get("format") == "re2":
            schema["description"] += " (a regular expression, RE2 syntax)"
        properties[arg] = schema
    required = [*extra_required, *(arg for arg, p in spec.parameters.items() if p.get("required"))]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def describe(spec: ToolSpec) -> dict[str, Any]:
    """The tool as `xdiag tools --json` lists it."""
    said = returns(spec)
    return {
        "name": spec.name,
        "question": spec.question,
        "broad": spec.broad,
        "follow_up": spec.follow_up,
        "arguments": arguments(spec),
        "returns": {"summary": said.summary, "detail": said.detail, "summary_fields": list(said.fields)},
    }


def describe_all() -> list[dict[str, Any]]:
    """Every registered tool: the broad ones in the report's order, then the others by name."""
    from xdiag import tools as _  # noqa: F401  (importing the package registers every tool)
    from xdiag.tools.registry import BROAD_TOOLS

    order = [*BROAD_TOOLS, *sorted(set(REGISTRY) - set(BROAD_TOOLS))]
    return [describe(REGISTRY[name]) for name in order]


def help_text(spec: ToolSpec) -> str:
    """`xdiag tool NAME --help`: the question, the arguments, the fields the summary returns and the detail."""
    said = returns(spec)
    kind = " and ".join(k for k, on in (("broad", spec.broad), ("follow-up", spec.follow_up)) if on) or "on demand"
    lines = [f"xdiag tool {spec.name} PATH [--arg KEY=VALUE ...] [--session NAME] [--no-cache]", "",
             spec.question, f"({kind} tool)", "", "Arguments:"]
    described = arguments(spec)
    for arg, d in described.items():
        limits = [f"default {d['default']!r}" if d.get("default") is not None else "",
                  "required" if d["required"] else "optional",
                  f"{d.get('minimum')}–{d.get('maximum')}" if "minimum" in d or "maximum" in d else "",
                  f"one of {', '.join(map(str, d['enum']))}" if "enum" in d else "",
                  "RE2 regular expression" if d.get("format") == "re2" else ""]
        lines.append(f"  --arg {arg}=<{d['type']}>  {d['description']} [{'; '.join(x for x in limits if x)}]")
    if not described:
        lines.append("  (none)")
    lines += ["", "Summary fields:", *(f"  {field}" for field in said.fields), "",
              "Summary:", f"  {said.summary}", "", "Detail:", f"  {said.detail or '(none)'}", "",
              "Output: JSON on stdout (tool, status ok | not_available | failed, reason, summary, detail, source, "
              "args, duration_ms); status 2 for bad input, 1 for a failed tool."]
    return "\n".join(lines)


def parse_cli_args(spec: ToolSpec, items: list[str]) -> dict[str, Any]:
    """`key=value` strings from the command line as the tool's typed arguments, validated as an investigator's call
    is (registry.validate_args); ValueError with the reason."""
    from xdiag.tools.registry import validate_args

    args: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--arg {item!r}: expected key=value")
        kind = spec.parameters.get(key, {}).get("type", "string")
        try:
            args[key] = _typed(kind, text)
        except ValueError:
            raise ValueError(f"--arg {key}: {text!r} is not a{'n' if kind == 'integer' else ''} {kind}") from None
    return validate_args(spec, args)


def _typed(kind: str, text: str) -> Any:
    if kind == "integer":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "boolean":
        lowered = text.strip().lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(text)
        return lowered in ("true", "1", "yes")
    return text


def markdown() -> str:
    """docs/reference/tools.md: every registered tool, its question, arguments and fields, from the registry alone
    (`python -m xdiag.tools.describe --markdown > docs/reference/tools.md`; tests/test_docs.py keeps it current)."""
    from xdiag import tools as _  # noqa: F401  (importing the package registers every tool)

    lines = ["# Tools", "",
             "Generated from the tool registry by `python -m xdiag.tools.describe --markdown`; do not edit by hand.",
             "`xdiag tools --json`, `xdiag tool NAME --help` and the MCP server's schemas read the same source.", "",
             "| tool | kind | arguments |", "| --- | --- | --- |"]
    described = describe_all()
    for tool_ in described:
        kind = " and ".join(k for k, on in (("broad", tool_["broad"]), ("follow-up", tool_["follow_up"])) if on)
        args = ", ".join(f"`{arg}`" for arg in tool_["arguments"]) or "none"
        lines.append(f"| [`{tool_['name']}`](#{tool_['name']}) | {kind or 'on demand'} | {args} |")
    for tool_ in described:
        module = REGISTRY[tool_["name"]].func.__module__
        lines += ["", f"## {tool_['name']}", "", tool_["question"], "", f"Module: `{module}`.", ""]
        if tool_["arguments"]:
            lines += ["| argument | type | default | limits | description |", "| --- | --- | --- | --- | --- |"]
            for arg, d in tool_["arguments"].items():
                limits = "; ".join(x for x in (
                    f"{d.get('minimum')}–{d.get('maximum')}" if "minimum" in d or "maximum" in d else "",
                    f"one of {', '.join(map(str, d['enum']))}" if "enum" in d else "",
                    "RE2 regular expression" if d.get("format") == "re2" else "",
                    f"at most {d['max_length']} characters" if "max_length" in d else "",
                    "required" if d["required"] else "") if x)
                default = f"`{d['default']!r}`" if d.get("default") is not None else ""
                lines.append(f"| `{arg}` | {d['type']} | {default} | {limits} | {d['description']} |")
            lines.append("")
        fields = tool_["returns"]["summary_fields"]
        lines += [f"**Summary fields:** {', '.join(f'`{f}`' for f in fields) or '(none named)'}", "",
                  f"**Summary:** {tool_['returns']['summary'] or '(not documented)'}", "",
                  f"**Detail:** {tool_['returns']['detail'] or '(none)'}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m xdiag.tools.describe --markdown")
    sys.stdout.write(markdown())
