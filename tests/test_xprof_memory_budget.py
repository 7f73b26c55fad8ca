"""xdiag.analysis.xprof.memory_budget: the memory XProf's conversions may take, read from this machine's /proc and its
memory cgroup (v1 or v2), and the estimate it is set against, checked against real conversions of real profiles.

The cgroup layouts are written under a temporary root in the kernel's own file formats, v1 and v2; where this machine
lets the test make memory cgroups (root, v1 here), a limited one and an unlimited one under a limited parent are made
and read for real from inside by a child process."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.analysis.xprof import memory_budget
from xdiag.analysis.xprof.memory_budget import GIB, MEMORY_ENV

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "tests" / "profiles" / "h200"
MIB = 2**20


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


MEMINFO = "MemTotal:       24683664 kB\nMemFree:         1000000 kB\nMemAvailable:   20971520 kB\n"  # 20 GiB available


@pytest.fixture(autouse=True)
def _no_configured_budget(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)


def test_without_a_limited_cgroup_the_budget_is_a_share_of_memavailable(tmp_path):
    root = _tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/cgroup": "0::/\n",
                            "sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "123\n"})
    assert memory_budget.available(root) == (20 * GIB, "the machine has available")
    budget = memory_budget.budget(root)
    assert budget.bytes == int(20 * GIB * memory_budget.SHARE)
    assert budget.source == "80% of the 20.0 GiB the machine has available"


def test_a_v2_container_limit_less_its_unreclaimable_use_bounds_the_budget(tmp_path):
    """cgroup v2 at the process's own path (as /proc/self/cgroup names it); inactive file cache counts as free."""
    root = _tree(tmp_path, {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/jobs/train\n",
        "sys/fs/cgroup/jobs/train/memory.max": f"{8 * GIB}\n",
        "sys/fs/cgroup/jobs/train/memory.current": f"{3 * GIB}\n",
        "sys/fs/cgroup/jobs/train/memory.stat": f"anon {2 * GIB}\nfile {GIB}\ninactive_file {GIB}\nactive_file 0\n",
    })
    assert memory_budget.available(root) == (6 * GIB, "left under this container's memory limit")


