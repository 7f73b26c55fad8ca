"""The line view (xdiag.analysis.line_view, get_line_view, `xdiag lines`) on the committed TPU v5e captures and a CPU
capture: self times share out the op time exactly, totals hold their callees, the top lines are the findings' lines,
and the code quoted is the line the profile names, read from a checkout elsewhere with --source-root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xdiag.analysis.line_view import NO_LINE, line_times, line_times_of_result, line_view
from xdiag.analysis.source_code import SourceReader, quote_line
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process
from xdiag.tools import run_tool
from xdiag.tools.get_line_view import get_line_view

from tests.conftest import missing_shared

TESTS = Path(__file__).resolve().parent
TPU = sorted((TESTS / "profiles" / "tpu_v5e").glob("*.xplane.pb"))
EXAMPLES = TESTS.parent / "shared" / "xdiag" / "examples"


@pytest.fixture(scope="module")
def views():
    """capture name -> (session, its line view), read once."""
    done = {}

    def view(path: Path):
        if path.name not in done:
            session = read_session_in_process([path])
            done[path.name] = (session, line_view(session))
        return done[path.name]
    return view


@pytest.mark.parametrize("path", TPU, ids=[p.name.split(".")[0] for p in TPU])
def test_self_times_share_out_the_op_time_and_totals_hold_their_callees(path, views):
    """Each op's time goes to one line's self time (its innermost user frame, else its library frame, else
    NO_LINE): they sum to the op time to the picosecond, by line and by function. A line's total is its self time
    plus its callees' time under it, exactly (the stacks nest), so it is at least the sum of the callees' time it
    holds; a callee's own total is at least the time it spends under any one caller."""
    _, view = views(path)
    assert view.op_ps > 0
    assert sum(t.self_ps for t in view.lines.values()) == view.op_ps
    assert sum(t.self_ps for t in view.functions.values()) == view.op_ps
    for table in (view.lines, view.functions):
        for t in table.values():
            under = sum(t.callees.values())
            assert t.total_ps >= under and t.total_ps >= t.self_ps
            assert t.total_ps == t.self_ps + under, t.key
            for callee, ps in t.callees.items():
                assert table[callee].total_ps >= ps
    assert view.stacks_recorded  # every committed capture records JAX's stacks


@pytest.mark.parametrize("name", ["gpt_train", "remat_train", "paged_attention_decode"])
def test_a_callers_total_includes_its_callees(name, views):
    """The step function a capture loop calls holds the device time of all the lines below it: the outermost
    functions' totals are the op time its stacks name, and each line whose function calls another (gpt_train's
    `_block` calls `_rms_norm`) holds that function's time under it."""
    _, view = views(TESTS / "profiles" / "tpu_v5e" / f"{name}.xplane.pb")
    named = view.op_ps - sum(t.self_ps for t in view.lines.values() if not t.function or t.library)
    outermost = max(view.functions.values(), key=lambda t: t.total_ps)
    assert outermost.total_ps == pytest.approx(named, abs=view.op_ps * 1e-6) and outermost.self_ps == 0
    callers = [t for t in view.lines.values() if t.callees and t.self_ps]
    if name == "gpt_train":
        assert callers, "a line that both runs ops and calls a function of the user's"
        for t in callers:
            assert t.total_ps == t.self_ps + sum(t.callees.values()) > t.self_ps


FINDING_CAPTURES = ["decode_streamed", "gru_scan_train", "kv_decode_b64", "layout_transpose", "memory_bound",
                    "paged_attention_decode", "padded_heads", "widening_convert"]


@pytest.mark.parametrize("name", FINDING_CAPTURES)
def test_the_top_lines_are_the_findings_lines(name, tmp_path, monkeypatch):
    """Every line a finding names for its device time is among the line view's first ten lines by self time, with
    at least the share the finding gives it (the finding sums the listed ops at that line; the view, every op)."""
    from xdiag.cloud.embedded import analyze_session

    monkeypatch.setenv("XDIAG_XPROF_VIEWS", "0")
    analysis = analyze_session(locate_session(TESTS / "profiles" / "tpu_v5e" / f"{name}.xplane.pb"), tmp_path / name)
    result = json.loads((Path(analysis.output_uri) / "tools" / "get_line_view.json").read_text())
    assert result["status"] == "ok"
    rows = {row["line"]: row for row in result["detail"]["lines"][:10]}
    cited = [s for f in analysis.diagnosis.findings for s in f.source_lines if s.host_ms is None]
    assert cited, "the capture's findings name lines"
    for s in cited:
        assert s.line in rows, (s.line, list(rows))
        assert rows[s.line]["self_percent"] >= s.share_percent - 0.1
    first = max(cited, key=lambda s: s.share_percent)
    busiest = next(r for r in result["detail"]["lines"] if r["line"] != NO_LINE)
    assert busiest["line"] == first.line or busiest["self_percent"] > first.share_percent
    html = (Path(analysis.output_uri) / "summary.html").read_text()
    assert 'id="lines"' in html and first.line in html


