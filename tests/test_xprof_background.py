"""XProf's views beside the analysis (xdiag.analysis.xprof.background): the report's figures are the same whether the
views ran in line or in a process of their own, a report that does not wait for them says which are missing and
why, and a second analysis of the same file version takes them from what the first kept."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from xdiag.agent.result_cache import ResultCache, answer_tool
from xdiag.analysis.xprof import analysis_views, background
from xdiag.analysis.xprof.worker import CONCURRENCY_ENV
from xdiag.cloud.embedded import analyze_session, build_embedded
from xdiag.profile.locate import locate_session

TPU_CAPTURE = Path(__file__).parent / "profiles" / "tpu_v5e" / "host_sync.xplane.pb"
_TIMING = re.compile(r"\d+(\.\d+)?\s?(µs|ms|s)\b")
_DATE = re.compile(r"\d{4}-\d\d-\d\dT[\d:.+]+")


def _render(out: Path) -> str:
    """summary.html with what differs between two runs of the same analysis masked: timings, dates, the folder."""
    text = (out / "summary.html").read_text()
    return _DATE.sub("DATE", _TIMING.sub("TIME", text.replace(str(out), "OUT")))


def _analyze(profile: Path, out: Path, views) -> tuple:
    located = locate_session(profile, None)
    deps = build_embedded(started_views=(located.files, views))
    return analyze_session(located, out, deps_and_bus=deps), _render(out)


def _wait_for_record(folder: Path, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while (recorded := background.read_record(folder)) is None:
        assert not (folder / background.FAILED).exists(), (folder / background.FAILED).read_text()
        assert time.monotonic() < deadline, "the converter did not record the views in time"
        time.sleep(0.1)
    return recorded


@pytest.fixture()
def capture(tmp_path) -> Path:
    """A private copy: its own file version, so its own folder in the local cache."""
    target = tmp_path / "profile" / TPU_CAPTURE.name
    target.parent.mkdir()
    shutil.copyfile(TPU_CAPTURE, target)
    return target


def test_the_report_is_the_same_with_the_views_in_line_or_beside(capture, tmp_path, monkeypatch):
    monkeypatch.setenv(CONCURRENCY_ENV, "0")  # in line: every conversion in this process, as the analysis asks
    in_line = analysis_views([capture], None, tmp_path / "unused", wait_s=0)
    assert in_line is not None and not isinstance(in_line, background.BackgroundViews)
    analysis_in_line, render_in_line = _analyze(capture, tmp_path / "in-line", in_line)

    monkeypatch.setenv(CONCURRENCY_ENV, "1")  # beside: a process of their own, waited for
    folder = ResultCache.from_env().views_folder([capture])
    beside = analysis_views([capture], None, folder, wait_s=300)
    assert isinstance(beside, background.BackgroundViews) and beside.pid is not None
    analysis_beside, render_beside = _analyze(capture, tmp_path / "beside", beside)

    assert background.read_record(folder) is not None
    assert analysis_beside.result == analysis_in_line.result
    assert render_beside == render_in_line
    kpi = (tmp_path / "beside" / "tools" / "get_kpi_metrics.json").read_text()
    assert '"xprof_step_time_ms"' in kpi  # XProf's figures are in it, not only xdiag's


def test_a_report_that_does_not_wait_says_which_views_are_missing_and_the_next_takes_them(capture, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv(CONCURRENCY_ENV, "1")
    folder = ResultCache.from_env().views_folder([capture])
    first = analysis_views([capture], None, folder, wait_s=0)
    assert isinstance(first, background.BackgroundViews) and first.pid is None  # started when the analysis ends
    analysis_first, render_first = _analyze(capture, tmp_path / "first", first)
    overview = (tmp_path / "first" / "tools" / "get_xprof_overview.json").read_text()
    assert "converted after this analysis" in overview and str(folder) in overview
    assert "XProf&#39;s view: not available" in render_first or "XProf's view: not available" in render_first

    recorded = _wait_for_record(folder)  # the converter the first analysis started as it closed its views
    assert "overview" in recorded["views"]
    second = analysis_views([capture], None, folder, wait_s=0)
    analysis_second, render_second = _analyze(capture, tmp_path / "second", second)
    assert analysis_second.result == analysis_first.result  # the verdict never waited for XProf's views
    assert analysis_second.diagnosis.findings == analysis_first.diagnosis.findings

    monkeypatch.setenv(CONCURRENCY_ENV, "0")
    _, render_in_line = _analyze(capture, tmp_path / "in-line",
                                 analysis_views([capture], None, tmp_path / "no-record", wait_s=0))
    assert render_second == render_in_line

    text, status = answer_tool([capture], "s", "get_xprof_overview", {}, ResultCache.from_env(), 2**31)
    assert status == "ok" and '"xprof_duty_cycle_percent"' in text  # `xdiag tool` and MCP answer from the record


def test_views_no_tool_asked_for_are_never_converted(capture, tmp_path, monkeypatch):
    """An analysis that ended before any tool asked (a read that failed) leaves no converter behind."""
    monkeypatch.setenv(CONCURRENCY_ENV, "1")
    folder = tmp_path / "views"
    views = analysis_views([capture], None, folder, wait_s=0)
    assert isinstance(views, background.BackgroundViews)
    views.close()
    assert views.pid is None and not folder.exists()


@pytest.mark.parametrize("profile", [
    Path(__file__).parent / "profiles" / "tpu_v5e" / "kv_decode.xplane.pb",
    Path(__file__).parent / "profiles" / "tpu_v5e" / "near_hbm_limit.xplane.pb",
    Path(__file__).parent / "profiles" / "h200" / "recompilation.xplane.pb",
])
def test_memory_profile_reads_the_host_planes_alone(profile, tmp_path, monkeypatch):
    """The view answered in line (background.IN_LINE_VIEWS) from a copy without the device planes is XProf's view of
    the whole file, field for field."""
    from xdiag.analysis.xprof.session_dir import copy_without_device_planes
    from xdiag.analysis.xprof.views import XprofViews

    monkeypatch.setenv(CONCURRENCY_ENV, "0")
    copy = tmp_path / profile.name
    left_out = copy_without_device_planes(profile, copy)
    assert left_out > 0 and copy.stat().st_size == profile.stat().st_size - left_out
    with XprofViews([profile]) as whole, XprofViews([copy]) as host_planes:
        assert host_planes.memory_profile() == whole.memory_profile()
        assert host_planes.peak_allocations() == whole.peak_allocations()


def test_views_that_would_not_fit_in_memory_are_refused_but_the_memory_figures_come(tmp_path, monkeypatch):
    """A session whose XProf conversions would not fit (a 2 GB host on a workstation) starts no converter and makes
    no private copy; its memory figures, which XProf's memory_profile gives, still come, from the host planes."""
    import json

    capture = tmp_path / "profile" / "kv_decode.xplane.pb"  # 6.3 MiB, 0.7 of it outside its device plane
    capture.parent.mkdir()
    shutil.copyfile(TPU_CAPTURE.with_name(capture.name), capture)
    monkeypatch.setenv(CONCURRENCY_ENV, "1")
    monkeypatch.setenv("XDIAG_XPROF_MEMORY_GIB", "0.1")  # under the whole file's estimate, over its host planes'
    folder = tmp_path / "views"
    views = analysis_views([capture], None, folder, wait_s=0)
    assert isinstance(views, background.BackgroundViews) and views.refused
    _analyze(capture, tmp_path / "refused", views)
    assert not folder.exists()  # no converter, now or when the analysis ended
    assert "would need about" in (tmp_path / "refused" / "tools" / "get_xprof_overview.json").read_text()

    monkeypatch.delenv("XDIAG_XPROF_MEMORY_GIB")
    monkeypatch.setenv(CONCURRENCY_ENV, "0")
    _analyze(capture, tmp_path / "in-line", analysis_views([capture], None, tmp_path / "unused", wait_s=0))
    memory = [json.loads((tmp_path / out / "tools" / "get_memory_profile.json").read_text())
              for out in ("refused", "in-line")]
    for result in memory:
        result.pop("duration_ms")
    assert memory[0]["detail"]["xprof"]["peak_hbm_gib"] > 0
    assert memory[0] == memory[1]


