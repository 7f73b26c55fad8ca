"""Source lines from the profile's own metadata: each HLO op's Python stack (the module's stack frame index), its
user frame past the library frames, and the library frame beside it; op time by kind with the lines that hold it;
every finding's source lines. The profiles are the committed real TPU v5e and H200 captures of the workloads in
shared/xdiag/examples (captured when that folder was named workloads/), and a real JAX CPU capture; each expected
line is read from the workload's file, so a test names the statement, not a number that can drift."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from xdiag.analysis.source_lines import (
    NO_SOURCE_HINT, has_source_metadata, innermost_user_frames, is_library, python_frame, source_of_stack,
)
from xdiag.cloud.embedded import analyze_session
from xdiag.examples.capture import capture_workload
from xdiag.investigators.source_lines import cited_ops
from xdiag.model import Evidence, Finding
from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session_in_process
from xdiag.profile.space import HloComputation, HloInstruction, HloModule
from xdiag.tools.aggregate_xplane_events import aggregate_xplane_events
from xdiag.tools.get_hlo_op_profile import get_hlo_op_profile

from tests.conftest import SHARED_PROFILES, missing_shared

PROFILES = Path(__file__).resolve().parent / "profiles"
TRACES = SHARED_PROFILES.parent / "traces"
EXAMPLES = Path(__file__).resolve().parent.parent / "shared" / "xdiag" / "examples"

# capture -> (the statement the busiest op's user line holds, the library file beside it or None)
TOP_OP_LINES = {
    "tpu_v5e/widening_convert": ("return y.astype(jnp.bfloat16)", None),
    "h200/widening_convert": ("return y.astype(jnp.bfloat16)", None),
    "tpu_v5e/ragged_attention_serve": ("q = ragged_paged_attention(", "ragged_paged_attention/kernel.py"),
    "tpu_v5e/megablox_moe": ("y = gmm(h, w_down", None),
    "tpu_v5e/near_hbm_limit": ("table = table.at[ids].add(", None),
    "tpu_v5e/int8_matmul": ("acc = jax.lax.dot(x, w", None),
    "tpu_v5e/lstm_scan": ("gates = x @ w + h @ u + b", None),
    "tpu_v5e/gru_scan_train": ("hr, hz, hn = jnp.split(h @ u", None),
}


def _example_line(line: str) -> str:
    """The text at `folder/file.py:N` in the workload's file under shared/xdiag/examples."""
    path, _, number = line.rpartition(":")
    return (EXAMPLES / Path(path).name).read_text().splitlines()[int(number) - 1].strip()


def _op_profile(capture: str):
    return get_hlo_op_profile(read_session_in_process([PROFILES / f"{capture}.xplane.pb"]))


@pytest.mark.parametrize("capture", sorted(TOP_OP_LINES))
def test_the_busiest_op_names_the_users_line_and_the_library_beside_it(capture):
    statement, library = TOP_OP_LINES[capture]
    out = _op_profile(capture)
    source = out.summary["top_op_source"]
    assert source["line"].startswith("workloads/" + capture.split("/")[1])  # the workload's own file, not jax's
    assert _example_line(source["line"]).startswith(statement)
    if library:
        assert source["library"].startswith("jax/…/") and library in source["library"]
    else:
        assert "library" not in source
    assert out.detail["ops"][0]["source"] == source  # the op table's source column
    assert "source_lines_not_available" not in out.summary


def test_a_pallas_kernel_keeps_its_own_frame_beside_the_users_call():
    """paged_attention_decode: the kernel's innermost frame is JAX's paged_attention_kernel.py; the user's frame is
    the jitted decode loop that calls it (the capture's line 41, in `decode` of the workload's file)."""
    out = _op_profile("tpu_v5e/paged_attention_decode")
    source = out.summary["top_op_source"]
    assert source["library"].startswith("jax/…/paged_attention/paged_attention_kernel.py:")
    assert source["function"] == "setup.<locals>.decode"
    lines = (EXAMPLES / "paged_attention_decode.py").read_text().splitlines()
    start = next(i for i, text in enumerate(lines, 1) if text.strip().startswith("def decode("))
    end = next(i for i, text in enumerate(lines, 1) if i > start and text.strip() == "return q")
    assert start < int(source["line"].rpartition(":")[2]) < end
    kinds = {k["kind"]: k for k in out.summary["op_time_by_kind"]}
    assert kinds["attention"]["share_percent"] > 99
    assert kinds["attention"]["lines"][0]["line"] == source["line"]


