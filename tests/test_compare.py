"""`xdiag diff`: two real analysed sessions compared from their own tool outputs (H200 captures of two bundled
workloads, analysed by the embedded default), diff.json and diff.html, and the command line: captures of other
platforms or programs refused, two profiles of one name analysed each into its own folder, bad input said in one
line. The before/after pair of one workload and its fix is compared on the local stack in test_viewer_stack.py."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.cloud.memory import LocalBlobStore
from xdiag.compare.html import render_diff_html, write_diff
from xdiag.compare.outputs import load_outputs
from xdiag.compare.sessions import compare_sessions
from xdiag.profile.locate import locate_session

from tests.conftest import TESTS

SAME = TESTS / "profiles" / "same_program" / "tpu_v5e"


@pytest.fixture(scope="module")
def analysed(h200_profiles, tmp_path_factory) -> dict[str, Path]:
    """host_sync and healthy, each analysed into its own folder."""
    out = tmp_path_factory.mktemp("analyses")
    folders = {}
    for name in ("host_sync", "healthy"):
        analysis = analyze_session(locate_session(h200_profiles[name], None), out / name)
        assert analysis.status == "DONE", analysis.failure_reason
        folders[name] = out / name
    return folders


def _outputs(folder: Path, label: str):
    return load_outputs(LocalBlobStore(), str(folder), label)


def test_the_step_time_change_is_the_difference_of_the_two_step_traces(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    diff = compare_sessions(before, after)
    a, b = before.tools["get_step_trace"]["summary"], after.tools["get_step_trace"]["summary"]
    assert diff.step_time.baseline == pytest.approx(a["step_time_ms_mean"])
    assert diff.step_time.candidate == pytest.approx(b["step_time_ms_mean"])
    assert diff.step_time.delta == pytest.approx(b["step_time_ms_mean"] - a["step_time_ms_mean"], abs=1e-3)
    # two programs (host_sync.py, healthy.py): each side's numbers, and no verdict between them
    assert diff.verdict == "not_comparable" and "the programs differ" in diff.refused_because
    assert diff.step_test.change_percent is None and diff.headline[0].startswith("Not compared: the programs differ")
    # the categories' changes add up to the step-time change
    assert sum(c.delta_ms for c in diff.breakdown) == pytest.approx(diff.step_time.delta, rel=0.02)
    host_sync = next(c for c in diff.breakdown if c.category == "host_sync")
    assert host_sync.baseline_ms == pytest.approx(a["step_time_ms_mean"] * a["host_sync_percent"] / 100, rel=1e-3)


def test_ops_are_compared_per_step_and_the_diagnosis_itself_is_diffed(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    diff = compare_sessions(before, after, top=1000)
    ops_a = {o["op"] for o in before.tools["get_hlo_op_profile"]["detail"]["ops"]}
    ops_b = {o["op"] for o in after.tools["get_hlo_op_profile"]["detail"]["ops"]}
    assert {c.name for c in diff.ops.gone} == ops_a - ops_b
    assert {c.name for c in diff.ops.appeared} == ops_b - ops_a
    steps = before.tools["get_step_trace"]["summary"]["steps"]
    for change in diff.ops.gone:  # an op's time per step: its executions' total (over every module) / steps
        total = sum(o["total_ms"] for o in before.tools["get_hlo_op_profile"]["detail"]["ops"] if o["op"] == change.name)
        assert change.baseline_ms_per_step == pytest.approx(total / steps, rel=1e-3, abs=1e-6)
    keys_a = {f["key"] for f in before.analysis["diagnosis"]["findings"]}
    keys_b = {f["key"] for f in after.analysis["diagnosis"]["findings"]}
    assert {f.key for f in diff.findings.gone} == keys_a - keys_b and keys_a - keys_b
    assert {f.key for f in diff.findings.appeared} == keys_b - keys_a
    assert diff.findings.baseline_status == "NEEDS_ATTENTION"
    # GPU profiles carry device memory: the peak is compared, from each side's memory profile
    peak_a = before.tools["get_memory_profile"]["summary"]["peak_memory_gib"]
    peak_b = after.tools["get_memory_profile"]["summary"]["peak_memory_gib"]
    assert diff.memory_peak.available and diff.memory_peak.delta == pytest.approx(peak_b - peak_a, abs=1e-3)


def test_missing_data_is_said_with_the_tool_s_reason_never_a_number(analysed):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    after.tools["get_memory_profile"] = {"status": "not_available", "reason": "no allocator events", "summary": {}}
    del before.tools["get_step_trace"]
    diff = compare_sessions(before, after)
    assert not diff.step_time.available and diff.step_time.baseline is None and "get_step_trace" in diff.step_time.reason
    assert diff.verdict == "not_comparable" and diff.breakdown == []
    assert not diff.memory_peak.available and "no allocator events" in diff.memory_peak.reason
    assert not diff.kernels.available or diff.kernels.source == "get_kernel_stats"


def test_diff_html_is_self_contained_and_escapes_profile_text(analysed, tmp_path):
    before, after = _outputs(analysed["host_sync"], "before"), _outputs(analysed["healthy"], "after")
    before.tools["get_hlo_op_profile"]["detail"]["ops"][0]["op"] = "<script>alert(1)</script>"
    diff = compare_sessions(before, after, top=1000)
    html = render_diff_html(diff)
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    json_path, html_path = write_diff(diff, tmp_path / "d")
    assert json.loads(json_path.read_text())["verdict"] == diff.verdict and html_path.read_text() == html


def _xdiag(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def _refused(answer: subprocess.CompletedProcess, *said: str) -> None:
    """Exit 2, one line naming why, nothing on stdout, no traceback."""
    assert answer.returncode == 2 and not answer.stdout, (answer.returncode, answer.stdout, answer.stderr)
    assert len(answer.stderr.strip().splitlines()) == 1 and "Traceback" not in answer.stderr, answer.stderr
    for text in said:
        assert text in answer.stderr, answer.stderr


def test_xdiag_diff_on_two_analysis_folders_writes_diff_html_and_json(analysed, tmp_path):
    """One capture against itself: no change, and the answer says they are one capture."""
    answer = _xdiag("diff", analysed["healthy"], analysed["healthy"], "--out", tmp_path / "out")
    assert answer.returncode == 0, answer.stderr
    assert Path(answer.stdout.strip()) == tmp_path / "out" / "diff.html"
    written = json.loads((tmp_path / "out" / "diff.json").read_text())
    assert written["baseline"]["session_id"] and written["headline"][0] in answer.stderr.replace("\n", " ")
    assert written["verdict"] == "no_change" and "one capture" in written["headline"][1]


@pytest.fixture(scope="module")
def one_name(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`xdiag diff a/run.xplane.pb b/run.xplane.pb` in a fresh folder: two TPU v5e captures of one program, both
    files named run.xplane.pb, and a folder xdiag-out/run-2 of the user's own there already."""
    cwd = tmp_path_factory.mktemp("one-name")
    for side, capture in (("a", "a0"), ("b", "b1")):
        (cwd / side).mkdir()
        packed = (SAME / "healthy" / f"{capture}.xplane.pb.xz").read_bytes()
        (cwd / side / "run.xplane.pb").write_bytes(lzma.decompress(packed))
    (cwd / "xdiag-out" / "run-2").mkdir(parents=True)
    (cwd / "xdiag-out" / "run-2" / "notes.txt").write_text("mine")
    return cwd, _xdiag("diff", "a/run.xplane.pb", "b/run.xplane.pb", cwd=cwd)


