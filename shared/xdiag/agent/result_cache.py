"""The local result cache of `xdiag tool` and `xdiag mcp`: a profile decoded once per file version, each tool's answer
kept per tool, arguments and file version.

One entry per session version: `<root>/<key>/session.xdiag` (the decoded session with the tables every tool builds
first, `xdiag.profile.compact`, as the cloud stores it), `<root>/<key>/answers/<key>.json` (a tool's JSON result) and
`<root>/<key>/xprof-views/` (XProf's views `xdiag analyze` converted, `xdiag.analysis.xprof.background`).
The entry's key hashes every file's absolute path, size, mtime, ctime and inode and a fingerprint of its bytes
(`file_version`: a file rewritten in place or replaced by a rename, whatever mtime it is given, is another version,
never the old one) and the xdiag code that answers; an answer's key hashes the tool, its arguments and whether
XProf's views are on. A failed result is never kept (a `not_available` one is: the data is not in that file); one
that quoted the user's code (its `source_versions`: get_line_view's) is given again only while each file it read
(or looked for) is the version it was. The least recently used entries go past the limit.

Nothing is served unverified: an answer carries the sha256 of its JSON on its first line, a session file has its
sha256 beside it (`session.xdiag.sha256`), and an entry that does not match (truncated, flipped, planted without
its digest) is dropped and computed afresh. The folders are 0700 and the files 0600 (a decoded profile holds its
HLO text); a cache folder another user owns, or a link in its place, is refused (the tool answers without it), and
one of ours that others may write is made 0700. Files left by interrupted stores count towards the limit and go
after an hour (`xdiag.disk_cache`).

Root: `XDIAG_LOCAL_CACHE_DIR`, else `$XDG_CACHE_HOME/xdiag`, else `~/.cache/xdiag`; limit `XDIAG_LOCAL_CACHE_GIB`
(2 GiB). This module imports nothing heavy: a cached answer is found without loading the tools.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from xdiag.disk_cache import evict_least_recent
from xdiag.fresh_files import replace_with, replacing, verified, with_digest
from xdiag.text_numbers import plain_number

DEFAULT_LIMIT_BYTES = 2 * 2**30
SESSION_FILE = "session.xdiag"
SESSION_DIGEST = "session.xdiag.sha256"
ANSWERS = "answers"
VIEWS = "xprof-views"
_FINGERPRINT_BLOCKS = 16
_FINGERPRINT_BLOCK_BYTES = 4096
"""A file's fingerprint reads 16 blocks of 4 KiB spread over it, its last included (64 KiB whatever its size)."""


class UnusableCache(OSError):
    """The cache folder is not this user's alone (another owner, a link in its place, not a folder)."""


