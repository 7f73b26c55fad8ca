"""The local result cache of `xdiag tool` and `xdiag mcp`: a profile decoded once per file version, each tool's answer
kept per tool, arguments and file version.

One entry per session version: `<root>/<key>/session.xdiag` (the decoded session with the tables every tool builds
first, `xdiag.profile.compact`, as the cloud stores it), `<root>/<key>/answers/<key>.json` (a tool's JSON result) and
`<root>/<key>/xprof-views/` (XProf's views `xdiag analyze` converted, `xdiag.analysis.xprof.background`).
The entry's key hashes every file's absolute path, size and mtime (a replaced file is another version, never the
old one: the cloud keys its prepared sessions by URI, generation and size alike) and the xdiag code that answers;
an answer's key hashes the tool, its arguments and whether XProf's views are on. A failed result is never kept
(a `not_available` one is: the data is not in that file). The least recently used entries go past the limit.

Root: `XDIAG_LOCAL_CACHE_DIR`, else `$XDG_CACHE_HOME/xdiag`, else `~/.cache/xdiag`; limit `XDIAG_LOCAL_CACHE_GIB`
(2 GiB). This module imports nothing heavy: a cached answer is found without loading the tools.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from xdiag.disk_cache import evict_least_recent

DEFAULT_LIMIT_BYTES = 2 * 2**30
SESSION_FILE = "session.xdiag"
ANSWERS = "answers"
VIEWS = "xprof-views"


@functools.cache
def code_digest() -> str:
    """A digest of the xdiag package's source and the XProf version: another version of either answers afresh."""
    from importlib.metadata import PackageNotFoundError, version

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    try:
        digest.update(version("xprof").encode())
    except PackageNotFoundError:
        pass
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    """An argument as the key holds it: `--arg top_n=5` and the JSON 5 of an MCP call are one answer."""
    return value if isinstance(value, str) else json.dumps(value)


class ResultCache:
    def __init__(self, root: Path, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes

    @classmethod
    def from_env(cls) -> ResultCache:
        env = os.environ
        root = env.get("XDIAG_LOCAL_CACHE_DIR") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xdiag"
        return cls(Path(root), int(float(env.get("XDIAG_LOCAL_CACHE_GIB", DEFAULT_LIMIT_BYTES / 2**30)) * 2**30))

    def entry(self, files: list[Path]) -> Path:
        """The folder of exactly these file versions (ProfileError's caller has checked they exist)."""
        digest = hashlib.sha256(code_digest().encode())
        for path in sorted(Path(f).absolute() for f in files):
            info = path.stat()
            digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}\n".encode())
        return self.root / digest.hexdigest()[:32]

    def views_folder(self, files: list[Path]) -> Path:
        """Where XProf's views of these file versions are kept (`xdiag.analysis.xprof.background`)."""
        return self.entry(files) / VIEWS

    def _answer_path(self, entry: Path, tool: str, args: dict[str, Any]) -> Path:
        from_views = os.environ.get("XDIAG_XPROF_VIEWS", "1")  # xdiag.analysis.xprof.XPROF_VIEWS_ENV: off answers differ
        key = json.dumps([tool, sorted((k, _canonical(v)) for k, v in args.items()), from_views])
        return entry / ANSWERS / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def answer(self, files: list[Path], tool: str, args: dict[str, Any]) -> str | None:
        """The JSON result kept for this call on these file versions, or None."""
        entry = self.entry(files)
        try:
            text = self._answer_path(entry, tool, args).read_text()
        except OSError:
            return None
        _touch(entry)
        return text

    def store_answer(self, files: list[Path], tool: str, args: dict[str, Any], result_json: str) -> None:
        """Keeps a tool's JSON result (the caller keeps failures out); a cache that cannot be written is said on
        stderr and skipped: the answer stands without it."""
        entry = self.entry(files)
        try:
            _write(self._answer_path(entry, tool, args), result_json.encode())
            self._trim(entry)
        except OSError as exc:
            _unwritable(self.root, exc)

    def session(self, files: list[Path], name: str, max_bytes: int):
        """The session of these file versions: mapped from the entry where an earlier call decoded it, else read
        and stored there (with the tables every tool builds first). ProfileError where the profile cannot be read."""
        from xdiag.analysis import prepared
        from xdiag.profile.compact import load_session, save_session
        from xdiag.profile.session import read_session

        entry = self.entry(files)
        stored = entry / SESSION_FILE
        if stored.exists():
            try:
                session = load_session(stored)
            except Exception:  # noqa: BLE001 - an unreadable entry (a disk error, a crash mid-write): decode again
                stored.unlink(missing_ok=True)
            else:
                session.name = name
                prepared.adopt(session)
                _touch(entry)
                return session
        session = read_session(files, name=name, max_bytes=max_bytes)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=entry, prefix=".", suffix=".part", delete=False) as part:
                pass
            try:
                save_session(session, Path(part.name), prepared.export(session))
                os.replace(part.name, stored)  # readers never see a half-written file
            finally:
                Path(part.name).unlink(missing_ok=True)
            self._trim(entry)
        except OSError as exc:
            _unwritable(self.root, exc)
        return session

    def _trim(self, keep: Path) -> None:
        evict_least_recent(self.root, self.limit_bytes, keep)


def answer_tool(files: list[Path], session_name: str, tool: str, args: dict[str, Any], cache: ResultCache | None,
                max_bytes: int, key_args: dict[str, Any] | None = None) -> tuple[str, str]:
    """One tool's JSON result on a session and its status, from the cache where it holds the answer, else run on the
    session (decoded once per file version where there is a cache) and kept unless it failed. `args` are checked
    (`registry.validate_args`) by the caller; `key_args` is the form the answer is kept under (default `args`).
    ProfileError where the profile cannot be read."""
    key = args if key_args is None else key_args
    kept = cache.answer(files, tool, key) if cache is not None else None
    if kept is not None:
        return kept, json.loads(kept)["status"]
    from xdiag.tools import run_tool

    if cache is None:
        from xdiag.profile.session import read_session

        session = read_session(files, name=session_name, max_bytes=max_bytes)
    else:
        session = cache.session(files, session_name, max_bytes)
        from xdiag.analysis.xprof.background import adopt_kept_views

        adopt_kept_views(session, cache.views_folder(files))  # those `xdiag analyze` had converted: none converts again
    try:
        result = run_tool(session, tool, args)
    finally:
        session.close()
    text = result.model_dump_json(indent=2) + "\n"
    if cache is not None and result.status.value != "failed":
        cache.store_answer(files, tool, key, text)
    return text, result.status.value


def _unwritable(root: Path, exc: OSError) -> None:
    print(f"xdiag: the result cache {root} cannot be written ({exc.strerror or exc}); answering without it "
          "(XDIAG_LOCAL_CACHE_DIR names another folder, --no-cache skips it)", file=sys.stderr)


def _touch(entry: Path) -> None:
    """A use: the entry is the most recent (its folder's mtime is what eviction orders by)."""
    try:
        os.utime(entry)
    except OSError:
        pass


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".part", delete=False) as part:
        part.write(data)
    os.replace(part.name, path)
    _touch(path.parents[1])