def test_a_limit_on_a_parent_cgroup_binds_where_the_own_cgroup_has_none(tmp_path):
    """A systemd slice or a pod above the container may hold the limit: the least headroom on the way up counts,
    each level's use measured at that level (siblings' use included)."""
    v2 = _tree(tmp_path / "v2", {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/train.slice/job.scope\n",
        "sys/fs/cgroup/train.slice/job.scope/memory.max": "max\n",
        "sys/fs/cgroup/train.slice/job.scope/memory.current": f"{GIB}\n",
        "sys/fs/cgroup/train.slice/memory.max": f"{4 * GIB}\n",
        "sys/fs/cgroup/train.slice/memory.current": f"{3 * GIB}\n",
        "sys/fs/cgroup/train.slice/memory.stat": "inactive_file 0\n",
        "sys/fs/cgroup/memory.max": "max\n",
    })
    assert memory_budget.available(v2) == (GIB, "left under this container's memory limit")
    # both limited: the tighter headroom wins, here the container's own
    both = _tree(tmp_path / "both", {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/pod/container\n",
        "sys/fs/cgroup/pod/container/memory.max": f"{2 * GIB}\n",
        "sys/fs/cgroup/pod/container/memory.current": f"{GIB + GIB // 2}\n",
        "sys/fs/cgroup/pod/memory.max": f"{8 * GIB}\n",
        "sys/fs/cgroup/pod/memory.current": f"{2 * GIB}\n",
    })
    assert memory_budget.available(both)[0] == GIB // 2
    v1 = _tree(tmp_path / "v1", {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "4:memory:/batch/job\n",
        "sys/fs/cgroup/memory/batch/job/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/batch/job/memory.usage_in_bytes": f"{GIB}\n",
        "sys/fs/cgroup/memory/batch/memory.limit_in_bytes": f"{3 * GIB}\n",
        "sys/fs/cgroup/memory/batch/memory.usage_in_bytes": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory/batch/memory.stat": f"total_inactive_file {GIB // 2}\n",
    })
    assert memory_budget.available(v1)[0] == GIB + GIB // 2
    # a cgroup outside the namespace's view ("/.."): only the mount's root, the container's own, is read
    outside = _tree(tmp_path / "outside", {
        "proc/meminfo": MEMINFO,
        "proc/self/cgroup": "0::/../../system.slice/other\n",
        "sys/fs/cgroup/memory.max": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory.current": f"{GIB}\n",
    })
    assert memory_budget.available(outside)[0] == GIB


def test_a_v1_memory_cgroup_is_read_and_its_no_limit_value_ignored(tmp_path):
    membership = "12:pids:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n"
    limited = _tree(tmp_path / "limited", {
        "proc/meminfo": MEMINFO, "proc/self/cgroup": membership,
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": f"{4 * GIB}\n",
        "sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes": f"{GIB}\n",
        "sys/fs/cgroup/memory/process_api/abc/memory.stat": f"cache {GIB}\ntotal_inactive_file {GIB // 2}\n",
    })
    assert memory_budget.available(limited)[0] == 4 * GIB - GIB // 2
    unlimited = _tree(tmp_path / "unlimited", {
        "proc/meminfo": MEMINFO, "proc/self/cgroup": membership,
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes": f"{GIB}\n",
    })
    assert memory_budget.available(unlimited)[0] == 20 * GIB
    # a container whose cgroup namespace shows its own cgroup at the root of the mount
    namespaced = _tree(tmp_path / "namespaced", {
        "proc/meminfo": MEMINFO, "proc/self/cgroup": "4:memory:/\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{2 * GIB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB}\n",
    })
    assert memory_budget.available(namespaced)[0] == GIB


def test_with_nothing_to_read_there_is_no_budget_and_nothing_is_refused(tmp_path):
    assert memory_budget.available(tmp_path) is None
    assert memory_budget.budget(tmp_path) is None
    assert memory_budget.conversions_that_fit(10 * GIB, tmp_path) is None
    assert memory_budget.refusal(10 * GIB, tmp_path) is None


def test_the_configured_budget_replaces_the_measured_one(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"proc/meminfo": MEMINFO})
    monkeypatch.setenv(MEMORY_ENV, "1.5")
    assert memory_budget.budget(root) == memory_budget.Budget(int(1.5 * GIB), f"{MEMORY_ENV}=1.5")
    profile = 20 * MIB
    one = memory_budget.conversion_bytes(profile)
    assert memory_budget.conversions_that_fit(profile, root) == int(1.5 * GIB) // one
    for unusable in ("plenty", "inf"):  # not a finite number: as if unset
        monkeypatch.setenv(MEMORY_ENV, unusable)
        assert memory_budget.budget(root).bytes == int(20 * GIB * memory_budget.SHARE)


def test_a_refusal_gives_the_estimate_the_budget_and_what_to_do(tmp_path, monkeypatch):
    root = _tree(tmp_path, {"proc/meminfo": MEMINFO})  # a budget of 16 GiB
    fits = (16 * GIB - memory_budget.BASE_BYTES) // memory_budget.BYTES_PER_PROFILE_BYTE
    assert memory_budget.refusal(fits, root) is None
    reason = memory_budget.refusal(fits + 1, root)
    assert reason.startswith(f"XProf's converters would need about 16.0 GiB of memory for this session "
                             f"({(fits + 1) / MIB:.0f} MiB as XProf reads it, at an estimated 24 bytes per byte)")
    assert "more than the 16.0 GiB they may use (80% of the 20.0 GiB the machine has available)" in reason
    assert MEMORY_ENV in reason and "xdiag's own analysis does not need them" in reason
    monkeypatch.setenv(MEMORY_ENV, "0.01")
    assert "more than the 10 MiB they may use (XDIAG_XPROF_MEMORY_GIB=0.01)" in memory_budget.refusal(MIB, root)