def file_version(path: Path) -> str:
    """What tells one version of a file from another: its path, size, mtime, ctime (which no one can set back, and
    which a rewrite in place or a rename over it changes) and inode, and a sha256 of 16 blocks spread over its bytes.
    Where reads are bounded (xdiag.profile.confined), of the file checked inside the bounds."""
    from xdiag.profile.confined import open_binary

    with open_binary(path) as handle:
        info = os.fstat(handle.fileno())
        digest = hashlib.sha256()
        size = info.st_size
        step = max(_FINGERPRINT_BLOCK_BYTES, size // _FINGERPRINT_BLOCKS)
        for offset in [*range(0, max(size - _FINGERPRINT_BLOCK_BYTES, 0), step), max(size - _FINGERPRINT_BLOCK_BYTES, 0)]:
            handle.seek(offset)
            digest.update(handle.read(_FINGERPRINT_BLOCK_BYTES))
    return f"{path}:{size}:{info.st_mtime_ns}:{info.st_ctime_ns}:{info.st_ino}:{digest.hexdigest()}"


def private_folder(path: Path) -> Path:
    """`path` made (0700) where it is missing; UnusableCache where it is a link, not a folder, or another user's;
    made 0700 where it is ours and others may read or write it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnusableCache(f"{path} is a link or not a folder")
    if info.st_uid != os.geteuid():
        raise UnusableCache(f"{path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def _file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@functools.cache
def code_digest() -> str:
    """A digest of the versions of the xdiag package's source files and the XProf version: another version of either
    answers afresh. A file's version is its path in the package, size, mtime, ctime (which no write leaves as it was)
    and inode, as `file_version` tells a profile's apart: reading and hashing the 2.7 MB of source took 10-16 ms of
    every cached answer, these 2."""
    from xdiag.analysis.xprof.common import xprof_version

    digest = hashlib.sha256()
    version = xprof_version()
    if version is not None:
        digest.update(version.encode())
    versions: list[str] = []

    def add(folder: str, inside: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        add(entry.path, f"{inside}{entry.name}/")
                elif entry.name.endswith(".py"):
                    info = entry.stat()
                    versions.append(f"{inside}{entry.name}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}:"
                                    f"{info.st_ino}\n")

    add(str(Path(__file__).resolve().parents[1]), "")
    digest.update("".join(sorted(versions)).encode())
    return digest.hexdigest()


LIMIT_ENV = "XDIAG_LOCAL_CACHE_GIB"
_said_bad_limit: set[str] = set()


def _limit_bytes(text: str | None) -> int:
    """The cache's bound from XDIAG_LOCAL_CACHE_GIB; a value that is no plain number of GiB ('abc', 'nan', '1e999')
    is said once on stderr and the default used: a setting of the cache never stops a tool answering."""
    if text is None:
        return DEFAULT_LIMIT_BYTES
    gib = plain_number(text.strip())
    if gib is not None:
        return int(gib * 2**30)
    if text not in _said_bad_limit:
        _said_bad_limit.add(text)
        print(f"xdiag: {LIMIT_ENV} takes a number of GiB such as 2 (got {text!r}); using the default, "
              f"{DEFAULT_LIMIT_BYTES // 2**30} GiB", file=sys.stderr)
    return DEFAULT_LIMIT_BYTES


def _canonical(value: Any) -> str:
    """An argument as the key holds it: `--arg top_n=5` and the JSON 5 of an MCP call are one answer."""
    return value if isinstance(value, str) else json.dumps(value)


class ResultCache:
    def __init__(self, root: Path, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self.interrupted_stores_cleaned = 0  # files left by interrupted stores that eviction removed
        self._said_unwritable = False

    @classmethod
    def from_env(cls) -> ResultCache:
        env = os.environ
        root = env.get("XDIAG_LOCAL_CACHE_DIR") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xdiag"
        return cls(Path(root), _limit_bytes(env.get(LIMIT_ENV)))

    def entry(self, files: list[Path]) -> Path:
        """The folder of exactly these file versions (ProfileError's caller has checked they exist)."""
        digest = hashlib.sha256(code_digest().encode())
        for path in sorted(Path(f).absolute() for f in files):
            digest.update(f"{file_version(path)}\n".encode())
        return self.root / digest.hexdigest()[:32]

    def views_folder(self, files: list[Path]) -> Path:
        """Where XProf's views of these file versions are kept (`xdiag.analysis.xprof.background`)."""
        return self.entry(files) / VIEWS

    def _private_entry(self, entry: Path) -> Path:
        """The entry's folder, made private, in the root checked private (UnusableCache otherwise)."""
        private_folder(self.root)
        return private_folder(entry)

    def _answer_path(self, entry: Path, tool: str, args: dict[str, Any]) -> Path:
        from_views = os.environ.get("XDIAG_XPROF_VIEWS", "1")  # xdiag.analysis.xprof.XPROF_VIEWS_ENV: off answers differ
        key = json.dumps([tool, sorted((k, _canonical(v)) for k, v in args.items()), from_views])
        return entry / ANSWERS / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def answer(self, files: list[Path], tool: str, args: dict[str, Any]) -> str | None:
        """The JSON result kept for this call on these file versions, or None."""
        if not self.root.is_dir():  # looking makes nothing
            return None
        try:
            entry = self.entry(files)
            private_folder(self.root)
            path = self._answer_path(entry, tool, args)
            stored = path.read_bytes()
        except OSError:
            return None
        data = verified(stored)
        if data is None:  # truncated, flipped or planted: computed afresh
            _drop(path)
            return None
        text = data.decode("utf-8", "replace")
        if not _sources_unchanged(text):  # it quoted code that has changed since: computed afresh
            path.unlink(missing_ok=True)
            return None
        _touch(entry)
        return text

    def store_answer(self, files: list[Path], tool: str, args: dict[str, Any], result_json: str, *,
                     entry: Path | None = None, trim: bool = True) -> None:
        """Keeps a tool's JSON result (the caller keeps failures out); a cache that cannot be written is said on
        stderr and skipped: the answer stands without it. `entry`: the files' entry where the caller has it;
        `trim=False`: the caller stores several answers and trims once after them (`trim`)."""
        try:
            entry = self.entry(files) if entry is None else entry
            for attempt in (1, 2):
                try:
                    path = self._answer_path(self._private_entry(entry), tool, args)
                    private_folder(path.parent)
                    replace_with(path, with_digest(result_json.encode()), mode=0o600)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise  # the entry went again: another process's eviction, once more, or no cache at all
            _touch(entry)
            if trim:
                self._trim(entry)
        except OSError as exc:
            self._unwritable(exc)

    def trim(self, keep: Path) -> None:
        """Drops the least recently used entries past the limit, never `keep`; a cache that cannot be written is
        said on stderr."""
        try:
            self._trim(keep)
        except OSError as exc:
            self._unwritable(exc)

    def session(self, files: list[Path], name: str, max_bytes: int):
        """The session of these file versions: mapped from the entry where an earlier call decoded it, else read
        and stored there (with the tables every tool builds first). ProfileError where the profile cannot be read."""
        from xdiag.analysis import prepared
        from xdiag.profile.compact import load_session, save_session
        from xdiag.profile.session import read_session

        try:
            entry = self.entry(files)
        except OSError:  # a file that cannot be read: the read says why
            return read_session(files, name=name, max_bytes=max_bytes)
        stored, digest = entry / SESSION_FILE, entry / SESSION_DIGEST
        usable = True
        try:
            private_folder(self.root)
        except OSError as exc:
            self._unwritable(exc)
            usable = False
        if usable and stored.exists():
            try:
                if digest.read_text().strip() != _file_digest(stored):
                    raise ValueError("its digest does not match")
                session = load_session(stored)
            except Exception:  # noqa: BLE001 - unverified or unreadable (flipped, planted, a crash mid-write): decode again
                _drop(stored, digest)
            else:
                session.name = name
                prepared.adopt(session)
                _touch(entry)
                return session
        session = read_session(files, name=name, max_bytes=max_bytes)
        if not usable:
            return session
        try:
            self._private_entry(entry)
            with replacing(stored, mode=0o600) as part:  # readers never see a half-written file
                part.close()
                save_session(session, Path(part.name), prepared.export(session))
                replace_with(digest, f"{_file_digest(Path(part.name))}\n".encode(), mode=0o600)
            self._trim(entry)
        except OSError as exc:
            self._unwritable(exc)
        return session

    def _unwritable(self, exc: OSError) -> None:
        """Says once (a call may try twice: the session, then the answer) that the cache cannot be used."""
        if not self._said_unwritable:
            self._said_unwritable = True
            print(f"xdiag: the result cache {self.root} cannot be written ({exc.strerror or exc}); answering without "
                  "it (XDIAG_LOCAL_CACHE_DIR names another folder, --no-cache skips it)", file=sys.stderr)

    def _trim(self, keep: Path) -> None:
        self.interrupted_stores_cleaned += evict_least_recent(self.root, self.limit_bytes, keep)


SOURCE_VERSIONS = '"source_versions"'


def _sources_unchanged(text: str) -> bool:
    """Whether the source files a kept answer quoted (its detail's source_versions: get_line_view's) are still the
    versions it read; an answer that quoted none is."""
    if SOURCE_VERSIONS not in text:
        return True
    try:
        result = json.loads(text)
        versions = (result.get("detail") or {}).get("source_versions")
        root = (result.get("args") or {}).get("source_root") or (result.get("summary") or {}).get("source_root")
    except (ValueError, AttributeError):
        return False
    if versions is None:  # the words alone, in some other answer (an op's name)
        return True
    from xdiag.analysis.source_code import unchanged

    return unchanged(versions, root)


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

def keep_analysis_answers(cache: ResultCache | None, files: list[Path], out_dir: Path,
                          views_pending: str | None = None) -> int:
    """The tool answers an analysis wrote (`<out>/tools/*.json`: the broad tools and its follow-up calls) kept as the
    answers of these file versions, under the tool and arguments each ran with: a tool asked next (`xdiag tool`, MCP)
    answers from what the analysis computed instead of decoding the profile again. Failed answers are not kept, nor a
    `get_line_view` that read the code at `--source-root` (its answer without one differs), nor one that says XProf's
    views were still converting (it quotes `views_pending`, the folder they are kept in: the next call has them).
    The count kept."""
    if cache is None:
        return 0
    try:
        entry = cache.entry(files)
    except OSError as exc:  # a file that cannot be read any more: nothing to keep its answers under
        cache._unwritable(exc)
        return 0
    kept = 0
    for path in sorted((Path(out_dir) / "tools").glob("*.json")):
        try:
            text = path.read_text()
            result = json.loads(text)
            tool, args, status = result["tool"], result.get("args") or {}, result["status"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if status == "failed" or not isinstance(tool, str) or not isinstance(args, dict):
            continue
        if views_pending and views_pending in text:
            continue
        if tool == "get_line_view" and os.environ.get("XDIAG_SOURCE_ROOT"):  # analysis.source_code.SOURCE_ROOT_ENV
            continue
        cache.store_answer(files, tool, args, text if text.endswith("\n") else text + "\n", entry=entry, trim=False)
        kept += 1
    if kept:
        cache.trim(entry)  # once for them all: a walk of the cache folder per answer cost seconds on a full cache
    return kept


def _drop(*paths: Path) -> None:
    """Removes what failed its check; in a cache that cannot be written it stays, unserved (it never verifies)."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _touch(entry: Path) -> None:
    """A use: the entry is the most recent (its folder's mtime is what eviction orders by)."""
    try:
        os.utime(entry)
    except OSError:
        pass

