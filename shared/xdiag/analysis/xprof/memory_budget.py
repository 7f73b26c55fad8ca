"""Whether XProf's conversions of a session fit in the memory this process may use, and how many at once.

XProf's converters build the whole XSpace as C++ protobuf objects and group its events before they convert: each
conversion's resident memory grows by 8-26x the bytes it reads on the profiles measured, plus ~8 MiB whatever the
size (`bench/xprof_memory.py`, bench/README.md, "XProf's memory": op_stats and memory_profile on every real device
profile here and the 85 MiB bench profile). A 1 GiB device session would need 8-26 GiB per conversion, two at once
twice that: past the machine's memory the kernel's OOM killer ends a worker, and the in-process retry that follows
can end the analysis itself, the report of xdiag's own tools with it. So a conversion that would not fit is not
started: the views it feeds answer NotAvailable with the figures and what to do, and xdiag's own analysis goes on;
`prefetch` starts only as many workers as fit side by side.

The estimate is deliberately above every measurement (`BYTES_PER_PROFILE_BYTE`, `BASE_BYTES`: at least 1.4x each
figure measured, 1.8x on the copies xdiag gives XProf), and it is set against what the machine or the container has
available when the conversions start (`available`): /proc/meminfo's MemAvailable and the memory cgroup's limit less
its use, for the process's own cgroup and each one above it (v1 or v2; reclaimable file cache counts as free), the
smallest, of which the conversions may take `SHARE`.
`XDIAG_XPROF_MEMORY_GIB` sets that amount instead (more to allow larger sessions where the estimate is too cautious,
less to keep memory for other work).
Only the standard library here: `conversions` imports it before anything heavy.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from xdiag.text_numbers import whole_number

log = logging.getLogger(__name__)

MEMORY_ENV = "XDIAG_XPROF_MEMORY_GIB"
"""GiB XProf's conversions may use, all at once, instead of `SHARE` of the memory available when they start."""
BYTES_PER_PROFILE_BYTE = 24
"""Resident bytes one conversion is estimated to need per byte of the files it reads; measured 8-26x."""
BASE_BYTES = 64 * 2**20
"""Resident bytes one conversion is estimated to need whatever the profile's size; measured ~8 MiB."""
SHARE = 0.8
"""The part of the available memory XProf's conversions may take; the rest stays for xdiag's own analysis."""
GIB = 2**30
_UNLIMITED = 2**60
"""cgroup v1 writes "no limit" as a number near 2**63."""


@dataclass(frozen=True)
class Budget:
    """The bytes XProf's conversions may use at once, and where that figure comes from (for the reason given)."""

    bytes: int
    source: str


def conversion_bytes(profile_bytes: int) -> int:
    """The resident memory one XProf conversion of files of this many bytes is estimated to need."""
    return BASE_BYTES + BYTES_PER_PROFILE_BYTE * max(0, profile_bytes)


def budget(root: Path = Path("/")) -> Budget | None:
    """What XProf's conversions may use now: `XDIAG_XPROF_MEMORY_GIB`, else `SHARE` of `available`; None where
    neither is known (no /proc: no limit is applied). `root` is where /proc and /sys are (tests give other trees)."""
    configured = os.environ.get(MEMORY_ENV, "").strip()
    if configured:
        try:
            return Budget(max(0, int(float(configured) * GIB)), f"{MEMORY_ENV}={configured}")
        except (ValueError, OverflowError):  # not a finite number: the measured budget, as if unset
            log.warning("%s=%r is not a number of GiB; using the memory available", MEMORY_ENV, configured)
    found = available(root)
    if found is None:
        return None
    free, where = found
    return Budget(int(free * SHARE), f"{int(SHARE * 100)}% of the {_size(free)} {where}")


def available(root: Path = Path("/")) -> tuple[int, str] | None:
    """(bytes, what they are) this process can still take: the smaller of the machine's MemAvailable and the least
    headroom of its memory cgroup and the cgroups above it; None where neither can be read."""
    candidates = []
    meminfo = _meminfo_available(root)
    if meminfo is not None:
        candidates.append((meminfo, "the machine has available"))
    cgroup = _cgroup_headroom(root)
    if cgroup is not None:
        candidates.append((cgroup, "left under this container's memory limit"))
    return min(candidates) if candidates else None


