"""The one reader of the user's code (xdiag.analysis.source_code) on a real TPU v5e capture whose stacks are made to
name files elsewhere: what the MCP server's tools, `--source-root`, the pipeline and `xdiag lines` quote is read only
where the user said, through no link out, as far as the lines need, in bounded work, and a kept answer is not given
again once the code it quoted has changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import anyio
import pytest

from xdiag.analysis.source_code import MAX_SOURCE_BYTES, RECORDED_PATHS_ENV, SourceReader, quote_line
from xdiag.profile.reader import read_session_in_process
from xdiag.tools.get_line_view import get_line_view

TESTS = Path(__file__).resolve().parent
PROFILE = TESTS / "profiles" / "tpu_v5e" / "layout_transpose.xplane.pb"
RECORDED = "/work/main/shared/xdiag/workloads/layout_transpose.py"
"""The path the capture recorded for its program; its lines 44, 46 and 47 (train_step) hold the op time."""
LINES = {44: "train_step", 46: "train_step", 47: "train_step", 59: "step", 61: "step"}
"""Every line of that file the capture's stacks name, and the function each runs in."""
SECRET = "SECRET-SOURCE-c41d"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "shared"), str(TESTS.parent)])}


def _code_naming(text: str) -> str:
    """A Python file whose lines the capture names are `def train_step(): …` holding `text` (the version the profile
    ran, as other_version checks it), every other line a comment holding it too."""
    return "\n".join(f'def {LINES[n]}(): "{text}"' if n in LINES else f"# {text}" for n in range(1, 81)) + "\n"


@pytest.fixture
def secret_elsewhere():
    """A file outside every folder a test allows, holding SECRET, at a path as long as RECORDED (so that the
    capture's stacks can be made to name it: path -> the capture, its stacks naming that path)."""
    base = Path(tempfile.mkdtemp(prefix="x", dir="/tmp"))
    try:
        folder = base / ("p" * (len(RECORDED) - len(str(base)) - len("/layout_transpose.py") - 1))
        folder.mkdir()
        secret = folder / "layout_transpose.py"
        assert len(str(secret)) == len(RECORDED)
        secret.write_text(_code_naming(SECRET))
        yield secret
    finally:
        shutil.rmtree(base)


def _capture_naming(path: Path, out: Path) -> Path:
    """The capture with every recorded path of its program replaced by `path` (as long: the protobuf holds)."""
    data = PROFILE.read_bytes()
    assert data.count(RECORDED.encode()) > 0 and len(str(path)) == len(RECORDED)
    out.write_bytes(data.replace(RECORDED.encode(), str(path).encode()))
    return out


def _links_to(secret: Path, root: Path) -> Path:
    """A checkout whose user planted links out: its layout_transpose.py to the file, and a folder named as the one
    the file is in (a longer suffix of the recorded path) to that folder."""
    root.mkdir(parents=True)
    (root / "layout_transpose.py").symlink_to(secret)
    (root / secret.parent.name).symlink_to(secret.parent, target_is_directory=True)
    (root / "workloads").mkdir()
    (root / "workloads" / "layout_transpose.py").symlink_to(secret)
    return root


# --- the MCP server: no byte from outside its folders -------------------------------------------------------------


