"""Finds the session a user means: a file, a session folder, or an XProf log dir; and what the files' names say
(an xplane, or a Chrome/Kineto trace and the host it names). Imports nothing heavy: `xdiag tool` finds a cached
answer through it."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from xdiag.errors import ProfileError
from xdiag.profile.confined import has_control_characters, is_inside, open_fd, resolved, roots, shown

SUFFIX = ".xplane.pb"
TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json")
"""Trace file endings, the longest first: a name is its file's name less the first that fits (trace_stem)."""


@dataclass
class LocatedSession:
    name: str
    files: list[Path]
    run: str  # the run (log dir) name, "local" when unknown
    folder_name: str = ""  # the session folder's own name, where the name above was made from it (`--session`)


_OUTSIDE_NAMES = re.compile(r"[^A-Za-z0-9._-]+")


def id_from_file_name(text: str, digits: int = 6) -> str:
    """A name in xdiag's id grammar (xdiag.ids) from any file or folder name: characters outside it (spaces,
    parentheses, accents, other scripts) become `_` (accents dropped first where a letter has one), and a name so
    changed ends with 6 hex digits of the original, so `run(1)` and `run[1]` stay apart."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", text):
        return text
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    readable = _OUTSIDE_NAMES.sub("_", plain).lstrip("._-")[:100] or "profile"
    return f"{readable}-{hashlib.sha256(text.encode('utf-8', 'surrogateescape')).hexdigest()[:digits]}"


def refuse_control_characters(paths: list[Path]) -> None:
    """A ProfileError where a profile's name holds control characters: a name with a newline or an escape shown in
    a terminal or a log can forge lines (`x<TAB>victim.txt<TAB>1<NL>zz.xplane.pb`, issue 62); none is read. Where
    reads are bounded (xdiag.profile.confined), OutsideRoots where a file, or a link on its way, leads outside."""
    for path in paths:
        if has_control_characters(path.name):
            raise ProfileError(f"{shown(path)}: a profile's name holds control characters (a tab, a newline, an "
                               "escape); not read: rename the file")
        resolved(path)


def open_regular(path: Path):
    """`path` opened for reading as a binary file, where it is a regular file: a pipe, a device (`/dev/zero`) or a
    socket under a profile's name is refused with a ProfileError, as is a file that cannot be opened (permissions).
    Opened without blocking, so a pipe with no writer cannot hang the open itself. Where reads are bounded
    (xdiag.profile.confined), the file opened is the one checked inside the bounds, no link followed after it."""
    try:
        fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ProfileError(f"{path.name}: cannot be read ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(f"{path.name}: not a regular file (a folder, a device, a pipe or a socket); not read")
        os.set_blocking(fd, True)
        return open(path, "rb", opener=lambda _path, _flags: fd)  # the file object's name is the path
    except BaseException:
        os.close(fd)
        raise


def is_trace_file(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES)


def trace_stem(file_name: str) -> str:
    """The host (rank) or session a trace file names: torch.profiler's `rank0.pt.trace.json.gz` -> `rank0`,
    XProf's `host.trace.json.gz` -> `host`, a plain `run.json` -> `run`."""
    return file_name.removesuffix(next((s for s in TRACE_SUFFIXES if file_name.endswith(s)), ""))


def _xplanes(folder: Path) -> list[Path]:
    """A folder's profiles: its xplanes, else its Chrome/Kineto trace files (one per host or rank)."""
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file())
    except OSError as exc:
        raise ProfileError(f"{folder}: cannot be listed ({exc.strerror or exc})") from None
    return [p for p in files if p.name.endswith(SUFFIX)] or [p for p in files if is_trace_file(p)]


def file_session_names(path: Path) -> tuple[str, str]:
    """The session and run an absolute xplane file's path names: those of its log dir where it lies in one
    (`<run>/plugins/profile/<session>/host.xplane.pb`), else the file's own name and "local" (a file directly under
    `/` too, which has a single parent)."""
    in_log_dir = len(path.parents) > 1 and path.parents[1].name == "profile"
    run = path.parents[3].name if in_log_dir and len(path.parents) > 3 else "local"
    return (path.parent.name if in_log_dir else path.name.removesuffix(SUFFIX)), run


