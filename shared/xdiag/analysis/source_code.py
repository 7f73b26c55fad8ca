"""The user's code as xdiag quotes it: the one reader of the files a profile's Python stacks name (the line view, the
report, the findings, `xdiag lines`, the MCP tools all read through it).

A profile names each file by the path the capture machine recorded, and a profile may be anyone's: what that path
leads to here is read only as follows.
- With a source root (`--source-root DIR`, a tool's `source_root`): the longest suffix of the recorded path that is
  a file under the root (`/home/u/jobs/train.py` -> ROOT/jobs/train.py, else ROOT/train.py), as XProf's
  --src_prefix maps it, and nothing else: a link under the root that leads out of it is not followed, and the
  recorded path itself is not read.
- Without one, the recorded path itself, only in a command a user runs on their own machine (`xdiag analyze`,
  `lines`, `tool`, `mcp`: `allow_recorded_paths`). The pipeline's services (the cloud's and the local stack's) never
  read a path a profile names, which could be any file of the server.
- Where reads are bounded (`xdiag mcp --allow DIR`, the client's roots: xdiag.profile.confined), the root and every
  file are read through those bounds as well: resolved, checked, opened with no link followed.
- Bounded work whatever a profile records: a file is read up to the lines asked for and never past MAX_SOURCE_BYTES,
  each recorded path is looked for once per reader, and only its last MAX_PATH_PARTS parts are matched under a root.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from xdiag.profile import confined

SOURCE_ROOT_ENV = "XDIAG_SOURCE_ROOT"
"""Where `xdiag analyze --source-root DIR` leaves DIR for the analysis it runs (get_line_view's default root)."""
RECORDED_PATHS_ENV = "XDIAG_READ_RECORDED_SOURCE"
"""Set ("1") by the commands a user runs on their own files: the recorded path is read where no source root is
given (allow_recorded_paths)."""
CONTEXT_LINES = 2
"""Lines of code quoted either side of a line."""
MAX_QUOTED_CHARS = 240
MAX_SOURCE_BYTES = 8 * 2**20
"""The most of one file read: a line past it is not quoted (no Python source is that long; a 1 GiB file named
`train.py` costs 8 MiB, not its size)."""
MAX_PATH_PARTS = 64
"""The parts of a recorded path matched under a source root, from its end: deeper paths cost no more."""
MAX_DEF_SEARCH = 1000
"""Lines walked up from a quoted line to the `def` it sits in (other_version): a view of thousands of lines in one
long file costs thousands of these walks, not thousands of walks over the whole file."""
STALE = "is not the version the profile ran"
UNREADABLE = "is not readable on this machine"
"""Every reason a file could not be found or read says this (`xdiag lines` names such files once, at the end)."""


def allow_recorded_paths() -> None:
    """This process (and those it starts) may read a recorded path where no source root is given: for the commands
    a user runs on their own files, never for a service that analyses others' profiles."""
    os.environ[RECORDED_PATHS_ENV] = "1"


def recorded_paths_allowed() -> bool:
    return os.environ.get(RECORDED_PATHS_ENV) == "1"


@dataclass
class _Found:
    """Where a recorded path leads here: `shown` (the name answers give), `real` (the file opened, every link
    resolved) and the folder it is opened from (`bounds`), or `why` not."""

    shown: Path | None = None
    real: Path | None = None
    bounds: tuple[Path, ...] | None = None
    why: str = ""


@dataclass
class _Text:
    """The lines of a file read so far: all of them where `complete`, else a prefix (`capped`: the byte bound)."""

    lines: list[str] = field(default_factory=list)
    complete: bool = False
    capped: bool = False
    error: str = ""


class SourceReader:
    """Reads the user's files for one answer: each recorded path looked for once, each file read once, as far as
    the lines asked for need. `source_root`: the checkout the paths are read under (None: the recorded paths,
    where recorded_paths_allowed)."""

    def __init__(self, source_root: str | Path | None = None) -> None:
        self.source_root = str(source_root) if source_root else None
        self._found: dict[str, _Found] = {}
        self._texts: dict[Path, _Text] = {}
        self._root: tuple[Path | None, str] | None = None

    # -- where a recorded path leads

    def locate(self, path: str) -> Path | None:
        """The file the recorded `path` is read at (the name answers give it), or None."""
        return self._locate(path).shown

    def _locate(self, path: str) -> _Found:
        found = self._found.get(path)
        if found is None:
            found = self._found[path] = self._under_root(path) if self.source_root else self._recorded(path)
        return found

    def _root_folder(self) -> tuple[Path | None, str]:
        """The source root resolved (inside the bounds where reads are bounded), or None and why."""
        if self._root is None:
            try:
                real = confined.resolved(self.source_root)  # OutsideRoots where it, or a link on its way, leads out
                real = Path(os.path.realpath(real))
                self._root = (real, "") if real.is_dir() else (None, f"source_root {self.source_root} is no folder")
            except confined.OutsideRoots as exc:
                self._root = (None, str(exc))
            except (OSError, ValueError):
                self._root = (None, f"source_root {self.source_root} is no folder")
        return self._root

    def _under_root(self, path: str) -> _Found:
        root, why = self._root_folder()
        if root is None:
            return _Found(why=f"{path} {UNREADABLE}: {why}")
        not_there = _Found(why=f"{path} {UNREADABLE} under source_root {self.source_root} (no file there ends "
                               "with the path the capture machine recorded; links leading out of it are not followed)")
        if "\0" in path:
            return not_there
        parts = [p for p in path.split("/") if p and p not in (".", "..")][-MAX_PATH_PARTS:]
        for i, first in enumerate(parts):
            try:
                if not os.path.lexists(root / first):  # one look-up per part: most suffixes stop here
                    continue
                candidate = root.joinpath(*parts[i:])
                real = Path(os.path.realpath(candidate))
            except (OSError, ValueError):
                continue
            if real.is_relative_to(root) and real.is_file():  # a link leading out of the root is not followed
                return _Found(shown=Path(self.source_root).joinpath(*parts[i:]), real=real, bounds=(root,))
        return not_there

    def _recorded(self, path: str) -> _Found:
        if not recorded_paths_allowed():
            return _Found(why=f"{path} {UNREADABLE}: the path the capture machine recorded is not read here; name "
                              "the checkout that holds it (the tool's source_root, or --source-root DIR)")
        unreadable = _Found(why=f"{path} {UNREADABLE} (the path the capture machine recorded): name the checkout "
                                "that holds it (the tool's source_root, or --source-root DIR)")
        if "\0" in path or not path.startswith("/"):
            return unreadable
        try:
            real = confined.resolved(path)  # where reads are bounded: inside them, every link on the way resolved
            if not Path(real).is_file():
                return unreadable
        except (confined.OutsideRoots, OSError, ValueError):
            return unreadable  # said as any unreadable file: nothing of what lies outside
        return _Found(shown=Path(path), real=Path(real), bounds=None)

    # -- reading

    def lines(self, path: str, upto: int) -> tuple[list[str], _Text] | str:
        """The first `upto` lines of the file the recorded `path` leads to (fewer where it ends sooner, or where
        MAX_SOURCE_BYTES are read first) and what is known of the rest; or why none."""
        found = self._locate(path)
        if found.real is None:
            return found.why
        text = self._texts.get(found.real)
        if text is None or (len(text.lines) < upto and not text.complete and not text.capped and not text.error):
            more = max(upto, 2 * len(text.lines)) if text is not None else upto  # a later, longer ask reads again
            text = self._texts[found.real] = _read_lines(found, more)
        if text.error:
            return f"{found.shown} could not be read: {text.error}"
        return text.lines[:upto], text

    def quote(self, path: str, line: int, context: int = CONTEXT_LINES, function: str = "") -> dict:
        """{file: the file read, code: the line's text, context: [[number, text], …] around it} or
        {code_not_available: why}: no file, not readable here, or not the version the profile ran (too short, or
        the line is not in the frame's `function`: other_version)."""
        if not path or line <= 0:
            return {"code_not_available": "the profile names no file and line"}
        if not path.endswith(".py"):
            return {"code_not_available": f"{path} is no Python source file: only the files a Python stack names "
                                          "are read"}
        read = self.lines(path, line + context)
        if isinstance(read, str):
            return {"code_not_available": read}
        text, state = read
        shown = self._locate(path).shown
        if line > len(text):
            if state.capped:
                return {"code_not_available": f"{shown}: line {line} lies past the first {MAX_SOURCE_BYTES >> 20} "
                                              "MiB, more than xdiag reads of a source file"}
            return {"code_not_available": f"{shown} {STALE}: it has {len(text)} lines, not {line}"}
        stale = other_version(text, line, function)
        if stale:
            return {"code_not_available": f"{shown} {STALE}: {stale}"}
        low, high = max(1, line - context), min(len(text), line + context)
        return {"file": str(shown), "code": text[line - 1].strip()[:MAX_QUOTED_CHARS],
                "context": [[n, text[n - 1][:MAX_QUOTED_CHARS]] for n in range(low, high + 1)]}

    # -- what an answer quoted

    def versions(self, paths: list[str] | None = None) -> dict[str, str]:
        """Recorded path -> the version of the file it leads to here (its name, size, mtime, ctime and inode), ""
        where none: of `paths`, else of every path looked for. An answer that quoted code is the same answer while
        these are."""
        out = {}
        for path in sorted(self._found if paths is None else paths):
            found = self._locate(path)
            out[path] = _version(found.real, found.shown) if found.real is not None else ""
        return out


def _version(real: Path, shown: Path | None) -> str:
    try:
        info = os.stat(real)
    except OSError:
        return ""
    return f"{shown}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}"


def _read_lines(found: _Found, upto: int) -> _Text:
    """The first `upto` lines of the file found (opened within its bounds, no link followed), at most
    MAX_SOURCE_BYTES of it; lines end at "\\n" alone, as Python numbers them."""
    out = _Text()
    try:
        fd = confined.open_fd(found.real, os.O_RDONLY | os.O_NONBLOCK, bounds=found.bounds)
    except confined.OutsideRoots:
        out.error = "it, or a link on its way, leads outside the folders read"
        return out
    except OSError as exc:
        out.error = exc.strerror or type(exc).__name__
        return out
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                out.error = "not a regular file"
                return out
            budget = MAX_SOURCE_BYTES
            while len(out.lines) < upto:
                raw = handle.readline(budget)
                if not raw:
                    out.complete = True
                    break
                budget -= len(raw)
                if not raw.endswith(b"\n") and budget <= 0:
                    out.capped = True  # a line cut by the bound is not a line of the file
                    break
                out.lines.append(raw.rstrip(b"\r\n").decode("utf-8", "replace"))
                if budget <= 0:
                    out.capped = True
                    break
        except OSError as exc:
            out.error = exc.strerror or type(exc).__name__
    return out


_DEF = re.compile(r"\s*(?:async\s+)?def\s+(\w+)")


def other_version(text: list[str], line: int, function: str) -> str:
    """Why the file's `line` cannot be the one the profile's frame names, or "": the line is blank, or the function
    it sits in (the nearest `def` outside it) is not the frame's function (`make.<locals>.one_token` runs in `def
    one_token`; a lambda, comprehension or module-level frame is not checked, nor a `def` more than MAX_DEF_SEARCH
    lines up)."""
    own = text[line - 1]
    if not own.strip():
        return f"line {line} is blank"
    name = function.rsplit(".", 1)[-1] if function else ""
    if not name or name.startswith("<"):
        return ""
    found = _DEF.match(own)
    if found and found[1] == name:
        return ""  # the tracer names a function by its `def` line
    indent = len(own) - len(own.lstrip())
    for above in range(line - 2, max(-1, line - 2 - MAX_DEF_SEARCH), -1):
        if not text[above].strip():
            continue
        depth = len(text[above]) - len(text[above].lstrip())
        if depth >= indent:
            continue
        indent = depth
        found = _DEF.match(text[above])
        if found:
            return "" if found[1] == name else f"line {line} is in def {found[1]}, not in {name} as the profile says"
        if depth == 0:
            break
    else:
        if line - 1 > MAX_DEF_SEARCH:
            return ""
    return f"line {line} is in no def {name}, where the profile says it runs"


def quote_line(path: str, line: int, source_root: str | Path | None = None, context: int = CONTEXT_LINES,
               function: str = "") -> dict:
    """One line of the user's code as every answer quotes it (SourceReader.quote; a reader of its own, for a caller
    that quotes one line): {file, code, context} or {code_not_available: why}. `path` and `line` as the profile
    records them (a frame's file and line), `function` the frame's function (a line outside it is another
    version of the file, not quoted)."""
    return SourceReader(source_root).quote(path, line, context, function)


def unchanged(versions: dict[str, str], source_root: str | Path | None) -> bool:
    """Whether every recorded path of an answer (SourceReader.versions) still leads to the same file version."""
    if not isinstance(versions, dict):
        return False
    return SourceReader(source_root).versions(list(versions)) == versions