def test_two_profiles_of_one_name_are_analysed_each_into_its_own_folder(one_name):
    cwd, answer = one_name
    assert answer.returncode == 0, answer.stderr
    out = cwd / "xdiag-out"
    analysed_from = {folder.name: json.loads((folder / "analysis.json").read_text())["profile_uris"]
                     for folder in out.iterdir() if (folder / "analysis.json").exists()}
    assert analysed_from == {"run": [str(cwd / "a" / "run.xplane.pb")], "run-3": [str(cwd / "b" / "run.xplane.pb")]}
    assert (out / "run-2" / "notes.txt").read_text() == "mine" and len(list((out / "run-2").iterdir())) == 1
    diff = json.loads((out / "diff-run-run" / "diff.json").read_text())
    assert diff["verdict"] == "no_change"
    assert [diff[side]["report_uri"] for side in ("baseline", "candidate")] == [
        str(out / "run" / "summary.html"), str(out / "run-3" / "summary.html")]
    # again: each profile's own analysis replaced by its own, the same comparison by itself; another pair of one
    # session name gets another comparison folder
    again = _xdiag("diff", "a/run.xplane.pb", "b/run.xplane.pb", cwd=cwd)
    assert again.returncode == 0 and Path(again.stdout.strip()) == Path("xdiag-out/diff-run-run/diff.html")
    other = _xdiag("diff", "b/run.xplane.pb", "a/run.xplane.pb", cwd=cwd)
    assert other.returncode == 0 and Path(other.stdout.strip()) == Path("xdiag-out/diff-run-run-2/diff.html")
    assert sorted(p.name for p in out.iterdir()) == ["diff-run-run", "diff-run-run-2", "run", "run-2", "run-3"]
    assert json.loads((out / "diff-run-run" / "diff.json").read_text())["baseline"]["report_uri"] == str(
        out / "run" / "summary.html")