def test_a_copy_xla_inserted_names_the_line_of_the_array_it_moves():
    rows = {row["op"]: row for row in _op_profile("tpu_v5e/layout_transpose").detail["ops"]}
    source = rows["copy.1"]["source"]
    assert source["line_of_operand"] == "bitcast.3"
    assert _example_line(source["line"]).startswith("bdsh = jnp.transpose(y")


def test_op_time_by_kind_names_the_lines_that_hold_each_kind():
    kinds = _op_profile("tpu_v5e/megablox_moe").summary["op_time_by_kind"]
    assert kinds == sorted(kinds, key=lambda k: -k["ms"])
    assert abs(sum(k["share_percent"] for k in kinds) - 100) < 0.1
    custom = next(k for k in kinds if k["kind"] == "custom kernels")  # megablox gmm/tgmm Pallas kernels
    assert 1 <= len(custom["lines"]) <= 3
    assert {_example_line(line["line"]).split(" = ")[1][:4] for line in custom["lines"]} <= {"jax.", "gmm("}
    assert sum(line["share_percent"] for line in custom["lines"]) <= custom["share_percent"] + 0.01


@pytest.mark.parametrize("path, library", [
    ("/usr/lib/python3.11/threading.py", True),
    ("/home/me/.venv/lib/python3.12/site-packages/flax/linen/module.py", True),
    ("/usr/local/lib/python3.10/dist-packages/transformers/models/llama/modeling_llama.py", True),
    ("<frozen runpy>", True),
    ("/opt/src/jax/experimental/pallas/ops/tpu/megablox/gmm.py", True),  # a framework's source tree, anywhere
    ("/home/me/project/train.py", False),
    ("/tmp/ipykernel_4821/3351872923.py", False),  # a notebook cell is the user's
    ("/home/me/jax_experiments/train.py", False),
])
def test_library_frames_are_told_from_the_path(path, library):
    assert is_library(path) is library


def test_the_user_frame_is_the_first_past_the_libraries():
    stack = [("/x/site-packages/jax/_src/numpy/lax_numpy.py", 5, "astype"), ("/home/me/train.py", 33, "step"),
             ("/usr/lib/python3.11/threading.py", 1032, "_bootstrap")]
    source = source_of_stack(stack)
    assert source.user.short == "me/train.py:33" and source.user.function == "step"
    assert source.library.short == "jax/…/numpy/lax_numpy.py:5"
    only_libraries = source_of_stack([stack[2]])
    assert only_libraries.user is None and only_libraries.key == "python3.11/threading.py:1032"


def test_a_module_without_source_metadata_says_so_once_and_how_to_get_it():
    bare = HloInstruction(name="add.1", opcode="add", dtype="f32", dims=(8,), layout=(0,), operands=(),
                          fusion_kind="", op_name="", source="", called=())
    module = HloModule(name="jit_f", program_id=1, entry="main", host="h",
                       computations={"main": HloComputation("main", [bare])})
    assert not has_source_metadata([module]) and "jax" in NO_SOURCE_HINT
    recorded = HloInstruction(**{**bare.__dict__, "source": "/home/me/train.py:12"})
    older = HloModule(**{**module.__dict__, "computations": {"main": HloComputation("main", [recorded])}})
    assert has_source_metadata([older]) and older.stack(recorded) == [("/home/me/train.py", 12, "")]


def test_a_pytorch_trace_without_stacks_says_how_to_record_them():
    """A real 4-rank DDP Kineto trace (tests/profiles/torch_ranks) recorded without with_stack: said once, with the
    torch.profiler arguments that record stacks and modules."""
    session = read_session_in_process([PROFILES / "torch_ranks" / "balanced" / "rank0.pt.trace.json.gz"])
    note = get_hlo_op_profile(session).summary["source_lines_not_available"]
    assert "with_stack=True" in note and "with_modules=True" in note


