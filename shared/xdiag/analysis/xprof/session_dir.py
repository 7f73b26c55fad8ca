"""The private session folder XProf's converters read: `<workdir>/plugins/profile/<session>/`.

XProf's converters write their results (`ALL_HOSTS.op_stats_v2.pb`, `*.hlo_proto.pb` …) next to their input, so never
next to the originals: the folder holds a link to each file, or, where its host plane holds events XProf makes no use
of, a copy without them (`xdiag.profile.slim`, `host_events`: the same views, conversions a third as long on such
profiles), and the HLO protos XProf's memory viewer reads, extracted from the metadata plane alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xdiag.analysis.xprof import host_events
from xdiag.analysis.xprof.common import XPLANE_SUFFIX, xprof_api, xprof_version
from xdiag.analysis.xprof.quiet import quiet
from xdiag.errors import ProfileError
from xdiag.profile import confined, scratch, slim
from xdiag.profile.locate import open_regular

log = logging.getLogger(__name__)


@dataclass
class PrivateCopy:
    run_dir: Path
    files: list[Path]
    """The files XProf reads, in the run folder: links to the originals, or copies without unused events."""
    events_left_out: int
    """Host events the copies leave out, all files together."""
    removable: str
    """What removing the copy removes: the temporary folder made for it, or the run folder in a caller's workdir."""


def make_private_copy(originals: Sequence[Path], workdir: Path | None, all_events: bool) -> PrivateCopy:
    """The run folder for `originals`, under `workdir` or a temporary folder; `all_events=True` links every file as
    it is. Raises ProfileError where the folder cannot be filled (it is removed)."""
    root = scratch.make("xprof") if workdir is None else Path(workdir).absolute()
    removable: Path | None = root if workdir is None else None
    files: list[Path] = []
    events_left_out = 0
    run_dir = root / "plugins" / "profile"
    try:
        run_dir = _make_session_dir(run_dir, _session_name(originals))
        removable = root if workdir is None else run_dir
        for original, name in zip(originals, _link_names(originals)):
            left_out = slim.LeftOut(0, 0, 0) if all_events else copy_without_unused_events(original, run_dir / name)
            if not any(left_out):
                link_or_copy(original, run_dir / name)
            events_left_out += left_out.events
            files.append(run_dir / name)
    except BaseException as error:  # SIGTERM (a SystemExit) while the copy is made too: nothing is left
        if removable is not None:
            shutil.rmtree(removable, ignore_errors=True)
        if isinstance(error, OSError):
            raise ProfileError(f"cannot set up the private copy in {run_dir}: {error}") from error
        raise
    return PrivateCopy(run_dir, files, events_left_out, str(removable))


def _session_name(paths: Sequence[Path]) -> str:
    parents = {path.parent.name for path in paths}
    name = parents.pop() if len(parents) == 1 else "session"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "session"


