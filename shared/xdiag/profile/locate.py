"""Finds the session a user means: a file, a session folder, or an XProf log dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xdiag.errors import ProfileError
from xdiag.profile.trace_json import is_trace_file, trace_stem

SUFFIX = ".xplane.pb"


@dataclass
class LocatedSession:
    name: str
    files: list[Path]
    run: str  # the run (log dir) name, "local" when unknown


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
    for profile_dir, run in ((path / "plugins" / "profile", path.name), (path / "profile", path.parent.name), (path, path.parent.parent.name)):
        if not profile_dir.is_dir():
            continue
        sessions = sorted(d for d in profile_dir.iterdir() if d.is_dir() and _xplanes(d))
        if not sessions:
            continue
        if session is not None:
            chosen = [d for d in sessions if d.name == session]
            if not chosen:
                raise ProfileError(f"{path}: no session {session!r}; sessions: {', '.join(d.name for d in sessions)}")
            return LocatedSession(session, _xplanes(chosen[0]), run)
        newest = sessions[-1]  # XProf names sessions by timestamp, so the last is the newest
        return LocatedSession(newest.name, _xplanes(newest), run)
    raise ProfileError(f"{path}: no *{SUFFIX} files (nor *.json[.gz] traces) here or under plugins/profile/<session>/")