def test_no_mcp_tool_quotes_a_file_outside_the_allowed_folders(tmp_path, secret_elsewhere):
    """`xdiag mcp --allow DIR`: a profile inside DIR whose stacks name a file outside it, and a source_root inside
    DIR whose files and folders are links to it. Every tool the server lists is called on the profile (get_line_view
    with and without source_root, twice: the second from the cache, the first where `xdiag tool` kept an answer that
    quoted the file; analyze, then explain_finding on each finding); no answer, and no file analyze wrote, holds a
    byte of the file."""
    from mcp import Client, StdioServerParameters

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    profile = _capture_naming(secret_elsewhere, allowed / "run.xplane.pb")
    root = _links_to(secret_elsewhere, allowed / "checkout")
    env = {**ENV, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    # The user's own command, unbounded, reads the path recorded and keeps its answer: the server, bounded, must
    # not give that answer again.
    own = subprocess.run([sys.executable, "-m", "xdiag.cli", "tool", "get_line_view", str(profile)],
                         capture_output=True, text=True, env=env, check=True)
    assert SECRET in own.stdout
    server = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", str(allowed)],
                                   env=env, cwd=tmp_path)
    answers: dict[str, str] = {}

    async def drive() -> None:
        async with Client(server, read_timeout_seconds=300, mode="legacy") as client:
            listed = await client.list_tools()
            for tool in listed.tools:
                if tool.name in ("list_sessions", "explain_finding", "analyze"):
                    continue
                result = await client.call_tool(tool.name, {"path": str(profile)})
                answers[tool.name] = result.content[0].text
            for n, arguments in enumerate([{}, {"source_root": str(root)}, {}, {"source_root": str(root)},
                                           {"source_root": str(root), "top_n": 200, "order": "total"}]):
                result = await client.call_tool("get_line_view", {"path": str(profile), **arguments})
                answers[f"get_line_view {n} {arguments}"] = result.content[0].text
            result = await client.call_tool("analyze", {"path": str(profile), "out": str(allowed / "out")})
            answers["analyze"] = result.content[0].text
            analysis = json.loads(result.content[0].text)
            for finding in analysis.get("findings", []):
                result = await client.call_tool("explain_finding", {"analysis": analysis["analysis"],
                                                                    "finding": finding["rank"]})
                answers[f"explain_finding {finding['rank']}"] = result.content[0].text

    anyio.run(drive)
    line_views = [json.loads(text) for name, text in answers.items() if name.startswith("get_line_view")]
    assert all(view["status"] == "ok" for view in line_views), line_views  # answered: only the code is left out
    assert all("code" not in row for view in line_views for row in view["detail"]["lines"])
    for written in sorted((allowed / "out").rglob("*")):
        if written.is_file():
            answers[str(written.relative_to(allowed))] = written.read_text(errors="replace")
    assert (allowed / "out" / "summary.html").is_file() and "tools/get_line_view.json" in " ".join(
        answers).replace(os.sep, "/")
    leaked = [name for name, text in answers.items() if SECRET in text]
    assert not leaked, f"{len(leaked)} answers quote the file outside: {leaked}"


# --- --source-root: no link out of the checkout ------------------------------------------------------------------


def test_a_link_out_of_the_source_root_is_not_followed_and_the_report_does_not_carry_it(tmp_path, secret_elsewhere):
    """A cloned checkout can hold `layout_transpose.py -> /somewhere/else`: `xdiag analyze --source-root` quotes
    nothing from where the link leads (summary.html, which `xdiag share` publishes, least of all), while a link
    inside the checkout to a file inside it is read."""
    root = _links_to(secret_elsewhere, tmp_path / "checkout")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(PROFILE), "--out", str(out),
                           "--no-xprof-views", "--quiet", "--source-root", str(root)],
                          capture_output=True, text=True, env={**ENV, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "tools" / "get_line_view.json").read_text())["detail"]["lines"]
    assert [r for r in rows if r["line"].endswith("layout_transpose.py:44")][0]["code_not_available"]
    for written in (out / "summary.html", out / "tools" / "get_line_view.json"):
        assert SECRET not in written.read_text()
    # A link that stays inside the checkout is the user's own layout: it is read.
    (root / "workloads" / "layout_transpose.py").unlink()
    (root / "real.py").write_text(_code_naming("inside"))
    (root / "workloads" / "layout_transpose.py").symlink_to(root / "real.py")
    quoted = quote_line(RECORDED, 44, root, function="train_step")
    assert quoted["code"] == 'def train_step(): "inside"' and quoted["file"] == str(root / "workloads" /
                                                                                   "layout_transpose.py")


# --- the pipeline: nothing of the server's own files --------------------------------------------------------------


def test_the_pipeline_quotes_no_file_of_the_machine_it_runs_on(tmp_path, secret_elsewhere, monkeypatch):
    """An uploaded profile whose stacks name a file of the analysing machine: the pipeline's stages (here the
    embedded pipeline, as the local stack and the cloud run them) quote none of it; given a source root, they read
    only there."""
    from xdiag.cloud.embedded import analyze_session, build_embedded
    from xdiag.profile.locate import locate_session

    monkeypatch.delenv(RECORDED_PATHS_ENV, raising=False)
    monkeypatch.delenv("XDIAG_SOURCE_ROOT", raising=False)
    profile = _capture_naming(secret_elsewhere, tmp_path / "upload.xplane.pb")
    analysis = analyze_session(locate_session(profile), tmp_path / "out", deps_and_bus=build_embedded())
    assert analysis.status != "FAILED", analysis.failure_reason
    for written in (tmp_path / "out" / "summary.html", tmp_path / "out" / "tools" / "get_line_view.json"):
        assert SECRET not in written.read_text()
    rows = json.loads((tmp_path / "out" / "tools" / "get_line_view.json").read_text())["detail"]["lines"]
    assert any("--source-root" in row.get("code_not_available", "") for row in rows)
    # The user's own command on their own machine reads the path recorded.
    monkeypatch.setenv(RECORDED_PATHS_ENV, "1")
    assert SECRET in quote_line(str(secret_elsewhere), 44, function="train_step")["code"]