STREAMED_CAPTURES = ["kv_decode", "int8_weight_decode", "decode_prefetched"]


@pytest.mark.parametrize("name", STREAMED_CAPTURES)
def test_a_streamed_programs_lines_are_bound_as_its_copies_are(name, tmp_path, monkeypatch):
    """These decode loops stream their weights into on-chip memory with async copies (most of the program's HBM
    bytes), and the fusions that multiply by them read only on-chip bytes: on their own rates they look
    compute-bound at a few MB/s of HBM, which contradicted the memory-bound P0 on the very line its fix names.
    Every line mostly in such ops, or in the waits for the copies, takes the op profile's program HBM rate and is
    memory-bound, as the op profile's memory-bound rows count those ops; every line a memory-bound finding names,
    in its lines or its fix, is memory-bound."""
    from xdiag.cloud.embedded import analyze_session

    monkeypatch.setenv("XDIAG_XPROF_VIEWS", "0")
    analysis = analyze_session(locate_session(TESTS / "profiles" / "tpu_v5e" / f"{name}.xplane.pb"), tmp_path / name)
    tools = Path(analysis.output_uri) / "tools"
    program = json.loads((tools / "get_hlo_op_profile.json").read_text())["summary"]
    lines = {r["line"]: r for r in json.loads((tools / "get_line_view.json").read_text())["detail"]["lines"]}
    assert program["program_hbm_async_copy_share_percent"] >= 50
    streamed = [r for r in lines.values() if (r.get("fed_by_async_copies_percent") or 0) > 50]
    assert streamed, "a line of the program works on what its copies brought"
    for row in streamed:
        assert row["bound"] == "memory", row
        assert (row["program_hbm_gb_per_s"], row["program_hbm_efficiency_percent"]) == (
            program["program_hbm_gb_per_s"], program["program_hbm_efficiency_percent"])
    memory_bound = [f for f in analysis.diagnosis.findings if f.key == "memory_bound"]
    assert memory_bound, "the capture's memory-bound finding"
    for finding in memory_bound:
        named = {s.line for s in finding.source_lines} | {line for line in lines if line in finding.fix}
        assert named
        for line in named:
            assert lines[line]["bound"] == "memory", (line, lines[line])


def test_the_code_shown_is_the_line_the_profile_names_from_a_moved_checkout(tmp_path, views):
    """The captures record /work/main/shared/xdiag/workloads/*.py, which is not on this machine: the workloads'
    sources, copied under another prefix, are read at the longest suffix of each recorded path that exists there;
    the code quoted is the line the op's stack names (gpt_train's busiest line is the MLP's two matmuls)."""
    session, view = views(TESTS / "profiles" / "tpu_v5e" / "gpt_train.xplane.pb")
    checkout = tmp_path / "home" / "someone" / "src" / "workloads"
    checkout.mkdir(parents=True)
    for source in EXAMPLES.glob("*.py"):
        shutil.copyfile(source, checkout / source.name)
    root = tmp_path / "home" / "someone" / "src"
    top = view.ranked("self")[0]
    assert not Path(top.file).exists()
    assert SourceReader(root).locate(top.file) == checkout / "gpt_train.py"  # workloads/gpt_train.py: the longest suffix
    quoted = quote_line(top.file, top.line, root)
    assert quoted["code"] == (EXAMPLES / "gpt_train.py").read_text().splitlines()[top.line - 1].strip()
    assert "@ p[\"up\"]" in quoted["code"] and [n for n, _ in quoted["context"]] == list(range(top.line - 2,
                                                                                           top.line + 3))
    out = get_line_view(session, top_n=5, source_root=str(root))
    for row in out.detail["lines"]:
        if row["line"] == NO_LINE:
            continue
        number = int(row["line"].rpartition(":")[2])
        assert row["code"] == (EXAMPLES / Path(row["file"]).name).read_text().splitlines()[number - 1].strip()
    without = get_line_view(session, top_n=1).detail["lines"][0]
    assert "--source-root" in without["code_not_available"] and "code" not in without
    # A file shorter than the line the profile names is another version, not quoted.
    (checkout / "gpt_train.py").write_text("x = 1\n")
    assert "not the version the profile ran" in quote_line(top.file, top.line, root)["code_not_available"]


