"""Many-host sessions read host by host (issue 37): each host decoded by a worker process into its own mapped file
(xdiag.profile.hosts_map). The session, and so every tool and finding, must be the one the one-process read gives,
on real multi-process JAX CPU captures (the straggler workloads: two processes in lockstep over jax.distributed), and
grown to pod size by copying their real host files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.errors import ProfileError
from xdiag.profile.locate import locate_session
from xdiag.profile.session import BY_HOST_ENV, read_session
from xdiag.tools import REGISTRY, run_tool


def _hosts(session_dir: Path) -> list[Path]:
    return sorted(session_dir.glob("*.xplane.pb"))


def _pod(folder: Path, session_dir: Path, hosts: int) -> Path:
    """`hosts` real host files: the straggler's once, the other process's file for every other host."""
    folder.mkdir()
    fast, slow = (next(p for p in _hosts(session_dir) if p.name.endswith(f"process{k}.xplane.pb")) for k in (0, 1))
    for k in range(hosts - 1):
        shutil.copyfile(fast, folder / f"{fast.name.removesuffix('.xplane.pb')}_copy{k:03d}.xplane.pb")
    shutil.copyfile(slow, folder / slow.name)
    return folder


def _columns(session) -> dict:
    """Everything a session holds, by where it is: each host's planes, lines, columns (as values), HLO modules."""
    out: dict = {"session": (session.name, session.origin_ns)}
    for host in session.hosts:
        out[host.hostname] = (str(host.path), host.size_bytes, host.errors, host.warnings)
        for plane in host.planes:
            out[(host.hostname, plane.id)] = (plane.name, plane.host, plane.event_names, plane.event_display_names,
                                              plane.event_metadata_stats, plane.stats, plane.strings)
            for number, line in enumerate(plane.lines):
                key = (host.hostname, plane.id, number)
                out[key] = (line.id, line.name, line.display_name, line.timestamp_ns)
                out[(*key, "metadata_id")] = np.asarray(line.metadata_id)
                out[(*key, "start_ps")], out[(*key, "duration_ps")] = line.starts.ps(), line.durations.ps()
                for kind, columns in (("numeric", line.numeric), ("strings", line.strings)):
                    for name in columns.keys():
                        index, values = columns.sparse(name)
                        out[(*key, kind, name)] = (np.asarray(index), np.asarray(values))
    for module in session.hlo_modules:
        out[("module", module.name, module.program_id)] = (module.host, module.entry, module.computations)
    return out


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("workload", ["straggler_input", "straggler_compute"])
def test_the_host_by_host_read_is_the_one_process_read_column_for_column(workload, lockstep, tmp_path):
    paths = _hosts(_pod(tmp_path / "pod", lockstep[workload], 3))
    one = _columns(read_session(paths, by_host=False))
    mapped = read_session(paths, by_host=True)
    assert all(host.pages is not None for host in mapped.hosts)  # it did go through the workers' mapped files
    many = _columns(mapped)
    assert list(many) == list(one) and len(one) > 50
    assert [key for key in one if not _same(one[key], many[key])] == []


def _tool_answers(out: Path) -> dict[str, dict]:
    answers = {}
    for path in sorted((out / "tools").glob("*.json")):
        result = json.loads(path.read_text())
        answers[path.stem] = {key: result.get(key) for key in ("status", "reason", "summary", "detail")}
    return answers


def test_a_many_host_analysis_says_what_the_one_process_analysis_says(lockstep, tmp_path, monkeypatch):
    """Findings, step times and the per-host table, and every other tool's answer, of an 8-host session."""
    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 8)
    analyses = {}
    for by_host in ("1", "0"):
        monkeypatch.setenv(BY_HOST_ENV, by_host)
        analysis = analyze_session(locate_session(folder), tmp_path / f"out-{by_host}")
        analyses[by_host] = (analysis, _tool_answers(tmp_path / f"out-{by_host}"))
    (mapped, mapped_tools), (one, one_tools) = analyses["1"], analyses["0"]
    assert mapped.status == one.status
    assert [f.model_dump() for f in mapped.diagnosis.findings] == [f.model_dump() for f in one.diagnosis.findings]
    assert mapped.diagnosis.findings[0].key == "straggler_host"
    assert set(mapped_tools) == set(one_tools) and len(one_tools) >= sum(spec.broad for spec in REGISTRY.values())
    assert mapped_tools == one_tools
    assert len(one_tools["get_hosts"]["detail"]["hosts"]) == 8
    assert one_tools["get_step_trace"]["summary"]["steps"] > 0