def test_a_profile_without_hlo_says_why_no_op_names_a_line():
    from tests.conftest import shared_profile

    session = read_session_in_process([shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")])  # TensorFlow, no XLA
    out = get_hlo_op_profile(session)
    assert "no HLO modules" in out.summary["source_lines_not_available"]
    assert all(not kind["lines"] for kind in out.summary["op_time_by_kind"])


def test_a_jax_chrome_trace_points_to_the_xplane_for_its_lines():
    session = read_session_in_process([PROFILES / "tpu_v5e_chrome" / "paged_attention_decode.trace.json.gz"])
    assert ".xplane.pb" in get_hlo_op_profile(session).summary["source_lines_not_available"]


def test_findings_cite_ops_by_whole_name():
    finding = Finding(priority="P1", key="k", title="t", whats_happening="fusion.3 reads its input twice",
                      evidence=[Evidence(tool="get_hlo_op_profile", metric="top_op", value="fusion.37 (jit_step)")],
                      expected_impact="", fix="")
    assert cited_ops(finding, ["fusion.3", "fusion.37", "fusion.30", "fusion"]) == ["fusion.3", "fusion.37"]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """capture -> its analysis by the rule engine, made once."""
    out, done = tmp_path_factory.mktemp("analysed"), {}

    def analysis(capture: str):
        if capture not in done:
            path = PROFILES / f"{capture}.xplane.pb"
            done[capture] = analyze_session(locate_session(path), out / capture.replace("/", "-"))
        return done[capture]
    return analysis


# capture -> (the finding, the statement its first source line holds, a statement one of its lines fuses or None)
FINDING_LINES = {
    "tpu_v5e/lstm_scan": ("latency_bound", "gates = x @ w + h @ u + b", None),
    "tpu_v5e/gru_scan_train": ("latency_bound", "hr, hz, hn = jnp.split(h @ u", None),
    "tpu_v5e/widening_convert": ("memory_bound", "return y.astype(jnp.bfloat16)", "xf = x.astype(jnp.float32)"),
    "h200/widening_convert": ("memory_bound", "return y.astype(jnp.bfloat16)", "xf = x.astype(jnp.float32)"),
    "tpu_v5e/near_hbm_limit": ("memory_pressure", "h = jax.nn.relu(h @ w)", None),
    # a layout copy XLA inserted records no stack: the line that made the array it copies (via its bitcast)
    "tpu_v5e/layout_transpose": ("transposed_outputs", "bdsh = jnp.transpose(y, (0, 3, 2, 1))", None),
}


@pytest.mark.parametrize("capture", sorted(FINDING_LINES))
def test_a_findings_source_lines_are_the_users_and_its_fix_says_where(capture, analysed):
    key, statement, fused = FINDING_LINES[capture]
    finding = next(f for f in analysed(capture).diagnosis.findings if f.key == key)
    assert 1 <= len(finding.source_lines) <= 3
    first = finding.source_lines[0]
    assert _example_line(first.line).startswith(statement) and first.share_percent > 0
    assert finding.source_lines == sorted(finding.source_lines, key=lambda s: -s.share_percent)
    if fused:
        assert any(_example_line(f).startswith(fused) for s in finding.source_lines for f in s.fused_lines)
    assert f"Where: {first.line}" in finding.fix


@pytest.mark.parametrize("capture", ["tpu_v5e/widening_convert", "h200/widening_convert", "tpu_v5e/lstm_scan"])
def test_each_line_of_a_fix_says_what_its_busiest_op_computes(capture, analysed):
    """Issue 71: no finding rests on a bottleneck class alone; its lines say what their ops compute, in the op
    profile's own facts (the framework op and the shapes), so a fallback finding still says what the program does."""
    analysis = analysed(capture)
    rows = {r["op"]: r for r in json.loads((Path(analysis.output_uri) / "tools" / "get_hlo_op_profile.json")
                                           .read_text())["detail"]["ops"]}
    key = FINDING_LINES[capture][0]
    finding = next(f for f in analysis.diagnosis.findings if f.key == key)
    for line in finding.source_lines:
        cited = [rows[op] for op in line.ops if op in rows]
        busiest = max(cited, key=lambda r: r["share_of_op_time_percent"])
        assert busiest["op"] == line.ops[0]
        shape = busiest["shape"].split("{")[0]
        assert line.computes.endswith(shape) and "{" not in line.computes
        assert busiest["framework_op"].rsplit("/", 1)[-1] in line.computes
        assert f"({line.computes})" in finding.fix


def test_the_top_finding_names_the_users_line_and_the_kernel_beside_it(analysed):
    analysis = analysed("tpu_v5e/paged_attention_decode")
    top = analysis.diagnosis.findings[0]
    line = top.source_lines[0]
    assert line.line.startswith("workloads/paged_attention_decode.py:") and line.function == "setup.<locals>.decode"
    assert "paged_attention/paged_attention_kernel.py:" in line.library
    assert line.share_percent > 99 and len(line.ops) >= 3  # the four calls of the kernel that line makes
    assert f"Where: {line.line}" in top.fix
    html = (Path(analysis.output_uri) / "summary.html").read_text()
    assert 'id="source-lines"' in html and html.count(line.line) >= 3  # finding, fix, op time by kind


def test_an_agent_gets_the_lines_from_explain_finding_and_the_op_profile(analysed, tmp_path):
    """The MCP server's answers (XdiagTools, without the protocol): explain_finding returns the finding's source
    lines, get_hlo_op_profile each op row's source and op time by kind."""
    from xdiag.agent.mcp_server import XdiagTools

    tools = XdiagTools(cache=None, max_bytes=2**30, stack_dir=tmp_path)
    analysis = analysed("tpu_v5e/paged_attention_decode")
    explained = tools.call("explain_finding", {"analysis": analysis.output_uri, "finding": "1"})
    assert explained["source_lines"][0]["line"].startswith("workloads/paged_attention_decode.py:")
    profile = str(PROFILES / "tpu_v5e" / "paged_attention_decode.xplane.pb")
    ops = tools.call("get_hlo_op_profile", {"path": profile, "top_n": 3})
    assert all(row["source"]["function"] == "setup.<locals>.decode" for row in ops["detail"]["ops"][:3])
    assert ops["summary"]["op_time_by_kind"][0]["kind"] == "attention"


def test_the_gemini_investigator_is_given_the_lines():
    from xdiag.investigators import health_snapshot
    from xdiag.investigators.gemini.messages import opening_data
    from xdiag.model import ToolResult, ToolStatus

    out = _op_profile("tpu_v5e/lstm_scan")
    results = {"get_hlo_op_profile": ToolResult(tool="get_hlo_op_profile", status=ToolStatus.OK,
                                                summary=out.summary, detail=out.detail)}
    given = opening_data(health_snapshot(results), results)["broad_tools"]["get_hlo_op_profile"]["summary"]
    assert given["top_op_source"]["line"] == "workloads/lstm_scan.py:31"
    assert any(line["line"] == "workloads/lstm_scan.py:31" for kind in given["op_time_by_kind"] for line in kind["lines"])


def test_lstm_scans_loop_finding_is_its_cells_matmul_line(analysed):
    loop = next(f for f in analysed("tpu_v5e/lstm_scan").diagnosis.findings if f.key == "latency_bound")
    assert _example_line(loop.source_lines[0].line) == "gates = x @ w + h @ u + b"


@pytest.mark.slow
def test_a_real_cpu_capture_names_the_workloads_lines(tmp_path):
    """A JAX CPU capture made now, of the workload in shared/xdiag/examples: its ops' lines and its top finding's are
    statements of that file's jitted train_step."""
    capture = capture_workload("widened_statistics", tmp_path)
    out = get_hlo_op_profile(read_session_in_process([capture]))
    lines = [line["line"] for kind in out.summary["op_time_by_kind"] for line in kind["lines"]]
    # XLA:CPU's standalone widening convert carries no stack in this profile, so the busiest op may name no line
    assert all(row["source"]["function"] == "train_step" for row in out.detail["ops"] if "source" in row)
    assert lines and all(line.startswith("examples/widened_statistics.py:") for line in lines)
    top = analyze_session(locate_session(capture), tmp_path / "out").diagnosis.findings[0]
    assert top.source_lines and all(s.function == "train_step" for s in top.source_lines)
    source = (EXAMPLES / "widened_statistics.py").read_text().splitlines()
    body = range(next(i for i, text in enumerate(source, 1) if text.startswith("def train_step(")), len(source))
    for s in top.source_lines:
        number = int(s.line.rpartition(":")[2])
        assert number in body and "jnp." in _example_line(s.line)


@pytest.mark.parametrize("capture", ["tpu_v5e/widening_convert", "h200/widening_convert"])
def test_a_fusion_names_the_widening_astype_it_fuses(capture):
    """The busiest fusion's own line is its root's (the narrowing astype); the widening `astype(jnp.float32)` it
    fuses is among its fused lines, where a reader looks for the convert."""
    source = _op_profile(capture).summary["top_op_source"]
    fused = [_example_line(line) for line in source["fused_lines"]]
    assert "xf = x.astype(jnp.float32)  # widened copy of the whole tensor" in fused


def test_the_innermost_user_frames_are_past_the_threads_and_the_frameworks():
    events = [  # (start, end, name) as nested Python-frame events of one thread
        (0, 100, "threading.py(1032): _bootstrap"), (1, 99, "train.py(80): main"), (2, 60, "train.py(40): step"),
        (3, 50, "torch/nn/modules/module.py(1743): _call_impl"), (4, 40, "nn.Module: Net_0"),
        (5, 20, "nn.Module: Linear_0"), (21, 39, "nn.Module: Linear_1"), (61, 90, "train.py(55): log"),
    ]
    names = sorted({name for _, _, name in events})
    users, modules = innermost_user_frames(np.array([e[0] for e in events]), np.array([e[1] for e in events]), names,
                                           np.array([names.index(e[2]) for e in events]))
    assert users == {"train.py(40): step": 58, "train.py(55): log": 29}
    assert modules == {"nn.Module: Linear_0": 15, "nn.Module: Linear_1": 18}
    assert python_frame("threading.py(1032): _bootstrap").line == 1032 and python_frame("aten::mm") is None


def test_jax_python_tracer_frames_are_the_users_where_the_hlo_names_their_file():
    """JAX's Python tracer names a frame by its file's name alone (`$api.py:2479 block_until_ready`): the user's are
    the files the HLO's stacks name as the user's, so the workload's `step` is, jax's api.py is not."""
    session = read_session_in_process([PROFILES / "tpu_v5e" / "widening_convert.xplane.pb"])
    out = aggregate_xplane_events(session, pattern=".", line="python")
    frames = [python_frame(f["name"]) for f in out.detail["user_frames"]]
    assert [(f.file, f.function) for f in frames] == [("widening_convert.py", "step")]
    assert _example_line(f"examples/{frames[0].file}:{frames[0].line}").startswith("def step(")
    assert "block_until_ready" not in str(out.detail["user_frames"])  # jax's api.py, though it holds most time


@pytest.mark.parametrize("trace, host_finding", [("kineto_TraceLens_h100_bert-small.json.gz", True),
                                                 ("kineto_TraceLens_h100_Qwen1.5-0.5B-Chat.json.gz", False)])
def test_a_pytorch_trace_with_stacks_names_the_users_frame(trace, host_finding, tmp_path):
    """Real Kineto traces recorded with stacks: the user's frames (the model adapter's run_on_input), never
    threading.py, torch's own frames or a progress bar's thread; the innermost nn.Module calls. bert-small's host
    finding cites them (Qwen's finding is about its kernels: no Python frames cited)."""
    path = TRACES / trace
    if not path.exists():
        missing_shared(path)
    out = aggregate_xplane_events(read_session_in_process([path]), pattern=".", line="python")
    frames = [f["name"] for f in out.detail["user_frames"]]
    assert frames and not any(is_library(python_frame(f).file) for f in frames)
    assert not any(f.startswith(("threading.py", "torch/", "tqdm/")) for f in frames)
    assert out.detail["modules"] and all(m["name"].startswith("nn.Module: ") for m in out.detail["modules"])
    if not host_finding:
        return
    analysis = analyze_session(locate_session(path), tmp_path / "out")
    cited = [e for f in analysis.diagnosis.findings for e in f.evidence if e.tool == "aggregate_xplane_events"]
    assert cited and not any("threading.py" in str(e.value) for e in cited)
    assert any(e.metric == "user's innermost Python frames" and frames[0] in e.value for e in cited)


def test_an_optimal_summary_names_the_busiest_ops_line(analysed):
    """No finding to carry a line: the summary's busiest-op sentence says where that op comes from."""
    from xdiag.report.summary import summary_sentences

    analysis = analysed("tpu_v5e/megablox_moe")
    assert analysis.diagnosis.status == "OPTIMAL"
    line = analysis.health["top_op_source"]["line"]
    busiest = next(s for s in summary_sentences(analysis, "OPTIMAL", []) if s.startswith("The busiest op is"))
    assert f", from {line}" in busiest and _example_line(line).startswith(TOP_OP_LINES["tpu_v5e/megablox_moe"][0])


# capture -> (the host finding, the statement each of its host lines begins, in order)
HOST_FINDING_LINES = {
    "tpu_v5e/input_bound": ("input_bound", ["return [((p - mean) * inv_std)", "var = sum([(p - mean)"]),
    "h200/input_bound": ("input_bound", ["def _preprocess_sample("]),
    "tpu_v5e/dispatch_bound": ("eager_ops", ["def step(state, i):"]),
    "h200/dispatch_bound": ("eager_ops", ["def step(state, i):"]),
    "tpu_v5e/recompilation": ("recompile_per_shape", ["def step(state, i):"]),
    "h200/recompilation": ("recompile_per_shape", ["def step(state, i):"]),
}


@pytest.mark.parametrize("capture", sorted(HOST_FINDING_LINES))
def test_a_host_finding_names_the_users_python_frames_its_time_runs_in(capture, analysed):
    """Host time is in no HLO: where JAX's Python tracer recorded the user's frames around the waits, dispatches or
    compiles (or, for host-bound input, the frames that run), the finding names them with the host time they hold."""
    key, statements = HOST_FINDING_LINES[capture]
    finding = next(f for f in analysed(capture).diagnosis.findings if f.key == key)
    assert [_example_line(f"examples/{s.line}").startswith(want) or _example_line(f"examples/{s.line}") == want
            for s, want in zip(finding.source_lines, statements)] == [True] * len(statements)
    assert len(finding.source_lines) == len(statements)
    first = finding.source_lines[0]
    assert first.host_ms > 0 and 0 < first.share_percent <= 100
    assert f"Where: {first.function} ({first.line}): " in finding.fix and "of op time" not in finding.fix
    assert "records no line" not in finding.fix


def test_a_host_sync_the_line_view_ties_to_no_frame_says_what_the_tracer_did_record(analysed):
    """ragged_attention_serve's block_until_ready runs under no user frame the tracer recorded (the loop's function
    began before the trace), but the line view ties host time to the user's serving step: no invented line, and no
    claim that the profile records no line of the program; what the tracer recorded, why, and how to record it."""
    finding = next(f for f in analysed("tpu_v5e/ragged_attention_serve").diagnosis.findings if f.key == "host_sync")
    assert finding.source_lines == []
    assert "records no line" not in finding.fix
    assert finding.fix.count("JAX's Python tracer recorded the user's frames (workloads/ragged_attention_serve.py:") == 1
    assert "began before the trace did" in finding.fix and "jax.profiler.start_trace(log_dir)" in finding.fix


def test_a_host_sync_on_a_callback_names_the_line_the_line_view_ties_the_callback_to(analysed):
    """host_callback_step's host waits on the device's host callback, whose op the line view ties to the line that
    calls jax.pure_callback: the finding names that line (main said the profile records no line of the program)."""
    finding = next(f for f in analysed("tpu_v5e/host_callback_step").diagnosis.findings
                   if f.key == "callback_in_step")
    assert "records no line" not in finding.fix
    first = finding.source_lines[0]
    assert _example_line(first.line).startswith("h = jax.pure_callback(") and first.share_percent > 99
    assert first.host_ms is None and any(op.startswith("pure_callback") for op in first.ops)
    assert f"Where: {first.line} (train_step): " in finding.fix


def test_a_host_finding_takes_the_line_views_frames_where_its_follow_up_names_none():
    """The follow-up's events name no enclosing frame, but the line view ties host time of the finding's kind to
    the user's lines: those lines, with their host time; other kinds of host time are not this finding's."""
    from xdiag.investigators.source_lines import host_source_lines
    from xdiag.model import ToolResult, ToolStatus

    follow_up = ToolResult(tool="aggregate_xplane_events", status=ToolStatus.OK, detail={"user_callers": []})
    view = ToolResult(tool="get_line_view", status=ToolStatus.OK, detail={"lines": [
        {"line": "jobs/train.py:40", "function": "step", "host_ms": 30.0, "host_kinds": {"dispatch": 30.0}},
        {"line": "jobs/train.py:52", "function": "loop", "host_ms": 50.0, "host_kinds": {"sync": 45.0,
                                                                                      "python": 5.0}},
        {"line": "jax/_src/api.py:2479", "library": True, "host_ms": 90.0, "host_kinds": {"sync": 90.0}}]})
    lines, why = host_source_lines("host_sync", follow_up, 100.0, True, None, view)
    assert [(s.line, s.function, s.host_ms, s.share_percent) for s in lines] == [("jobs/train.py:52", "loop", 45.0,
                                                                                 45.0)] and why == ""
    lines, why = host_source_lines("recompilation", follow_up, 100.0, True, None, view)
    assert lines == [] and "records no line" not in why and "jobs/train.py:52 in loop" in why
    lines, why = host_source_lines("recompilation", follow_up, 100.0, True, None, None)
    assert lines == [] and "records no line of the user's program" in why  # no line view: nothing it recorded
    devices = ToolResult(tool="get_line_view", status=ToolStatus.OK, detail={"lines": [  # a sync on no traced frame
        {"line": "jobs/train.py:30", "function": "step", "self_ms": 10.0, "self_percent": 50.0,
         "kinds": {"host transfers": 9.0, "matmul": 1.0}, "top_ops": [{"op": "pure_callback.1", "ms": 9.0}]},
        {"line": "jobs/train.py:31", "function": "step", "self_ms": 1.0, "self_percent": 5.0,
         "kinds": {"host transfers": 0.1, "matmul": 0.9}}]})  # 0.5% of op time in copies: not what it waits on
    lines, why = host_source_lines("host_sync", follow_up, 100.0, True, None, devices)
    assert [(s.line, s.share_percent, s.host_ms, s.ops) for s in lines] == [("jobs/train.py:30", 50.0, None,
                                                                              ["pure_callback.1"])]


def test_a_host_wait_counts_once_under_the_innermost_user_frame_around_it():
    from xdiag.analysis.source_lines import enclosing_user_frames

    frames = (np.array([0, 10]), np.array([100, 50]), ["$loop.py:10 run", "$loop.py:20 step"])
    waits = (np.array([20, 25, 60, 200]), np.array([40, 35, 70, 210]))  # nested in the first; in run only; outside
    assert enclosing_user_frames(*frames, *waits) == {"$loop.py:20 step": 20, "$loop.py:10 run": 10}


def _innermost_by_stacks(events, kind_of):
    """innermost_user_frames as it was before round 4, one event at a time: the reference for the array walk."""
    user_time, module_time = {}, {}
    stacks = {"user": [], "module": []}
    for start, end, name in sorted(events, key=lambda e: (e[0], -e[1])):
        kind = kind_of(name)
        for stack in stacks.values():
            while stack and stack[-1][0] <= start:
                _, leaf, (s, e, n), totals = stack.pop()
                if leaf:
                    totals[n] = totals.get(n, 0) + e - s
        if not kind:
            continue
        stack = stacks[kind]
        if stack:
            stack[-1][1] = False
        stack.append([end, True, (start, end, name), user_time if kind == "user" else module_time])
    for stack in stacks.values():
        for _, leaf, (s, e, n), totals in stack:
            if leaf:
                totals[n] = totals.get(n, 0) + e - s
    return user_time, module_time


def test_innermost_frames_are_what_a_stack_of_open_frames_finds():
    """innermost_user_frames walks the frames of each kind as arrays (the events of no kind, the 20.7 MiB CPU
    capture's 40,000 dispatches, stack nothing): each innermost frame's time as the walk one event at a time found
    it, on random lines of nested, crossing and tied events of every kind."""
    import random

    from xdiag.analysis.source_lines import frame_kinds

    kind_of = frame_kinds(frozenset())
    names = ["work/train.py(10): step", "work/train.py(20): inner", "nn.Module: Linear_0", "nn.Module: Block_1",
             "PjitFunction(f)", "device_get", "jax/_src/api.py(5): jit"]
    rng = random.Random(3)
    for _ in range(20):
        events = []
        for _ in range(400):
            start = rng.randrange(0, 5_000, 5)
            events.append((start, start + rng.choice([0, 5, 40, 300, 2_000]), rng.choice(names)))
        expected = _innermost_by_stacks(events, kind_of)
        got = innermost_user_frames(np.array([e[0] for e in events]), np.array([e[1] for e in events]), names,
                                    np.array([names.index(e[2]) for e in events]), kind_of)
        assert got == expected and expected[0] and expected[1]