def _make_session_dir(profile_root: Path, name: str) -> Path:
    profile_root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = profile_root / (name if attempt == 0 else f"{name}-{attempt + 1}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise ProfileError(f"{profile_root}: cannot create a session folder named {name}*")


def _link_names(paths: Sequence[Path]) -> list[str]:
    """File names in the session folder: the originals' names, made unique, ending in .xplane.pb
    (XProf only looks for that suffix; the stem becomes the host name)."""
    names: list[str] = []
    for path in paths:
        name = path.name if path.name.endswith(XPLANE_SUFFIX) else path.name + XPLANE_SUFFIX
        if name in names:
            name = f"{path.parent.name}_{name}"
        stem, suffix = name.removesuffix(XPLANE_SUFFIX), XPLANE_SUFFIX
        counter = 2
        while name in names:
            name = f"{stem}_{counter}{suffix}"
            counter += 1
        names.append(name)
    return names


def link_or_copy(source: Path, target: Path) -> None:
    """`target` made to read as `source`: a link; where reads are bounded (xdiag.profile.confined), a hard link to
    (or a copy of) the file checked, which XProf's converter then reads, not whatever the name leads to later."""
    if confined.roots():
        confined.link_or_copy_opened(source, target)
        return
    link_private(source, target)


def link_private(source: Path, target: Path) -> None:
    """`target` a link to `source`, a file of a private copy (or a file checked already), else a copy of it."""
    try:
        target.symlink_to(source)
    except OSError:  # no symlinks here (some filesystems, Windows without privilege)
        shutil.copyfile(source, target)


def copy_without_unused_events(original: Path, target: Path) -> slim.LeftOut:
    """What the copy written to `target` leaves out; all 0 where it leaves nothing out (nothing written: link the
    original). A file the copy cannot walk goes to XProf as it is, to get XProf's own reason.

    Left out: the host events `host_events` names; for the audited xprof version, also the TPU planes' lines XProf's
    conversions never read (`slim.UNREAD_TPU_LINES`) and the stats of their op events that hold the value XProf
    takes where they are absent (`slim.DEFAULT_TPU_OP_STATS`), unless the file may hold performance-counter samples,
    which only utilization_viewer reads (a conversion no profile here runs, so no test could compare it). On the
    87.6 MiB TPU v5e capture the op_stats conversion then peaks at ~720 MiB instead of 1,060 MiB (mimalloc; ~860 with
    the lines alone left out), in less CPU, for the same views (tests/test_xprof_views.py compares XProf's converters'
    outputs and xdiag's views with the whole file's)."""
    version = xprof_version()
    try:
        device_lines: frozenset[str] = frozenset()
        default_stats = None
        if version == host_events.AUDITED_VERSION and not file_holds(original, COUNTER_SAMPLE_STAT):
            device_lines, default_stats = slim.UNREAD_TPU_LINES, slim.DEFAULT_TPU_OP_STATS
        return slim.write_for_xprof(original, target, host_events.unread_name_filter(version), device_lines,
                                    default_stats)
    except (ProfileError, OSError, ValueError) as error:
        log.debug("%s goes to XProf as it is: %s", original, error)
        return slim.LeftOut(0, 0, 0)


COUNTER_SAMPLE_STAT = b"counter_value"
"""The stat utilization_viewer takes performance-counter samples from (XProf's StatType kCounterValue)."""


def file_holds(path: Path, name: bytes) -> bool:
    """Whether the file holds these bytes (a string in a protobuf is stored as its UTF-8 bytes)."""
    import mmap

    with open_regular(path) as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return mapped.find(name) >= 0


_XSPACE_PLANES, _XPLANE_NAME = 1, 2
DEVICE_PLANE_PREFIX = "/device:"


def copy_without_device_planes(original: Path, target: Path) -> int:
    """`original` written to `target` without its device planes (`/device:*`), every other field as it is; returns the
    bytes left out. XProf's memory_profile converter reads the host threads plane alone (xplane_to_memory_profile.cc:
    ConvertXSpaceToMemoryProfileJson), yet parses the whole file first: on the 87.6 MiB TPU v5e capture 1.2 s of CPU
    and 620 MiB, against 0.4 s and 20 MiB on this copy, for the same view. ProfileError where the file cannot be
    walked."""
    import numpy as np

    from xdiag.profile import wire

    with open_regular(original) as handle:  # the file checked, where reads are bounded (xdiag.profile.confined)
        data = np.memmap(handle, dtype=np.uint8, mode="r")  # only the planes' headers are read, and the host planes

    def fields(start: int, end: int) -> list[tuple[int, int, int, int]]:
        numbers, tags, starts, ends, _, err, pos = wire.scan_fields(data, start, end)
        if err:
            raise ProfileError(f"{original}: not a readable XSpace ({wire.ERRORS[err]} at byte {pos})")
        return list(zip(numbers.tolist(), tags.tolist(), starts.tolist(), ends.tolist()))

    left_out = 0
    with open(target, "wb") as out:
        for number, tag, start, end in fields(0, len(data)):
            if number == _XSPACE_PLANES:
                name = next((bytes(data[s:e]) for n, _, s, e in fields(start, end) if n == _XPLANE_NAME), b"")
                if name.startswith(DEVICE_PLANE_PREFIX.encode()):
                    left_out += end - tag
                    continue
            out.write(data[tag:end].tobytes())
    return left_out


def remove_private_copy(path: str, xprof_side_files: list[str], worker_folders: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    for folder in worker_folders:
        shutil.rmtree(folder, ignore_errors=True)
    for side_file in xprof_side_files:
        with contextlib.suppress(OSError):
            os.unlink(side_file)


def xprof_side_files(run_dir: Path, names: Sequence[str]) -> list[str]:
    """The fingerprint, owner and lock files LocalXprofClient keeps (under its cache folder) for a run folder holding
    files of these names."""
    links = [run_dir / name for name in names]
    scopes = [[str(p) for p in links]] + ([[str(p)] for p in links] if len(links) > 1 else [])
    files: list[str] = []
    for paths in scopes:
        with contextlib.suppress(Exception):  # best effort: private API of xprof_client
            scope = xprof_api().client._compute_op_stats_scope(run_dir, paths)
            lock = scope.owner_dir / f"{scope.run_dir_hash}.lock"
            files += [str(scope.fp_file), str(scope.owner_file), str(lock)]
    return files


def extract_hlo_protos(run_dir: Path, files: Sequence[Path]) -> None:
    """Puts XProf's `<module>.hlo_proto.pb` files in the run folder, extracted from copies of the files that hold
    their metadata plane alone (`slim.write_metadata_plane`).

    XProf's memory viewer reads each HLO module from those files, and where the folder has none it extracts them by
    converting every file whole: one more parse of the profile. The modules are all on the metadata plane, so XProf's
    own extraction from the copies takes milliseconds and writes the same modules (tests/test_xprof_views.py compares
    the views both ways). Where a copy cannot be made, XProf extracts them from the files as before."""
    if any(run_dir.glob("*.hlo_proto.pb")):
        return
    moved: list[Path] = []
    try:
        scratch = Path(tempfile.mkdtemp(prefix="xdiag-hlo-protos-", dir=run_dir.parent.parent))
    except OSError as error:
        log.debug("XProf extracts the HLO protos of %s itself: %s", run_dir, error)
        return
    try:
        copies = [str(scratch / path.name) for path in files if slim.write_metadata_plane(path, scratch / path.name)]
        if copies:
            with quiet():
                xprof_api().tool_names(copies)
            for proto in scratch.glob("*.hlo_proto.pb"):  # same filesystem: each move is a rename
                os.replace(proto, run_dir / proto.name)
                moved.append(run_dir / proto.name)
    except Exception as error:  # some of the modules would hide the rest from XProf: none, and it extracts
        for proto in moved:
            with contextlib.suppress(OSError):
                proto.unlink()
        log.debug("XProf extracts the HLO protos of %s itself: %s", run_dir, error)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