def test_host_time_is_on_the_lines_the_python_tracer_recorded(views):
    """input_bound's host finding names its frames (input_bound.py:46 holds the host time the rule cites): the line
    view puts the Python tracer's time on the same lines, on the workload's full path the HLO names."""
    session, view = views(TESTS / "profiles" / "tpu_v5e" / "input_bound.xplane.pb")
    assert view.host_traced
    hosted = sorted((t for t in view.lines.values() if t.host_ps), key=lambda t: -t.host_ps)
    assert hosted and hosted[0].key.endswith("input_bound.py:46") and hosted[0].key.startswith("workloads/")
    assert hosted[0].host_ps > 100e9  # over 100 ms of Python in the input loop
    times = line_times(session)
    assert times[hosted[0].key]["host_ms"] == pytest.approx(hosted[0].host_ps / 1e9, abs=1e-3)
    assert sum(t["self_ms"] for t in times.values()) == pytest.approx(view.op_ps / 1e9, abs=1e-3 * len(times))
    # The same numbers from the tool's result, as an analysis keeps it (its listed lines only).
    kept = line_times_of_result(json.loads(run_tool(session, "get_line_view", {"order": "host"}).model_dump_json()))
    assert kept[hosted[0].key] == times[hosted[0].key]


def test_a_cpu_capture_shares_out_its_op_time(cpu_profiles):
    """A freshly captured CPU profile (XLA:CPU ops on the host's threads): the same sums hold."""
    session = read_session_in_process([cpu_profiles["healthy"]])
    view = line_view(session)
    assert view.op_ps > 0 and sum(t.self_ps for t in view.lines.values()) == view.op_ps
    assert any(t.self_ps and not t.library and t.key != NO_LINE for t in view.lines.values())


def test_xdiag_lines_prints_the_view_as_a_user_reads_it(tmp_path):
    """`xdiag lines` with --source-root: the busiest line first with its code under it, the functions by total,
    the host time; --json gives get_line_view's result."""
    checkout = tmp_path / "checkout" / "workloads"
    shutil.copytree(EXAMPLES, checkout)
    profile = TESTS / "profiles" / "tpu_v5e" / "widening_convert.xplane.pb"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "shared"), str(TESTS.parent)])}
    run = [sys.executable, "-m", "xdiag.cli", "lines", str(profile), "--source-root", str(tmp_path / "checkout"),
           "--top", "3"]
    text = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "workloads/widening_convert.py:" in line)
    assert "train_step" in lines[first] and "69.56%" in lines[first]
    statement = (EXAMPLES / "widening_convert.py").read_text().splitlines()[
        int(lines[first].split("widening_convert.py:")[1].split()[0]) - 1].strip()
    assert any(line.strip() == f"| {statement}" for line in lines[first + 1:first + 4])
    assert "Functions by device time" in text and "Host time in your frames" in text
    result = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert result["tool"] == "get_line_view" and len(result["detail"]["lines"]) == 3


def test_an_agent_gets_a_bounded_line_view(tmp_path):
    """The MCP server's answer is cut to top_n rows per list, and source_root is a path the client's roots bound."""
    from xdiag.agent.mcp_server import XdiagTools

    tools = XdiagTools(cache=None, max_bytes=2**30, stack_dir=tmp_path)
    profile = str(TESTS / "profiles" / "tpu_v5e" / "gpt_train.xplane.pb")
    args = tools.check("get_line_view", {"path": profile, "top_n": 2, "source_root": str(tmp_path)})
    assert Path(str(tmp_path)).absolute() in tools.paths("get_line_view", args)
    text = tools.answer_text("get_line_view", args, tools.call("get_line_view", args))
    answer = json.loads(text)
    assert len(answer["detail"]["lines"]) == 2 and len(answer["detail"]["functions"]) == 2
    assert answer["summary"]["top_line"].startswith("workloads/gpt_train.py:")


TRACES = TESTS.parents[1] / "shared" / "traces"


@pytest.mark.parametrize("trace", ["kineto_TraceLens_h100_bert-small.json.gz",
                                   "kineto_TraceLens_h100_Qwen1.5-0.5B-Chat.json.gz"])
