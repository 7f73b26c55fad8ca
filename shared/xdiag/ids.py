"""One grammar for every id the pipeline takes from outside: run, session, analysis, target and tool names.

Checked at every boundary (the CLI, the control plane, every message's fields), so no id can leave its document
or its folder: a name is one path segment of a small alphabet, starting with a letter or digit (so never `.`,
`..` or empty); a run id is up to 16 such segments joined by `/` (a run uploaded under a folder), `~` standing
for `/` where the id must be one segment (a document id, a URL path).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

from xdiag.errors import InvalidRequest

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_NAME = re.compile(_SEGMENT)
_RUN_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}"
_RUN_ID = re.compile(rf"{_RUN_SEGMENT}(?:/{_RUN_SEGMENT}){{0,15}}")


def check_name(value: Any, what: str) -> str:
    """A session, analysis, target or tool name; InvalidRequest (a ValueError) with the reason otherwise."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidRequest(
            f"{what} {_shown(value)} is not valid: 1-128 characters, letters, digits, '.', '_', '-', "
            "starting with a letter or digit"
        )
    return value


def check_run_id(value: Any) -> str:
    if not isinstance(value, str) or not _RUN_ID.fullmatch(value):
        raise InvalidRequest(
            f"run id {_shown(value)} is not valid: 1-16 '/'-separated names of 1-128 letters, digits, '.', '_', "
            "'-', '~' (for '/'), each starting with a letter or digit"
        )
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "…"


RunId = Annotated[str, AfterValidator(check_run_id)]
SessionId = Annotated[str, AfterValidator(lambda v: check_name(v, "session id"))]
AnalysisId = Annotated[str, AfterValidator(lambda v: check_name(v, "analysis id"))]
ToolName = Annotated[str, AfterValidator(lambda v: check_name(v, "tool name"))]
TargetName = Annotated[str, AfterValidator(lambda v: check_name(v, "target name"))]
InvestigatorName = Annotated[str, AfterValidator(lambda v: check_name(v, "investigator"))]