def test_a_kept_record_is_served_only_verified(tmp_path):
    """XProf's kept views are served as the result cache's answers are: a record planted, truncated or flipped is
    not read (the next analysis converts afresh), one written with its digest is."""
    from xdiag.fresh_files import replace_with, with_digest

    recorded = {"views": {"overview": {"xprof_duty_cycle_percent": 91.5}}}
    folder = tmp_path / "views"
    folder.mkdir()
    background.record_path(folder).write_text(json.dumps(recorded))  # planted: no digest
    assert background.read_record(folder) is None
    kept = with_digest(json.dumps(recorded).encode())
    replace_with(background.record_path(folder), kept[:-3], mode=0o600)  # truncated
    assert background.read_record(folder) is None
    replace_with(background.record_path(folder), kept.replace(b"91.5", b"19.5"), mode=0o600)  # flipped
    assert background.read_record(folder) is None
    replace_with(background.record_path(folder), kept, mode=0o600)
    assert background.read_record(folder) == recorded


def test_a_view_about_to_wait_hands_back_the_memory_the_analysis_freed_once(tmp_path, monkeypatch):
    """Waiting for the converter's record, the analysis first hands what malloc keeps of its freed memory back to the
    system (once, however long it waits): the two processes' memory at once is what `--xprof-wait` costs. A record
    already there is read without it."""
    import os

    from xdiag.fresh_files import replace_with, with_digest
    from xdiag.profile import reader

    trims = []
    monkeypatch.setattr(reader, "return_freed_memory_to_the_os", lambda: trims.append(time.monotonic()))
    folder = tmp_path / "views"
    folder.mkdir()
    waiting = background.BackgroundViews([tmp_path / "host.xplane.pb"], folder, os.getpid(), wait_s=0.3)
    assert waiting.stored() is None and len(trims) == 1  # the converter (alive: this process) recorded nothing
    replace_with(background.record_path(folder), with_digest(json.dumps({"views": {}}).encode()), mode=0o600)
    kept = background.BackgroundViews([tmp_path / "host.xplane.pb"], folder, os.getpid(), wait_s=0.3)
    assert kept.stored() is not None and len(trims) == 1