# --- bounded reads and bounded work -------------------------------------------------------------------------------


def test_a_huge_source_file_is_read_only_as_far_as_the_line_quoted(tmp_path, monkeypatch):
    """A 1 GiB `layout_transpose.py` (sparse) under the source root: its lines are quoted from its first lines
    alone; a 1 GiB one with no line end is read no further than MAX_SOURCE_BYTES and quotes nothing. The memory the
    line view allocates stays far under the file's size (reading it whole took 2.1 GB)."""
    monkeypatch.delenv(RECORDED_PATHS_ENV, raising=False)
    session = read_session_in_process([PROFILE])
    get_line_view(session)  # the view itself, computed once before anything is measured
    peaks, rows = [], []
    for name, text in (("lines", _code_naming("big")), ("no_line_end", "")):
        root = tmp_path / name
        (root / "workloads").mkdir(parents=True)
        huge = root / "workloads" / "layout_transpose.py"
        huge.write_text(text)
        with open(huge, "r+b") as handle:
            handle.truncate(2**30)
        tracemalloc.start()
        try:
            out = get_line_view(session, top_n=3, source_root=str(root))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        rows.append(next(r for r in out.detail["lines"] if r["line"].endswith("layout_transpose.py:44")))
    assert rows[0]["code"] == 'def train_step(): "big"' and "code" not in rows[1], rows
    assert peaks[0] < 16 * 2**20 and peaks[1] < 4 * MAX_SOURCE_BYTES, peaks


def _path_work(monkeypatch) -> list[int]:
    """The path parts handed to stat and lstat (the kernel walks each part): the work of finding a file."""
    parts = [0]
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def counted(path, *args, _real=real, **kwargs):
            parts[0] += os.fspath(path).count("/") + 1 if isinstance(path, (str, bytes, os.PathLike)) else 1
            return _real(path, *args, **kwargs)
        monkeypatch.setattr(os, name, counted)
    return parts


def test_finding_a_deeply_recorded_path_under_a_root_is_bounded_work(tmp_path, monkeypatch):
    """A recorded path 1,000 or 2,000 folders deep: looking for it under a source root costs the same bounded
    number of path parts either way (it was 1,000 look-ups of up to 1,000 parts each), and still finds the
    file by its last parts."""
    root = tmp_path / "src"
    (root / "workloads").mkdir(parents=True)
    (root / "workloads" / "layout_transpose.py").write_text(_code_naming("deep"))
    work = []
    for depth in (1000, 2000):
        recorded = "/" + "/".join(f"d{i}" for i in range(depth)) + "/workloads/layout_transpose.py"
        parts = _path_work(monkeypatch)
        assert quote_line(recorded, 44, root, function="train_step")["code"] == 'def train_step(): "deep"'
        missing = SourceReader(root).locate("/" + "/".join(f"e{i}" for i in range(depth)) + "/nowhere.py")
        work.append(parts[0])
        monkeypatch.undo()
        assert missing is None
    assert work[0] == work[1] and work[0] < 50 * (len(root.parts) + 70), work


def _line_events(run) -> int:
    """Lines of xdiag's analysis code executed while `run()` runs: the work, counted."""
    count = [0]
    analysis = str(TESTS.parent / "shared" / "xdiag" / "analysis")

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(analysis) else None

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return count[0]