def test_this_machines_available_memory_is_read():
    found = memory_budget.available()
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    assert found is not None and 0 < found[0] <= total


@pytest.mark.parametrize("profile", ["recompilation", "dispatch_bound"])
@pytest.mark.parametrize("converter", ["overview_page", "memory_profile"])
def test_the_estimate_is_above_what_xprofs_conversions_of_real_profiles_hold(profile, converter, tmp_path):
    """The two conversions a device analysis runs, of the copy XProf reads (the largest real H200 profiles here), each
    in a process of its own with the workers' malloc, measured as bench/xprof_memory.py measures them: the growth of
    its resident memory to its peak stays under the estimate. Not a benchmark: the estimate holds a margin of ~2x or
    more over these (bench/README.md has the figures)."""
    from xdiag.analysis.xprof.session_dir import copy_without_unused_events

    spec = importlib.util.spec_from_file_location("xprof_memory", REPO / "bench" / "xprof_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run_dir = tmp_path / "plugins" / "profile" / "session"
    run_dir.mkdir(parents=True)
    copy = run_dir / f"{profile}.xplane.pb"
    if not any(copy_without_unused_events(H200 / copy.name, copy)):  # the private copy XprofViews gives XProf
        shutil.copy(H200 / copy.name, copy)
    grown = bench.grown_bytes(run_dir, converter, tmp_path)
    assert 0 < grown < memory_budget.conversion_bytes(copy.stat().st_size), (grown, copy.stat().st_size)


def _writable_memory_cgroup(name: str) -> tuple[Path, str] | None:
    """A new child of this process's memory cgroup, and the name of its limit file; None where none can be made
    (not root, or no memory controller delegated here)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            parent, limit = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
            control = parent / "cgroup.subtree_control"
            if not control.exists() or "memory" not in control.read_text().split():
                continue
        elif "memory" in controllers.split(","):
            parent, limit = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes"
        else:
            continue
        try:
            (parent / name).mkdir()
        except OSError:
            continue
        return parent / name, limit
    return None


def _available_inside(cgroup: Path) -> tuple[int, str, str]:
    """What a fresh Python process put in `cgroup` reads: (bytes left, what they are, the budget's source)."""
    code = ("from xdiag.analysis.xprof import memory_budget; found = memory_budget.available(); "
            "print(found[0], found[1]); print(memory_budget.budget().source)")
    done = subprocess.run(["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$0" -c "$1"', sys.executable,
                           code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, source = done.stdout.splitlines()
    left, where = first.split(" ", 1)
    return int(left), where, source


def test_a_real_memory_cgroup_limit_is_what_the_budget_is_set_against(tmp_path):
    """A process in a memory cgroup limited to 512 MiB (made here, where this machine lets us) reads that limit less
    its own use, below the machine's MemAvailable, as what its conversions may take a share of; and so does a process
    in an unlimited cgroup made under that one (the limit on its parent binds it)."""
    made = _writable_memory_cgroup(f"xdiag-test-{os.getpid()}")
    if made is None:
        pytest.skip("no memory cgroup this test may create here (it needs root, or a delegated memory controller)")
    cgroup, limit_file = made
    child = cgroup / "unlimited"
    try:
        (cgroup / limit_file).write_text(str(512 * MIB))
        left, where, source = _available_inside(cgroup)
        assert where == "left under this container's memory limit"
        assert 256 * MIB < left < 512 * MIB  # the limit less what Python and xdiag's import took
        assert source.startswith("80% of the ") and source.endswith(" MiB left under this container's memory limit")

        if limit_file == "memory.max":  # v2: the child gets a memory controller of its own only if delegated
            (cgroup / "cgroup.subtree_control").write_text("+memory")
        child.mkdir()
        assert int((child / limit_file).read_text().replace("max", str(2**63))) >= 2**60  # no limit of its own
        left, where, _ = _available_inside(child)
        assert where == "left under this container's memory limit"
        assert 256 * MIB < left < 512 * MIB
    finally:
        for folder in (child, cgroup):
            with contextlib.suppress(OSError):
                folder.rmdir()