def test_sigterm_to_the_converter_takes_its_private_copy_with_it(tmp_path, monkeypatch):
    """The detached converter, sent SIGTERM while it converts, ends and removes what it made in TMPDIR (278 MiB of
    private copy were left on a large capture)."""
    import os
    import signal

    import psutil

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # the converter's environment is this process's
    pid = background.start_converter([Path(shutil.copyfile(TPU_CAPTURE, tmp_path / TPU_CAPTURE.name))],
                                     tmp_path / "views")
    assert pid is not None
    converter = psutil.Process(pid)
    deadline = time.monotonic() + 120
    while converter.is_running() and time.monotonic() < deadline and not any(
            p.name.startswith("xdiag-xprof") for p in temporary.iterdir()):
        time.sleep(0.005)
    assert converter.is_running() and converter.status() != psutil.STATUS_ZOMBIE, "converted before it was stopped"
    os.kill(pid, signal.SIGTERM)
    converter.wait(timeout=120)
    deadline = time.monotonic() + 30  # its conversion workers end with it
    while (left := [p.name for p in temporary.iterdir() if p.name.startswith("xdiag")]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def test_the_converter_runs_on_the_workers_malloc_at_a_lower_priority_unless_waited_for(tmp_path, monkeypatch):
    """The detached converter starts with the malloc XProf's workers preload (worker.allocator_environment), its
    caller's own LD_PRELOAD kept where it has one, and lowers its priority only where no report waits for it."""
    import subprocess

    from xdiag.analysis.xprof import worker

    started: list[tuple[list[str], dict]] = []

    class Started:
        pid = 4242

    def popen(arguments, **kwargs):
        started.append((arguments, kwargs["env"]))
        return Started()

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(background, "converting_pid", lambda folder: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(worker.ALLOCATOR_ENV, raising=False)
    files = [tmp_path / "host.xplane.pb"]
    assert background.background_views(files, tmp_path / "waited", wait_s=5).pid == 4242
    assert background.start_converter(files, tmp_path / "after") == 4242
    (waited, waited_env), (after, _) = started
    assert "--niceness=0" in waited and f"--niceness={background.CONVERTER_NICENESS}" in after
    library = worker.allocator_library()
    if library is not None:  # the pinned mimalloc wheel is there
        assert waited_env["LD_PRELOAD"] == library and waited_env["MIMALLOC_ALLOW_THP"] == "0"
    monkeypatch.setenv("LD_PRELOAD", "/caller/own.so")
    background.start_converter(files, tmp_path / "own")
    assert started[-1][1]["LD_PRELOAD"] == "/caller/own.so"


def test_the_tools_that_read_the_converters_record_run_after_xdiags_own():
    """An analysis publishes the broad tools that read XProf's converted views last, so that where the report waits
    for the converter xdiag's own tools run beside it; those are exactly the tools asking for a view that is not
    answered in line (background.IN_LINE_VIEWS)."""
    import inspect
    import re
    import types

    from xdiag.pipeline.stages.collect import publish_tool_runs
    from xdiag.tools import BROAD_TOOLS, REGISTRY, XPROF_RECORD_TOOLS

    published: list[str] = []
    bus = types.SimpleNamespace(publish_all=lambda topic, messages: published.extend(m.tool for m in messages))
    names = publish_tool_runs(types.SimpleNamespace(bus=bus), types.SimpleNamespace(analysis_id="a"), done=set())
    assert names == published and sorted(names) == sorted(BROAD_TOOLS)
    assert set(names[-len(XPROF_RECORD_TOOLS):]) == XPROF_RECORD_TOOLS
    reading = set()
    for tool in BROAD_TOOLS:
        source = inspect.getsource(inspect.getmodule(REGISTRY[tool].func))
        views = set(re.findall(r"try_view\(\s*session,\s*\"(\w+)\"", source))
        views |= set(re.findall(r"views\(session\)\.(\w+)\(", source))
        if views - background.IN_LINE_VIEWS:
            reading.add(tool)
    assert reading == XPROF_RECORD_TOOLS