def _deepened(frames: int):
    """The capture with its busiest op's stack made `frames` frames deeper, each a user frame of its own (a
    recursion in the user's code), read afresh."""
    session = read_session_in_process([PROFILE])
    if frames:
        from xdiag.analysis.op_stats import op_stats

        busiest = max((s for s in op_stats(session) if s.source is not None and s.source.user is not None),
                      key=lambda s: s.total_ps)
        module = next(m for m in session.hlo_modules if m.find(busiest.name))
        instruction = module.find(busiest.name)[1]
        first = len(module.stack_frames) + 1
        chain = [(f"/home/u/deep{frames}/recurse.py", 10 + i, f"level{i}", instruction.stack_frame_id if i == 0
                  else first + i - 1) for i in range(frames)]
        module.stack_frames = tuple(module.stack_frames) + tuple(chain)
        instruction.stack_frame_id = first + frames - 1
        session.cache.clear()
    return session


def test_a_deep_python_stack_costs_linear_work(monkeypatch):
    """One op under a 1,000- and a 2,000-frame stack: the line view's work grows by the frames added, not by their
    square (each frame's callee was found by a scan of the whole stack: 4,000 frames took 18 s)."""
    monkeypatch.delenv(RECORDED_PATHS_ENV, raising=False)
    work = {}
    for frames in (0, 1000, 2000):
        session = _deepened(frames)
        work[frames] = _line_events(lambda: get_line_view(session, top_n=5))
        view = session.cache["line_view"]
        assert sum(t.self_ps for t in view.lines.values()) == view.op_ps
    assert work[2000] - work[1000] < 1.5 * (work[1000] - work[0]), work


# --- the terminal and the cache -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile, in_name", [
    ("\x1b]0;owned\x07\x1b[2J\x9b31m", "\x1b[8m"),  # set the window title, clear the screen
    ("".join(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])), "\u202e"),  # a 'Trojan source' reordering
])
def test_xdiag_lines_shows_control_characters_in_code_and_names_as_escapes(tmp_path, hostile, in_name):
    """A line of code holding a terminal's escapes, or Unicode's direction overrides, and a recorded path holding
    one: `xdiag lines` prints each as its escape, none reaches the terminal (before: direction overrides raw)."""
    from xdiag.cli.lines import render_lines
    from xdiag.tools import run_tool

    root = tmp_path / "src"
    (root / "workloads").mkdir(parents=True)
    (root / "workloads" / "layout_transpose.py").write_text(_code_naming(hostile))
    session = read_session_in_process([PROFILE])
    result = json.loads(run_tool(session, "get_line_view", {"source_root": str(root)}).model_dump_json())
    assert any(hostile in row.get("code", "") for row in result["detail"]["lines"])
    result["detail"]["functions"][0]["line"] += in_name  # a name from the profile
    text = render_lines(result, f"run{in_name}.xplane.pb")
    printed = text.replace("\n", "")
    unprintable = {c for c in hostile + in_name if not c.isprintable()}
    assert not any(ord(c) < 32 or 127 <= ord(c) < 160 or c in unprintable for c in printed), repr(text[:400])
    assert ascii(hostile)[1:-1] in text and f"run{ascii(in_name)[1:-1]}.xplane.pb" in text


def test_a_kept_line_view_is_not_given_again_once_the_code_it_quoted_changed(tmp_path, monkeypatch):
    """`xdiag tool get_line_view` (and the MCP server) keep answers per profile version and arguments: an answer
    that quoted a file is given again only while that file is the version it read; once the file is edited, a
    removed file or one that appeared since, the answer is computed afresh and quotes the code as it is."""
    from xdiag.agent.result_cache import ResultCache, answer_tool

    monkeypatch.setenv(RECORDED_PATHS_ENV, "1")
    root = tmp_path / "src"
    (root / "workloads").mkdir(parents=True)
    source = root / "workloads" / "layout_transpose.py"
    source.write_text(_code_naming("first"))
    cache = ResultCache(tmp_path / "cache")
    args = {"source_root": str(root), "top_n": 3}

    def top_code() -> str:
        text, status = answer_tool([PROFILE], "layout_transpose", "get_line_view", args, cache, 2**30)
        assert status == "ok"
        row = next(r for r in json.loads(text)["detail"]["lines"] if r["line"].endswith("layout_transpose.py:44"))
        return row.get("code") or row["code_not_available"]

    assert top_code() == 'def train_step(): "first"'
    assert cache.answer([PROFILE], "get_line_view", args) is not None  # kept
    source.write_text(_code_naming("second"))
    assert top_code() == 'def train_step(): "second"'
    source.unlink()
    assert "not readable" in top_code()
    source.write_text(_code_naming("third"))
    assert top_code() == 'def train_step(): "third"'
    assert cache.answer([PROFILE], "get_line_view", args) is not None