def test_a_pytorch_trace_puts_its_kernels_on_the_users_lines(trace):
    """Real Kineto traces recorded with stacks: each GPU kernel's time goes to the user's frames around the runtime
    call that launched it (by correlation id), with the nn.Module it ran in; kernels launched outside any user frame
    (before the capture, or from a library's thread) stay under NO_LINE, and the sums still hold exactly. The
    model adapter's run_on_input holds the kernels, never torch's or threading's frames."""
    path = TRACES / trace
    if not path.exists():
        missing_shared(path)
    session = read_session_in_process([path])
    view = line_view(session)
    assert view.stacks_recorded and view.host_traced
    assert sum(t.self_ps for t in view.lines.values()) == view.op_ps
    for t in view.lines.values():
        assert t.total_ps == t.self_ps + sum(t.callees.values())
    named = [t for t in view.ranked("self") if t.key != NO_LINE and t.self_ps]
    assert named[0].function == "run_on_input" and named[0].key.endswith("text_base_model.py:28")
    assert named[0].self_ps > view.op_ps / 2 and named[0].modules
    assert not any(t.key.startswith(("torch/", "threading.py")) for t in view.lines.values())


def test_the_report_and_the_findings_quote_the_code_from_analyzes_source_root(tmp_path):
    """`xdiag analyze --source-root DIR`: the report's line view carries each line's code, read from the moved
    checkout, in the row a reader opens; each finding's lines in analysis.json carry the same code."""
    import html as html_lib

    checkout = tmp_path / "checkout" / "workloads"
    shutil.copytree(EXAMPLES, checkout)
    profile = TESTS / "profiles" / "tpu_v5e" / "widening_convert.xplane.pb"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "shared"), str(TESTS.parent)])}
    subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(profile), "--out", str(tmp_path / "out"),
                    "--no-xprof-views", "--quiet", "--source-root", str(tmp_path / "checkout")],
                   capture_output=True, text=True, env=env, check=True)
    result = json.loads((tmp_path / "out" / "tools" / "get_line_view.json").read_text())
    top = result["detail"]["lines"][0]
    number = int(top["line"].rpartition(":")[2])
    statement = (EXAMPLES / "widening_convert.py").read_text().splitlines()[number - 1].strip()
    assert top["code"] == statement and top["file"] == str(checkout / "widening_convert.py")
    findings = json.loads((tmp_path / "out" / "analysis.json").read_text())["diagnosis"]["findings"]
    quoted = {line["line"]: line.get("code") for f in findings for line in f["source_lines"]}
    assert quoted[top["line"]] == statement  # the memory-bound finding's line: the narrowing astype
    for key, code in quoted.items():
        number = int(key.rpartition(":")[2])
        assert code == (EXAMPLES / "widening_convert.py").read_text().splitlines()[number - 1].strip(), key
    page = (tmp_path / "out" / "summary.html").read_text()
    section = page[page.index('id="lines"'):page.index('id="hlo-op-profile"')]
    assert f"<code>{html_lib.escape(statement, quote=False)}</code>" in section.replace("&#34;", '"').replace(
        "&#39;", "'")


def test_a_file_edited_since_the_capture_is_not_quoted(tmp_path):
    """decode_streamed's capture ran a version of its file one import line shorter: the line its scan frame names
    (63) is blank in today's file, so no line of that file is quoted (each would be one line off), and each row
    says why."""
    checkout = tmp_path / "src" / "workloads"
    shutil.copytree(EXAMPLES, checkout)
    session = read_session_in_process([TESTS / "profiles" / "tpu_v5e" / "decode_streamed.xplane.pb"])
    rows = get_line_view(session, top_n=8, source_root=str(tmp_path / "src")).detail["lines"]
    mine = [r for r in rows if r["line"].startswith("workloads/decode_streamed.py:")]
    assert len(mine) >= 4
    for row in mine:
        assert "code" not in row and "is not the version the profile ran: line" in row["code_not_available"]
    gpt = get_line_view(read_session_in_process([TESTS / "profiles" / "tpu_v5e" / "gpt_train.xplane.pb"]), top_n=8,
                        source_root=str(tmp_path / "src")).detail["lines"]
    assert all(r.get("code") for r in gpt if r["line"].startswith("workloads/gpt_train.py:"))