def test_captures_of_other_platforms_or_programs_are_refused_even_by_the_gate(analysed, one_name, tmp_path):
    """A TPU v5e capture against an H200 capture of the same workload, and two programs on one GPU: exit 2 with the
    reason, nothing written, and --fail-if-slower never passes them."""
    tpu = one_name[0] / "xdiag-out" / "run"
    for before, after, said in ((tpu, analysed["healthy"], "the platforms differ"),
                                (analysed["host_sync"], analysed["healthy"], "the programs differ")):
        for gate in ((), ("--fail-if-slower", "5%")):
            _refused(_xdiag("diff", before, after, "--out", tmp_path / "d", *gate), "not compared: " + said)
    assert not (tmp_path / "d").exists()


def test_the_gate_fails_where_there_is_no_verdict(analysed, tmp_path):
    """A side of one step has no verdict: the diff says so, and --fail-if-slower exits 2 instead of passing."""
    short = tmp_path / "short"
    shutil.copytree(analysed["healthy"], short)
    trace_file = short / "tools" / "get_step_trace.json"
    trace = json.loads(trace_file.read_text())
    trace["detail"]["steps"] = trace["detail"]["steps"][:1]
    trace_file.write_text(json.dumps(trace))
    plain = _xdiag("diff", short, analysed["healthy"], "--out", tmp_path / "d")
    assert plain.returncode == 0 and "NOT ENOUGH STEPS" in plain.stderr, plain.stderr
    gated = _xdiag("diff", short, analysed["healthy"], "--out", tmp_path / "d", "--fail-if-slower", "5%")
    assert gated.returncode == 2 and "--fail-if-slower: no verdict (not enough steps" in gated.stderr, gated.stderr
    assert (tmp_path / "d" / "diff.json").exists()  # the comparison is still written, for the reader


def test_bad_input_to_diff_is_one_line_naming_the_file(analysed, tmp_path):
    corrupt = {}
    for name, damage in (("cut", lambda f: f.write_bytes(f.read_bytes()[:300])),
                         ("list", lambda f: f.write_text("[1]"))):
        corrupt[name] = tmp_path / name
        shutil.copytree(analysed["healthy"], corrupt[name])
        damage(corrupt[name] / "analysis.json")
    tool = tmp_path / "tool"
    shutil.copytree(analysed["healthy"], tool)
    (tool / "tools" / "get_step_trace.json").write_text('{"status": "ok", "summary": ')
    misshapen = tmp_path / "misshapen"  # JSON of the right kind whose table is text
    shutil.copytree(analysed["healthy"], misshapen)
    trace = json.loads((misshapen / "tools" / "get_step_trace.json").read_text())
    (misshapen / "tools" / "get_step_trace.json").write_text(json.dumps({**trace, "detail": {"steps": "abc"}}))
    (tmp_path / "a-file").write_text("mine")
    for args, said in (
        ((corrupt["cut"], analysed["healthy"]), f"{corrupt['cut'] / 'analysis.json'}: not an analysis output"),
        ((analysed["healthy"], corrupt["list"]), f"{corrupt['list'] / 'analysis.json'}: not an analysis output"),
        ((tool, analysed["healthy"]), f"{tool / 'tools' / 'get_step_trace.json'}: not an analysis output"),
        ((analysed["healthy"], misshapen), f"{misshapen}: an output of its analysis is not what xdiag writes"),
        ((analysed["healthy"], analysed["healthy"], "--out", tmp_path / "a-file"),
         f"--out {tmp_path / 'a-file'}: not a folder"),
        ((tmp_path / "gone" / "run.xplane.pb", analysed["healthy"]),
         f"{tmp_path / 'gone' / 'run.xplane.pb'}: no such file"),
        (("gone/run.xplane.pb", analysed["healthy"]), "gone/run.xplane.pb: no such file or folder"),
    ):
        _refused(_xdiag("diff", *args, cwd=tmp_path), said)
    assert (tmp_path / "a-file").read_text() == "mine"
    # no file, and no control plane here: not the local stack another test of this session may have left set
    bare = {k: v for k, v in os.environ.items() if k not in ("XDIAG_CONTROL_PLANE_URL", "XDIAG_STACK_DIR")}
    said = _xdiag("diff", "myrun/session-1", analysed["healthy"], cwd=tmp_path, env=bare)
    _refused(said, "myrun/session-1: no such file or folder (nor a RUN/SESSION: no control plane")


def test_xdiag_report_of_an_analysis_folder_prints_its_summary(analysed):
    answer = subprocess.run([sys.executable, "-m", "xdiag.cli", "report", str(analysed["healthy"])],
                            capture_output=True, text=True, timeout=120)
    assert answer.returncode == 0, answer.stderr
    assert Path(answer.stdout.strip()) == (analysed["healthy"] / "summary.html").absolute()