def locate_session(path: Path, session: str | None = None) -> LocatedSession:
    """PATH is one *.xplane.pb or Kineto/Chrome trace (*.pt.trace.json[.gz], *.json[.gz]), a folder of one session's
    hosts (or ranks), or a log dir with plugins/profile/<session>/."""
    resolved(path)  # where reads are bounded: nothing said of a place outside, not even whether it exists
    try:
        exists = path.exists()
    except OSError as exc:  # a name the system refuses (longer than it takes: ENAMETOOLONG)
        raise ProfileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not exists:
        raise ProfileError(f"{path}: no such file or directory")
    path = path.absolute()  # a bare `file.xplane.pb` or `.` has no parents to name the session and run by
    if path.is_file():
        if is_trace_file(path):
            refuse_control_characters([path])
            return LocatedSession(id_from_file_name(trace_stem(path.name)), [path], "local")
        if not path.name.endswith(SUFFIX) and not path.name.endswith(".pb"):
            raise ProfileError(f"{path}: not an *.xplane.pb file, nor a Kineto/Chrome trace (*.json, *.json.gz)")
        refuse_control_characters([path])
        name, run = file_session_names(path)
        return LocatedSession(id_from_file_name(name), [path], id_from_file_name(run))
    if not path.is_dir():
        raise ProfileError(f"{path}: neither a regular file nor a folder (a device, a pipe or a socket)")
    direct = _xplanes(path)
    if direct:
        run = path.parents[2].name if len(path.parents) > 2 and path.parent.name == "profile" else "local"
        refuse_control_characters(direct)
        return LocatedSession(id_from_file_name(path.name), direct, id_from_file_name(run))
    sessions = log_dir_sessions(path)
    if not sessions:
        raise ProfileError(f"{path}: no *{SUFFIX} files (nor *.json[.gz] traces) here or under plugins/profile/<session>/")
    if session is not None:
        chosen = [s for s in sessions if s.folder_name == session] or [s for s in sessions if s.name == session]
        if not chosen:
            raise ProfileError(f"{path}: no session {session!r}; sessions: {', '.join(s.name for s in sessions)}")
        refuse_control_characters(chosen[0].files)
        return chosen[0]
    refuse_control_characters(sessions[-1].files)
    return sessions[-1]  # XProf names sessions by timestamp, so the last is the newest


def log_dir_sessions(path: Path) -> list[LocatedSession]:
    """The sessions of an XProf log dir (`<logdir>/plugins/profile/<session>/`, or its `profile/` or that folder
    itself), oldest first; [] where there are none. Where reads are bounded (xdiag.profile.confined), only the
    sessions whose folder and files lie inside the bounds."""
    path = path.absolute()
    bounded = roots()
    for profile_dir, run in ((path / "plugins" / "profile", path.name), (path / "profile", path.parent.name), (path, path.parent.parent.name)):
        if not profile_dir.is_dir():
            continue
        sessions = [LocatedSession(id_from_file_name(d.name), files, id_from_file_name(run), d.name)
                    for d in sorted(profile_dir.iterdir())
                    if (not bounded or is_inside(d, bounded)) and d.is_dir() and (files := _xplanes(d))
                    and (not bounded or all(is_inside(f, bounded) for f in files))]
        if sessions:
            return _apart(sessions)
    return []


def _apart(sessions: list[LocatedSession]) -> list[LocatedSession]:
    """Sessions whose made names meet another's (`a b` made `a_b-c8687a`, beside a folder named `a_b-c8687a`) named
    with 16 hex digits of their folder's name instead of 6: no two sessions of a log dir share a name (their
    analyses' folders, `--session`)."""
    taken = [s.name for s in sessions]
    for located in sessions:
        if located.name != located.folder_name and taken.count(located.name) > 1:
            located.name = id_from_file_name(located.folder_name, 16)
    return sessions