def test_a_corrupt_host_among_good_ones_is_named(lockstep, tmp_path):
    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 4)
    good = _hosts(folder)[1]
    cut = folder / "vm_process0_copy001.xplane.pb"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ProfileError) as one:
        read_session(_hosts(folder), by_host=False)
    with pytest.raises(ProfileError) as mapped:
        read_session(_hosts(folder), by_host=True)
    assert str(mapped.value) == str(one.value)
    assert str(mapped.value).startswith(f"{cut.name}: truncated")


def test_a_host_that_is_not_a_profile_is_named_and_nothing_is_left_behind(lockstep, tmp_path):
    import tempfile

    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 3)
    (folder / "vm_process0_copy000.xplane.pb").write_bytes(b"")
    before = set(Path(tempfile.gettempdir()).glob("xdiag-hosts-*"))
    with pytest.raises(ProfileError, match=r"^vm_process0_copy000\.xplane\.pb: empty file"):
        read_session(_hosts(folder), by_host=True)
    assert set(Path(tempfile.gettempdir()).glob("xdiag-hosts-*")) == before


def test_the_straggler_among_32_hosts_is_named(lockstep, tmp_path):
    """31 copies of the host that waits in every all-reduce and the one that prepares its input on the host: the
    per-host table has 32 rows and the straggler is the one real late host, whose own breakdown says why."""
    session_dir = lockstep["straggler_input"]
    folder = _pod(tmp_path / "pod", session_dir, 32)
    session = read_session(_hosts(folder))
    hosts = run_tool(session, "get_hosts")
    assert hosts.ok, hosts.reason
    slow = next(h["host"] for h in hosts.detail["hosts"] if h["host"].endswith("process1"))
    assert hosts.summary["hosts"] == 32 and len(hosts.detail["hosts"]) == 32
    assert hosts.summary["straggler"] == slow
    assert hosts.summary["straggler_last_arrival_share_percent"] >= 80
    assert hosts.summary["straggler_cause"] == "host_other"
    analysis = analyze_session(locate_session(folder), tmp_path / "out")
    finding = analysis.diagnosis.findings[0]
    assert finding.key == "straggler_host" and slow in finding.title


def test_a_worker_that_dies_is_reported_with_its_last_words(lockstep, tmp_path):
    """Not a ProfileError inside the worker (here a worker that cannot start: its module is missing): the session's
    read fails naming the file and what the worker said."""
    from xdiag.profile.hosts_map import read_session_by_host

    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 3)
    with pytest.raises(ProfileError, match=r"^vm_process0_copy000\.xplane\.pb: the host's reader exited with status 1: "
                                           r".*No module named xdiag.profile.no_such_worker"):
        read_session_by_host(_hosts(folder), worker="xdiag.profile.no_such_worker")


def test_a_folder_in_place_of_a_host_file_is_refused_in_one_line(lockstep, tmp_path):
    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 3)
    (folder / "vm_process0_copy000.xplane.pb").unlink()
    (folder / "vm_process0_copy000.xplane.pb").mkdir()
    with pytest.raises(ProfileError, match=r"^vm_process0_copy000\.xplane\.pb: not a regular file \(a folder"):
        read_session(_hosts(folder), by_host=True)


def test_a_64_host_report_puts_the_straggler_first_and_shows_the_spread(lockstep, tmp_path):
    """At pod scale the hosts section is read from the top: the straggler is the first row of the hosts table (not
    row 64 of equal rows), a table gives the spread of step times and waits over the hosts, the breakdown bars
    show the hosts at both ends, and the aligned step draws the first and last to arrive, the straggler outlined."""
    folder = _pod(tmp_path / "pod", lockstep["straggler_input"], 64)
    analysis = analyze_session(locate_session(folder), tmp_path / "out")
    assert analysis.diagnosis.findings[0].key == "straggler_host"
    hosts = json.loads((tmp_path / "out" / "tools" / "get_hosts.json").read_text())
    straggler = hosts["summary"]["straggler"]
    assert straggler.endswith("process1")
    html = (tmp_path / "out" / "summary.html").read_text()
    section = html[html.index('id="hosts"'):html.index('id="step-time"')]
    assert "Over the 64 hosts" in section and "waiting in collectives per step" in section
    table = section[section.index("One row per host"):]
    first_row = table[table.index("<tbody"):][: table[table.index("<tbody"):].index("</tr>")]
    assert straggler in first_row
    assert section.count('<div class="rowbar">') == 10
    assert "16 of the 64 participants (the 8 first and the 8 last to arrive)" in section
    chart = section[section.index("<svg", section.index("16 of the 64 participants")):]
    chart = chart[: chart.index("</svg>")]
    assert chart.count('class="coll last"') == 1 and chart.count('class="coll') == 16 and straggler in chart
