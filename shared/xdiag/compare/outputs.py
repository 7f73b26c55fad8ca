"""An analysed session's outputs, read back from where the analysis wrote them (a local folder or the bucket):
`analysis.json` and every `tools/*.json` beside it, each checked against the model it was written from."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from xdiag.compare.sessions import SessionDiff, SessionOutputs, compare_sessions
from xdiag.errors import XdiagError
from xdiag.model import Analysis, ToolResult

ANALYSIS_FILE = "analysis.json"


class NotAnAnalysis(XdiagError, ValueError):
    """A folder that holds no analysis, or a file of one that is not what the analysis wrote (cut short, edited):
    the message names the file."""


def _read(blobs, uri: str, model: type[BaseModel]) -> dict[str, Any]:
    """The JSON object a file holds, checked against `model` (the file's own shape); NotAnAnalysis naming it."""
    try:
        data = json.loads(blobs.get(uri))
        model.model_validate(data)
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"]) or "its top"
        raise NotAnAnalysis(f"{uri}: not an analysis output ({where}: {exc.errors()[0]['msg']})") from None
    except (ValueError, UnicodeDecodeError) as exc:  # cut short, not JSON
        raise NotAnAnalysis(f"{uri}: not an analysis output (not JSON: {type(exc).__name__})") from None
    except IsADirectoryError:
        raise NotAnAnalysis(f"{uri}: a folder where the analysis writes a file") from None
    return data


def load_outputs(blobs, output_uri: str, label: str) -> SessionOutputs:
    """`output_uri` is the folder holding analysis.json (`…/<session>/xdiag` in a bucket, `--out` locally)."""
    base = output_uri.rstrip("/")
    try:
        analysis = _read(blobs, f"{base}/{ANALYSIS_FILE}", Analysis)
    except FileNotFoundError:
        raise NotAnAnalysis(f"{label}: no {ANALYSIS_FILE} in {base} (is it an analysed session?)") from None
    tools = {}
    # Tool outputs sit in tools/ beside analysis.json, or under the analysis' own folder (its work_uri) where the
    # session's current analysis.json is a copy of it; never in the folder it was first written to (its output_uri):
    # a folder copied or moved since holds its own, and that one may hold another analysis now.
    own = (analysis.get("work_uri") or base).rstrip("/")
    for folder in dict.fromkeys((f"{base}/tools/", f"{own}/tools/")):
        for info in blobs.list(folder):
            name = info.uri[len(folder):]
            if "/" in name or not name.endswith(".json"):
                continue
            try:
                tools.setdefault(name.removesuffix(".json"), _read(blobs, info.uri, ToolResult))
            except FileNotFoundError:  # gone since it was listed (another analysis replacing its own)
                continue
    return SessionOutputs(label=label, analysis=analysis, tools=tools)


@dataclass(frozen=True)
class Listed:
    uri: str


class LocalFolder:
    """An analysis folder on this machine, read as `load_outputs` reads a store: each file opened where reads are
    bounded (`xdiag mcp --allow`) only inside the bounds and never through a link out (xdiag.profile.confined)."""

    def get(self, uri: str) -> bytes:
        from xdiag.profile import confined

        return confined.read_bytes(uri)

    def list(self, prefix: str) -> list[Listed]:
        from xdiag.profile import confined

        folder = Path(prefix)
        try:
            entries = sorted(os.scandir(confined.resolved(folder)), key=lambda entry: entry.name)
        except (FileNotFoundError, NotADirectoryError, confined.OutsideRoots):  # a folder out of bounds lists nothing
            return []
        return [Listed(str(folder / entry.name)) for entry in entries if entry.is_file(follow_symlinks=False)]


def load_folder(folder: Path, label: str) -> SessionOutputs:
    """The outputs of the analysis in a local folder (`xdiag analyze --out`, `analyze`'s folder)."""
    return load_outputs(LocalFolder(), str(folder.absolute()), label)


_MISSHAPEN = (TypeError, AttributeError, KeyError, ValueError, IndexError)
"""What reading a field of another shape than xdiag writes raises (a list where a table was, text where a number)."""


def compare_outputs(before: SessionOutputs, after: SessionOutputs, top: int = 15) -> SessionDiff:
    """`compare_sessions` of two analyses read back; NotAnAnalysis naming the side whose outputs are not of the
    shape xdiag writes (an edited or damaged file that still parses): each side is compared with itself to tell."""
    try:
        return compare_sessions(before, after, top=top)
    except _MISSHAPEN as exc:
        for side in (before, after):
            try:
                compare_sessions(side, side, top=top)
            except _MISSHAPEN:
                raise NotAnAnalysis(f"{side.label}: an output of its analysis is not what xdiag writes "
                                    f"({type(exc).__name__}: {exc}); analyse the profile again") from None
        raise