def _frame_times_event_by_event(session) -> dict:
    """python_frame_times as it was before round 4: a sweep over every event of the Python lines (the reference
    the faster sweep over user frames and events of a kind alone must match)."""
    import numpy as np

    from xdiag.analysis.line_view import HOST_KINDS, _python_lines
    from xdiag.analysis.source_lines import frame_kinds, user_files
    from xdiag.profile.columns import isin_ids

    kind_of = frame_kinds(user_files(session.hlo_modules))
    traced, frames = False, {}
    for plane, line in _python_lines(session):
        names = plane.event_names
        user_ids = [k for k, n in names.items() if kind_of(n) == "user"]
        if not user_ids:
            continue
        starts, ends = line.start_ps, line.end_ps
        ids = line.metadata_id.astype(np.int64)
        is_user = isin_ids(ids, np.array(user_ids, dtype=np.int64))
        if not is_user.any():
            continue
        traced = True
        stack, covered_until = [], []

        def close(frame):
            entry = frames.setdefault(frame[1], [0, {}])
            entry[0] += frame[3] - frame[2]

        for i in np.lexsort((-ends, starts)).tolist():
            start, end = int(starts[i]), int(ends[i])
            while stack and stack[-1][0] <= start:
                close(stack.pop())
                covered_until.pop()
            name_id = int(ids[i])
            if is_user[i]:
                if stack:
                    stack[-1][2] += end - start
                stack.append([end, names.get(name_id, ""), 0, end - start])
                covered_until.append(-1)
                continue
            if not stack:
                continue
            text = names.get(name_id, "")
            kind = next((k for k, pattern in HOST_KINDS if pattern.search(text)), "")
            if not kind or end <= covered_until[-1]:
                continue
            covered_until[-1] = end
            charged = frames.setdefault(stack[-1][1], [0, {}])[1]
            charged[kind] = charged.get(kind, 0) + end - start
        for frame in stack:
            close(frame)
    return {"traced": traced, "frames": frames}


def _kinds_in_order(times: dict) -> dict:
    """Each frame's kinds in the order the line view shows them (the frames themselves it sorts)."""
    return {name: list(kinds) for name, (_, kinds) in times["frames"].items()}


def test_the_python_frames_host_time_is_what_a_sweep_over_every_event_finds(h200_profiles):
    """python_frame_times walks only the user frames and the events of a kind, as arrays (an event of no kind
    charges nothing; the frames it would close the next event closes): each frame's own time and its time by kind,
    the kinds in the same order, as the sweep over every event, on every committed capture with the Python tracer's lines."""
    from xdiag.analysis.line_view import python_frame_times

    swept = 0
    for path in [*TPU, *h200_profiles.values()]:
        session = read_session_in_process([path])
        expected = _frame_times_event_by_event(session)
        got = python_frame_times(session)
        assert got == expected and _kinds_in_order(got) == _kinds_in_order(expected), path.name
        swept += sum(bool(kinds) for _, kinds in got["frames"].values())
    assert swept >= 5


def test_overlapping_frames_and_events_of_no_kind_sweep_as_every_event_does(monkeypatch):
    """The same on lines made to be hard: user frames overlapping without nesting, events of a kind nested in each
    other and straddling frames' ends, events of no kind everywhere, ties in start and end."""
    from types import SimpleNamespace

    import numpy as np

    from xdiag.analysis import line_view as module

    names = {1: "work/train.py(10): step", 2: "work/train.py(20): inner", 3: "work/data.py(5): load",
             4: "device_get", 5: "PjitFunction(f)", 6: "backend_compile", 7: "device_put", 8: "foo", 9: "bar"}
    rng = np.random.default_rng(4)
    lines = []
    for count in (50, 3_000):
        starts = rng.integers(0, 10_000, count).astype(np.int64) // 10 * 10  # ties
        ends = starts + rng.choice([0, 10, 50, 400, 3_000], count)
        ids = rng.choice(np.arange(1, 11), count, p=[.04, .04, .02, .15, .15, .1, .1, .2, .1, .1]).astype(np.int32)
        lines.append((SimpleNamespace(event_names=names),
                      SimpleNamespace(start_ps=starts, end_ps=ends, metadata_id=ids)))
    monkeypatch.setattr(module, "_python_lines", lambda session: iter(lines))
    expected = _frame_times_event_by_event(SimpleNamespace(hlo_modules=[]))
    got = module.python_frame_times(SimpleNamespace(hlo_modules=[], cache={}))
    assert got == expected and _kinds_in_order(got) == _kinds_in_order(expected)
    assert len(got["frames"]) == 3 and all(len(kinds) == 4 for _, kinds in got["frames"].values())
