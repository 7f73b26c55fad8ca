"""Files written in place of others without following a link: a new file under a fresh name beside the target, put
in place with one rename.

A fixed temporary name (`summary.html.tmp`) can be planted as a link by anyone who can write the folder, and writing
through it overwrites the file it points to. `tempfile.mkstemp` creates its name with O_CREAT | O_EXCL (a link there
fails it, never is followed) and a name nobody can guess; `os.replace` then replaces whatever is at the target, a link
included, rather than writing through it. A reader never sees half a file, and an error leaves no temporary behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

PART_SUFFIX = ".part"
"""The ending of a file in flight (`.<name>.<random>.part`): the result cache counts them and cleans those left by an
interrupted store (xdiag.disk_cache)."""


@contextlib.contextmanager
def replacing(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file to write, put in place of `path` (with `mode`) when the block ends without an error."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=PART_SUFFIX)
    try:
        os.fchmod(fd, mode)
        with open(name, "wb", opener=lambda _name, _flags: fd) as handle:  # its name is the temporary's path
            yield handle
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def replace_with(path: Path, data: bytes, mode: int = 0o644) -> None:
    """`path` holds `data` (written as `replacing` does)."""
    with replacing(path, mode) as handle:
        handle.write(data)


DIGEST_HEADER = b"xdiag-answer sha256="
"""The first line of a kept file that is served only verified (a cached answer, XProf's kept views)."""


def with_digest(data: bytes) -> bytes:
    """`data` behind a first line holding its sha256 (`verified` gives it back)."""
    return DIGEST_HEADER + hashlib.sha256(data).hexdigest().encode() + b"\n" + data


def verified(stored: bytes) -> bytes | None:
    """The data kept in `stored` (`with_digest`) where its digest matches it; None otherwise."""
    header, newline, data = stored.partition(b"\n")
    if not newline or not header.startswith(DIGEST_HEADER):
        return None
    return data if header[len(DIGEST_HEADER):] == hashlib.sha256(data).hexdigest().encode() else None


def unclaimed_folder(parent: Path, name: str, holds_the_same: Callable[[Path], bool]) -> Path:
    """`parent/name`, else `name-2`, `name-3` …: the first folder a command may write its result into without
    replacing another result: one that is not there, is empty, or holds what this command would write again (an
    earlier result of the same inputs, as `holds_the_same` reads it). A link, a file or a folder it cannot read is
    another's."""
    n = 1
    while True:
        folder = parent / (name if n == 1 else f"{name}-{n}")
        n += 1
        if not os.path.lexists(folder):
            return folder
        if folder.is_symlink() or not folder.is_dir():
            continue
        try:
            empty = not any(folder.iterdir())
        except OSError:
            continue
        if empty or holds_the_same(folder):
            return folder
