"""`xdiag analyze` as a user runs it: a real process, real files, exit codes and messages."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.tools import BROAD_TOOLS

from tests.conftest import TESTS, shared_profile


def _xdiag(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_analyze_writes_tools_analysis_and_report(cpu_profiles, tmp_path):
    done = _xdiag("analyze", str(cpu_profiles["recompilation"]), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = Path(done.stdout.strip())
    assert report == (tmp_path / "o" / "summary.html").resolve() and report.exists()
    assert sorted(p.stem for p in (tmp_path / "o" / "tools").glob("*.json") if not p.stem.startswith("followup")) == sorted(BROAD_TOOLS)
    analysis = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert analysis["result"] == "NEEDS_ATTENTION"
    assert analysis["diagnosis"]["findings"][0]["key"] == "recompile_per_shape"
    assert {"read", "tools", "investigate", "render"} <= set(analysis["timings_ms"])
    assert "tool" in done.stderr and f"{len(BROAD_TOOLS)}/{len(BROAD_TOOLS)}" in done.stderr  # progress lines


def test_the_commands_read_ahead_gives_the_tools_what_the_pipelines_own_read_gives(cpu_profiles, tmp_path,
                                                                                    monkeypatch):
    """`xdiag analyze` reads a one-file session in a thread from the moment it is located, under its imports
    (xdiag.profile.session.ReadAhead); the pipeline run in-process reads the file itself: every tool's answer and
    the diagnosis are the same (the code quoted too, where the pipeline may read the recorded paths as the command
    does)."""
    from xdiag.analysis.source_code import RECORDED_PATHS_ENV
    from xdiag.cloud.embedded import analyze_session
    from xdiag.profile.locate import locate_session

    monkeypatch.setenv(RECORDED_PATHS_ENV, "1")

    profile = cpu_profiles["recompilation"]
    done = _xdiag("analyze", str(profile), "--out", str(tmp_path / "command"), "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    analyze_session(locate_session(profile, None), tmp_path / "in_process")

    def answers(out: Path) -> dict:
        found = {}
        for path in sorted((out / "tools").glob("*.json")):
            result = json.loads(path.read_text())
            result.pop("duration_ms")
            found[path.name] = result
        return found

    command, in_process = answers(tmp_path / "command"), answers(tmp_path / "in_process")
    assert len(command) > len(BROAD_TOOLS) and command == in_process  # the broad tools and the follow-ups
    diagnosis = {out: json.loads((tmp_path / out / "analysis.json").read_text())["diagnosis"]
                 for out in ("command", "in_process")}
    assert diagnosis["command"]["findings"] and diagnosis["command"] == diagnosis["in_process"]


def test_default_output_folder_is_named_after_the_session(cpu_profiles, tmp_path):
    run_dir = cpu_profiles["healthy"].parents[3]  # <run>/plugins/profile/<session>/host.xplane.pb
    done = _xdiag("analyze", str(run_dir), "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    session = cpu_profiles["healthy"].parent.name
    assert Path(done.stdout.strip()) == (tmp_path / "xdiag-out" / session / "summary.html").resolve()


def test_the_default_output_folder_never_holds_another_profile_s_analysis(tmp_path):
    """Two profiles both named run.xplane.pb (or one captured again): the second goes to xdiag-out/run-2; analysing
    the first again replaces only its own analysis."""
    same = TESTS / "profiles" / "same_program" / "tpu_v5e" / "healthy"
    for side, capture in (("a", "a0"), ("b", "b1")):
        (tmp_path / side).mkdir()
        packed = (same / f"{capture}.xplane.pb.xz").read_bytes()
        (tmp_path / side / "run.xplane.pb").write_bytes(lzma.decompress(packed))
    for side, folder in (("a", "run"), ("b", "run-2"), ("a", "run")):
        done = _xdiag("analyze", f"{side}/run.xplane.pb", "-q", "--no-xprof-views", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert Path(done.stdout.strip()) == (tmp_path / "xdiag-out" / folder / "summary.html").resolve()
        analysis = json.loads((tmp_path / "xdiag-out" / folder / "analysis.json").read_text())
        assert analysis["profile_uris"] == [str((tmp_path / side / "run.xplane.pb").resolve())]
    assert sorted(p.name for p in (tmp_path / "xdiag-out").iterdir()) == ["run", "run-2"]


def _file(folder: Path, name: str, content: bytes) -> Path:
    (folder / name).write_bytes(content)
    return folder / name


def _folder(folder: Path, name: str) -> Path:
    (folder / name).mkdir()
    return folder / name


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.xplane.pb", "no such file or directory"),
        (lambda d: _folder(d, "empty-dir"), "no *.xplane.pb files"),
        (lambda d: _file(d, "e.xplane.pb", b""), "empty file (0 bytes)"),
        (lambda d: _file(d, "r.xplane.pb", os.urandom(3000)), "xdiag: r.xplane.pb"),
        (lambda d: _file(d, "config.json", b'{"lr": 0.1}'), "neither an XProf profile nor a Chrome/Kineto trace"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line_reason(tmp_path, make, message):
    target = make(tmp_path)
    before = target.read_bytes() if target.is_file() else None
    done = _xdiag("analyze", str(target), "--out", str(tmp_path / "o"), "-q", cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("xdiag:")]) == 1
    if before is not None:
        assert target.read_bytes() == before


def test_mangled_profile_reason_names_the_text_transfer(tmp_path):
    mangled = shared_profile("bad/tpu_v6e_inference_text_mangled.xplane.pb")
    done = _xdiag("analyze", str(mangled), "--out", str(tmp_path / "o"), "-q", cwd=tmp_path)
    assert done.returncode == 2 and "text-mode transfer" in done.stderr
    assert "FAILED" in (tmp_path / "o" / "summary.html").read_text()


def test_one_tool_prints_json(cpu_profiles, tmp_path):
    done = _xdiag("tool", "get_step_trace", str(cpu_profiles["healthy"]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["steps"] == 15


def test_help_lists_the_commands(tmp_path):
    done = _xdiag("--help", cwd=tmp_path)
    assert done.returncode == 0
    for command in ("analyze", "tools", "tool", "demo"):
        assert command in done.stdout


def test_no_xprof_views_turns_the_converters_off_and_says_so(tmp_path, h200_profiles):
    done = _xdiag("analyze", str(h200_profiles["widening_convert"]), "--out", str(tmp_path / "o"), "-q", "--no-xprof-views", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    suggestions = json.loads((tmp_path / "o" / "tools" / "get_smart_suggestions.json").read_text())
    assert suggestions["status"] == "not_available" and "XDIAG_XPROF_VIEWS=0" in suggestions["reason"]
    # The roofline keeps xdiag's own figures against the checked peaks and says where XProf's went.
    roofline = json.loads((tmp_path / "o" / "tools" / "get_roofline_model.json").read_text())
    assert "XDIAG_XPROF_VIEWS=0" in roofline["detail"]["xprof"]["reason"]


def test_xprofs_views_that_would_not_fit_in_memory_are_skipped_with_the_reason_in_the_report(
        tmp_path, h200_profiles, monkeypatch):
    """Less memory than XProf's conversions need (a budget of 10 MiB here): the analysis still finishes with xdiag's
    own findings, and the tools and the report say why XProf's views are missing and what to do."""
    monkeypatch.setenv("XDIAG_XPROF_MEMORY_GIB", "0.01")
    done = _xdiag("analyze", str(h200_profiles["recompilation"]), "--out", str(tmp_path / "o"), "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    analysis = json.loads((tmp_path / "o" / "analysis.json").read_text())
    assert analysis["status"] == "DONE" and analysis["diagnosis"]["findings"][0]["key"] == "recompile_per_shape"
    overview = json.loads((tmp_path / "o" / "tools" / "get_xprof_overview.json").read_text())
    reason = json.dumps(overview)
    assert "XProf's converters would need about" in reason and "XDIAG_XPROF_MEMORY_GIB=0.01" in reason
    report = (tmp_path / "o" / "summary.html").read_text()
    assert "XProf&#39;s converters would need about" in report and "set XDIAG_XPROF_MEMORY_GIB to allow more" in report


def test_in_process_commands_leave_the_callers_garbage_collector_alone(cpu_profiles, tmp_path):
    """`xdiag` as its own process freezes the collector after its imports and at exit (faster, bench/README.md); a
    program that runs a command in-process keeps its collector as it was."""
    import gc

    from typer.testing import CliRunner
    from xdiag.cli import app

    frozen = gc.get_freeze_count()
    result = CliRunner().invoke(app, ["analyze", str(cpu_profiles["healthy"]), "--out", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "summary.html").exists()
    assert gc.get_freeze_count() == frozen
    assert gc.isenabled()


OWN_PROCESS_ANALYZE = """
import gc, json, os, sys
pipeline_imports = os.path.join("xdiag", "cloud", "embedded.py")
collections = []  # the generation of each collection that ran inside the pipeline's imports

def watch(phase, info):
    frame = sys._getframe(0)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_code.co_filename.endswith(pipeline_imports):
            collections.append(info["generation"])
            return
        frame = frame.f_back

gc.callbacks.append(lambda phase, info: phase == "start" and watch(phase, info))
sys.argv = ["xdiag", "analyze", sys.argv[1], "--out", sys.argv[2], "-q"]
from xdiag.cli import main
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
import ctypes, ctypes.util, platform, tempfile
heaps = None  # glibc's malloc arenas, as malloc_info lists them
if platform.libc_ver()[0] == "glibc":
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.fdopen.restype = ctypes.c_void_p
    with tempfile.TemporaryFile() as info:
        stream = ctypes.c_void_p(libc.fdopen(os.dup(info.fileno()), b"w"))
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        info.seek(0)
        heaps = info.read().decode().count("<heap nr=")
print(json.dumps({"collections": collections, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "malloc_heaps": heaps}))
"""


def _analyze_in_its_own_process(profile: Path, tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", OWN_PROCESS_ANALYZE, str(profile), str(tmp_path / "o")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o" / "summary.html").exists()
    return json.loads(done.stdout.splitlines()[-1])


def test_analyze_in_its_own_process_imports_the_pipeline_with_the_collector_paused(h200_profiles, tmp_path):
    """`xdiag` as its own process: the modules `analyze` imports and the session its read decodes under them live as
    long as the process, so no collection runs over them while they are made (they took 85-195 ms of the 19.3 MiB
    CPU bench capture's analysis); they are frozen after, and the collector runs again for the analysis."""
    seen = _analyze_in_its_own_process(h200_profiles["healthy"], tmp_path)
    assert seen["collections"] == []
    assert seen["enabled"] and seen["frozen"] > 0


def test_analyze_in_its_own_process_allocates_from_one_malloc_arena(h200_profiles, tmp_path):
    """Its read's threads allocate from the main thread's arena: memory one frees, the next reuses (a fifth less
    peak memory on the 19.3 MiB CPU bench capture)."""
    seen = _analyze_in_its_own_process(h200_profiles["healthy"], tmp_path)
    if seen["malloc_heaps"] is None:
        pytest.skip("the C library is not glibc")
    assert seen["malloc_heaps"] == 1


ANALYZE_AND_LIST_MODULES = """
import json, sys
at_startup = set(sys.modules)  # a namespace package's .pth (google.cloud's) is there before anything is imported
from typer.testing import CliRunner
from xdiag.cli import app
done = CliRunner().invoke(app, ["analyze", sys.argv[1], "--out", sys.argv[2], "-q"])
assert done.exit_code == 0, done.output
print(json.dumps(sorted(set(sys.modules) - at_startup)))
"""
IN_PROCESS_CLOUD = {"xdiag.cloud", "xdiag.cloud.embedded", "xdiag.cloud.memory"}  # the bus and stores analyze runs on


def test_analyze_imports_only_what_it_runs(h200_profiles, tmp_path):
    """A whole `xdiag analyze` in a fresh process loads no Google Cloud adapter, capture, control-plane, comparison,
    viewer or agent module: each command imports what it runs in its own body (startup time)."""
    done = subprocess.run([sys.executable, "-c", ANALYZE_AND_LIST_MODULES, str(h200_profiles["healthy"]),
                           str(tmp_path / "o")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))  # by the command's own imports
    assert {"xdiag.pipeline.stages", "xdiag.report.render", "xdiag.tools.get_step_trace"} <= loaded  # it did run
    not_run = ("xdiag.cloud", "google.cloud", "google.genai", "xdiag.capture", "xdiag.control", "xdiag.sharing",
               "xdiag.sdk", "xdiag.compare", "xdiag.viewer", "xdiag.agent", "xdiag.examples",
               "xdiag.investigators.gemini", "xdiag.pipeline.sweep", "mcp")
    kept = {"xdiag.agent", "xdiag.agent.result_cache"}  # the analysis keeps its tools' answers there (light: no tools)
    unexpected = sorted(m for m in loaded - IN_PROCESS_CLOUD - kept
                        if any(m == package or m.startswith(package + ".") for package in not_run))
    assert unexpected == []