def conversions_that_fit(profile_bytes: int, root: Path = Path("/")) -> int | None:
    """How many conversions of files of this many bytes fit side by side now; None where no budget is known."""
    allowed = budget(root)
    if allowed is None:
        return None
    return allowed.bytes // conversion_bytes(profile_bytes)


def largest_profile_bytes(root: Path = Path("/")) -> int | None:
    """The most bytes of files one conversion fits now (what conversion_bytes inverts); None where no budget is
    known. A reader of many hosts converts those that matter within it (xdiag.analysis.xprof.host_subset)."""
    allowed = budget(root)
    if allowed is None:
        return None
    return max(0, (allowed.bytes - BASE_BYTES) // BYTES_PER_PROFILE_BYTE)


def refusal(profile_bytes: int, root: Path = Path("/")) -> str | None:
    """Why no conversion of files of this many bytes is started now, or None where one fits (or no budget is
    known): the estimate, the budget and its source, and what to do."""
    allowed = budget(root)
    need = conversion_bytes(profile_bytes)
    if allowed is None or need <= allowed.bytes:
        return None
    return (
        f"XProf's converters would need about {_size(need)} of memory for this session ({_size(profile_bytes)} as "
        f"XProf reads it, at an estimated {BYTES_PER_PROFILE_BYTE} bytes per byte), more than the "
        f"{_size(allowed.bytes)} they may use ({allowed.source}); not started, so the machine does not run out of memory. xdiag's own "
        f"analysis does not need them: rerun on a machine with more memory for XProf's views, or set {MEMORY_ENV} to "
        f"allow more"
    )


def _size(count: int) -> str:
    return f"{count / GIB:.1f} GiB" if count >= GIB else f"{count / 2**20:.0f} MiB"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _meminfo_available(root: Path) -> int | None:
    text = _read(root / "proc" / "meminfo")
    for line in (text or "").splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            fields = value.split()
            kilobytes = whole_number(fields[0]) if fields else None
            if kilobytes is not None:
                return kilobytes * 1024
    return None


def _stat_value(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        number = whole_number(value.strip()) if key == name else None
        if number is not None:
            return number
    return 0


def _cgroup_headroom(root: Path) -> int | None:
    """The least headroom of the memory cgroup this process is in (/proc/self/cgroup, v2 or v1) and of each cgroup
    above it: a limit less what that cgroup uses that cannot be reclaimed (usage less inactive file cache). A limit
    set on a parent (a systemd slice, a pod above its container) binds as much as one's own. None where no cgroup
    on the way up has a limit, or there is no cgroup."""
    membership = _read(root / "proc" / "self" / "cgroup") or ""
    headrooms = []
    for line in membership.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            mount = root / "sys" / "fs" / "cgroup"
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1
            mount = root / "sys" / "fs" / "cgroup" / "memory"
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        parts = [part for part in path.strip().split("/") if part]
        if ".." in parts:  # a cgroup outside this namespace's view: only the mount's root is ours to read
            parts = []
        for depth in range(len(parts), -1, -1):  # own cgroup first, the mount's root last
            headroom = _headroom(mount.joinpath(*parts[:depth]), files)
            if headroom is not None:
                headrooms.append(headroom)
    return min(headrooms) if headrooms else None


def _headroom(folder: Path, files: tuple[str, str, str]) -> int | None:
    """One cgroup's limit less its unreclaimable use; None where it has no limit or is not there to read."""
    limit_text, usage_text = _read(folder / files[0]), _read(folder / files[1])
    if limit_text is None or usage_text is None:
        return None
    limit, usage = whole_number(limit_text.strip()), whole_number(usage_text.strip())
    if limit is None or usage is None or limit >= _UNLIMITED:
        return None  # "max", or no limit at this level
    in_use = usage - _stat_value(_read(folder / "memory.stat"), files[2])
    return max(0, limit - max(0, in_use))
