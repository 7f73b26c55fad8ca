"""Finds the session a user means: a file, a session folder, or an XProf log dir; and what the files' names say
(an xplane, or a Chrome/Kineto trace and the host it names). Imports nothing heavy: `xdiag tool` finds a cached
answer through it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdiag.errors import ProfileError

SUFFIX = ".xplane.pb"
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json")
"""Trace file endings, the longest first: a name is its file's name less the first that fits (trace_stem)."""


@dataclass
class LocatedSession:
    name: str
    files: list[Path]
    run: str  # the run (log dir) name, "local" when unknown


def is_trace_file(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES)


def trace_stem(file_name: str) -> str:
    """The host (rank) or session a trace file names: torch.profiler's `rank0.pt.trace.json.gz` -> `rank0`,
    XProf's `host.trace.json.gz` -> `host`, a plain `run.json` -> `run`."""
    return file_name.removesuffix(next((s for s in TRACE_SUFFIXES if file_name.endswith(s)), ""))


def _xplanes(folder: Path) -> list[Path]:
    """A folder's profiles: its xplanes, else its Chrome/Kineto trace files (one per host or rank)."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return [p for p in files if p.name.endswith(SUFFIX)] or [p for p in files if is_trace_file(p)]


def locate_session(path: Path, session: str | None = None) -> LocatedSession:
    """PATH is one *.xplane.pb or Kineto/Chrome trace (*.pt.trace.json[.gz], *.json[.gz]), a folder of one session's
    hosts (or ranks), or a log dir with plugins/profile/<session>/."""
    if not path.exists():
        raise ProfileError(f"{path}: no such file or directory")
    path = path.absolute()  # a bare `file.xplane.pb` or `.` has no parents to name the session and run by
    if path.is_file():
        if is_trace_file(path):
            return LocatedSession(trace_stem(path.name), [path], "local")
        if not path.name.endswith(SUFFIX) and not path.name.endswith(".pb"):
            raise ProfileError(f"{path}: not an *.xplane.pb file, nor a Kineto/Chrome trace (*.json, *.json.gz)")
        run = path.parents[3].name if len(path.parents) > 3 and path.parents[1].name == "profile" else "local"
        name = path.parent.name if path.parents[1].name == "profile" else path.name.removesuffix(SUFFIX)
        return LocatedSession(name, [path], run)
    direct = _xplanes(path)
    if direct:
        run = path.parents[2].name if len(path.parents) > 2 and path.parent.name == "profile" else "local"
        return LocatedSession(path.name, direct, run)
    sessions = log_dir_sessions(path)
    if not sessions:
        raise ProfileError(f"{path}: no *{SUFFIX} files (nor *.json[.gz] traces) here or under plugins/profile/<session>/")
    if session is not None:
        chosen = [s for s in sessions if s.name == session]
        if not chosen:
            raise ProfileError(f"{path}: no session {session!r}; sessions: {', '.join(s.name for s in sessions)}")
        return chosen[0]
    return sessions[-1]  # XProf names sessions by timestamp, so the last is the newest


def log_dir_sessions(path: Path) -> list[LocatedSession]:
    """The sessions of an XProf log dir (`<logdir>/plugins/profile/<session>/`, or its `profile/` or that folder
    itself), oldest first; [] where there are none."""
    path = path.absolute()
    for profile_dir, run in ((path / "plugins" / "profile", path.name), (path / "profile", path.parent.name), (path, path.parent.parent.name)):
        if not profile_dir.is_dir():
            continue
        sessions = [LocatedSession(d.name, files, run) for d in sorted(profile_dir.iterdir())
                    if d.is_dir() and (files := _xplanes(d))]
        if sessions:
            return sessions
    return []
