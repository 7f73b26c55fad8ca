"""Host summaries (issue 47): each host summarised where it is decoded, the session's tables assembled from the
summaries, and every broad tool's answer from them the whole-session read's, on real two-process JAX CPU captures
and the committed real TPU and GPU captures, grown to more hosts by copying their real host files; the reduce and
the tool instances never map a host's columns."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
from pathlib import Path

import pytest
from xdiag.analysis.breakdown import step_rows
from xdiag.analysis.steps import step_set
from xdiag.pipeline.deps import SessionLoader
from xdiag.pipeline.layout import host_summary_uri
from xdiag.pipeline.topics import ANALYSES
from xdiag.profile.session import read_session
from xdiag.tools import BROAD_TOOLS, run_tool
from xdiag.tools import host_summary
from xdiag.analysis.xprof.session_views import views

from tests.test_host_maps import Pipeline
from tests.test_hosts_map import _hosts, _pod


def _summaries(paths: list[Path]) -> tuple[object, list[dict]]:
    """The session read host by host by the summarising map workers, and the summaries they wrote."""
    kept: dict = {}
    session = read_session(paths, by_host=True, worker=host_summary.__name__,
                           on_mapped=lambda _, outs: kept.update(summaries=[host_summary.read(
                               host_summary.summary_path(out)) for out in outs]))
    return session, kept["summaries"]


def _answer(result) -> str:
    return json.dumps([result.status, result.reason, result.summary, result.detail], sort_keys=True, default=str)


@pytest.mark.parametrize("workload, hosts", [("straggler_input", 3), ("straggler_compute", 8)])
def test_every_broad_tool_answers_from_the_summaries_what_it_answers_from_the_whole_session(
        workload, hosts, lockstep, tmp_path):
    paths = _hosts(_pod(tmp_path / "pod", lockstep[workload], hosts))
    whole = read_session(paths, by_host=False)
    _, summaries = _summaries(paths)
    summarized = host_summary.summary_session(host_summary.assemble(summaries), whole.name)
    answers = {tool: (_answer(run_tool(whole, tool)), _answer(run_tool(summarized, tool))) for tool in BROAD_TOOLS}
    assert [tool for tool, (one, other) in answers.items() if one != other] == []
    hosts_answer = run_tool(summarized, "get_hosts")
    assert hosts_answer.summary["straggler"].endswith("process1") and len(hosts_answer.detail["hosts"]) == hosts


def test_a_summary_session_holds_no_events(lockstep, tmp_path):
    """What is not in the summaries is refused with the reason, never answered from nothing: a follow-up that reads
    events (aggregate_xplane_events) is not available on the summary session and answers on the mapped one."""
    paths = _hosts(_pod(tmp_path / "pod", lockstep["straggler_input"], 3))
    mapped, summaries = _summaries(paths)
    summarized = host_summary.summary_session(host_summary.assemble(summaries), mapped.name)
    line = next(line for plane in summarized.host_planes() for line in plane.lines if len(line))
    with pytest.raises(host_summary.ColumnsNotInSummary, match="prepared columns"):
        line.start_ps
    refused = run_tool(summarized, "aggregate_xplane_events", {"pattern": "PjitFunction"})
    assert refused.status.value == "not_available" and "prepared columns" in refused.reason
    assert run_tool(mapped, "aggregate_xplane_events", {"pattern": "PjitFunction"}).ok


def test_a_summary_is_sized_by_the_tables_not_by_the_events(lockstep, tmp_path):
    paths = _hosts(_pod(tmp_path / "pod", lockstep["straggler_input"], 2))
    _, summaries = _summaries(paths)
    for path, summary in zip(paths, summaries):
        events = sum(plane["lines"][k][2] for plane in summary["planes"] for k in range(len(plane["lines"])))
        assert events > 1_000
        assert len(host_summary.encode(summary)) < path.stat().st_size / 10


PROFILES = Path(__file__).parent / "profiles"
DEVICE_PODS = {
    # copies of one real capture as hosts, each pod exercising what only a device session has
    "tpu_async_copies": ["tpu_v5e/host_offload"] * 3,  # copy-start/copy-done pairs: transfer spans
    "tpu_data_formatting": ["tpu_v5e/layout_transpose"] * 2,  # the profile's own 'data formatting' category
    "tpu_training": ["tpu_v5e/gpt_train"] * 4,
    "gpu_kernels": ["h200/healthy"] * 3,  # GPU kernel statistics per stream
    # different real captures as the hosts of one session: programs, steps and allocators differ host to host
    "tpu_mixed": ["tpu_v5e/healthy", "tpu_v5e/host_offload", "tpu_v5e/host_offload", "tpu_v5e/int8_matmul"],
}


def _device_pod(folder: Path, captures: list[str]) -> list[Path]:
    folder.mkdir()
    for k, capture in enumerate(captures):
        shutil.copyfile(PROFILES / f"{capture}.xplane.pb", folder / f"{Path(capture).name}_host{k:03d}.xplane.pb")
    return _hosts(folder)


@pytest.mark.parametrize("pod", sorted(DEVICE_PODS))
def test_every_broad_tool_answers_from_a_device_sessions_summaries_what_it_answers_from_the_whole_session(
        pod, tmp_path):
    """TPU and GPU sessions are summarised as CPU ones are: every broad tool's answer from the summaries is the
    whole-session read's. XProf's views read the xplane files either way; both sessions get the one conversion of
    them (the converters order tied rows differently from one run to the next)."""
    paths = _device_pod(tmp_path / "pod", DEVICE_PODS[pod])
    whole = read_session(paths, by_host=False)
    _, summaries = _summaries(paths)
    assert not any(summary.get("not_summarized") for summary in summaries)
    summarized = host_summary.summary_session(host_summary.assemble(summaries), whole.name)
    summarized.cache["xprof_views"] = views(whole)
    try:
        answers = {tool: (_answer(run_tool(whole, tool)), _answer(run_tool(summarized, tool))) for tool in BROAD_TOOLS}
    finally:
        whole.close()
    assert [tool for tool, (one, other) in answers.items() if one != other] == []
    assert run_tool(summarized, "get_hosts").ok
    if pod == "tpu_async_copies":
        assert json.loads(answers["get_hlo_op_profile"][1])[2]["async_copies"]["copies"] > 0
    if pod.startswith("gpu"):
        assert json.loads(answers["get_kernel_stats"][1])[0] == "ok"


def test_device_hosts_that_ran_different_programs_of_one_name_are_read_from_their_columns(tmp_path):
    """Two real TPU captures whose training programs share a name but not an id: the whole-session read looks the
    profile's op costs up by program name across hosts, so the summaries refuse, saying why, rather than differ."""
    paths = _device_pod(tmp_path / "pod", ["tpu_v5e/healthy", "tpu_v5e/memory_bound"])
    _, summaries = _summaries(paths)
    with pytest.raises(host_summary.NotSummarized, match="different programs named jit_train_step"):
        host_summary.assemble(summaries)


def test_a_pytorch_trace_is_read_from_its_columns_and_the_summary_says_why(tmp_path):
    paths = []
    for rank in sorted((PROFILES / "torch_ranks" / "straggler").glob("*.pt.trace.json.gz")):
        paths.append(tmp_path / rank.name)
        shutil.copyfile(rank, paths[-1])
    session, summaries = _summaries(paths)
    assert all("PyTorch trace" in summary["not_summarized"] for summary in summaries)
    with pytest.raises(host_summary.NotSummarized, match="each kernel's FLOPs are shared out"):
        host_summary.assemble(summaries)
    assert "op_stats" not in session.cache  # the tools build their tables from the mapped columns, as before


def test_the_reduce_stores_the_assembled_summary_and_no_session_of_columns(lockstep, tmp_path):
    """On the in-process bus as the cloud runs the stages: each map stores its host's summary beside its columns,
    the reduce stores only the tables assembled from the summaries (no prepared file of every host's columns), and
    the analysis names the straggler with its cause."""
    pipeline = Pipeline(tmp_path / "buckets")
    pipeline.folder.parent.mkdir(parents=True)
    _pod(pipeline.folder, lockstep["straggler_input"], 5)
    analysis = pipeline.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    folder = pipeline.blobs.local_path(analysis["output_uri"] + "/prepared/x").parent  # the session's prepared files
    for name in sorted(p.name for p in pipeline.folder.glob("*.xplane.pb")):
        info = pipeline.blobs.stat(f"gs://bucket/pod-run/plugins/profile/pod-session/{name}")
        assert pipeline.blobs.exists(host_summary_uri(analysis["output_uri"], info))
    assert list(folder.glob("*" + host_summary.SUFFIX)) and not list(folder.glob("*.xdiag"))
    finding = analysis["diagnosis"]["findings"][0]
    assert finding["key"] == "straggler_host" and "process1" in finding["title"]
    stored = pipeline.state.get(ANALYSES, analysis["analysis_id"])
    assert stored["tools"]["get_hosts"]["status"] == "ok"


def _fields(row) -> list:
    """A row's values with their types (a NumPy float64 rounds as NumPy rounds: the type is part of the answer)."""
    values = []
    for value in dataclasses.astuple(row):
        items = sorted(value.items()) if isinstance(value, dict) else [value]
        values += [(type(item), item) for item in items]
    return values


def test_the_assembled_session_holds_arrays_and_arrivals_and_makes_its_rows_where_they_are_read(lockstep, tmp_path):
    """What the reduce writes and each tool instance reads grows with the hosts' steps, never with their
    executions: the per-step tables as arrays, the collectives as their arrivals; its row objects are made only in
    a process whose tool reads them, the whole-session read's rows value for value and type for type."""
    paths = _hosts(_pod(tmp_path / "pod", lockstep["straggler_input"], 4))
    whole = read_session(paths, by_host=False)
    _, summaries = _summaries(paths)
    document = host_summary.decode(host_summary.encode(host_summary.assemble(summaries)))
    tables = document["tables"]
    assert "collectives" not in tables and tables["collective_arrivals"]["level"] == "hosts"
    assert len(tables["collective_arrivals"]["participants"]) == 4
    for name in ("steps", "step_rows"):
        assert all("array" in column or "codes" in column for column in tables[name]["columns"]), name
    session = host_summary.summary_session(document, whole.name)
    assert not dict.__contains__(session.cache, "step_rows") and "step_rows" in session.cache
    assert [_fields(row) for row in step_rows(session)] == [_fields(row) for row in step_rows(whole)]
    assert dict.__contains__(session.cache, "step_rows")
    assert [_fields(step) for step in step_set(session).steps] == [_fields(step) for step in step_set(whole).steps]


def test_an_assembled_session_of_an_earlier_format_is_assembled_again(lockstep, tmp_path):
    pipeline = Pipeline(tmp_path / "buckets")
    pipeline.folder.parent.mkdir(parents=True)
    _pod(pipeline.folder, lockstep["straggler_input"], 3)
    analysis = pipeline.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    inputs = [pipeline.blobs.stat(i["uri"]) for i in analysis["inputs"]]
    folder = pipeline.blobs.local_path(analysis["output_uri"] + "/prepared/x").parent
    [assembled] = folder.glob("*" + host_summary.SUFFIX)
    earlier = host_summary.decode(assembled.read_bytes())
    assembled.write_bytes(host_summary.encode({**earlier, "format": 2, "tables": {}}))
    session = SessionLoader(pipeline.blobs, prepare=True, map_hosts_from=2).load(inputs, "pod", analysis["output_uri"])
    assert run_tool(session, "get_hosts").summary["straggler"].endswith("process1")
    assert host_summary.decode(assembled.read_bytes())["format"] == host_summary.ASSEMBLED_FORMAT


def _pipeline(tmp_path: Path, max_bytes: int) -> Pipeline:
    pipeline = Pipeline(tmp_path / "buckets")
    pipeline.deps.sessions = SessionLoader(pipeline.blobs, max_bytes=max_bytes, prepare=True, map_hosts_from=2)
    pipeline.folder.parent.mkdir(parents=True)
    return pipeline


def test_a_summarised_session_is_bound_by_its_host_files_not_by_its_size(lockstep, tmp_path):
    """The reduce and the tools read summaries, the follow-ups the hosts that matter that fit the session limit
    together: a session larger than the session limit (XDIAG_MAX_PROFILE_GIB) is analysed, and a follow-up that
    reads events says which hosts it read."""
    largest = max(p.stat().st_size for p in _hosts(_pod(tmp_path / "probe", lockstep["straggler_input"], 2)))
    limit = int(2.5 * largest)  # two hosts' files fit together, never three
    pipeline = _pipeline(tmp_path, max_bytes=limit)
    _pod(pipeline.folder, lockstep["straggler_input"], 6)
    assert sum(p.stat().st_size for p in pipeline.folder.glob("*.xplane.pb")) > limit
    analysis = pipeline.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    assert analysis["diagnosis"]["findings"][0]["key"] == "straggler_host"
    session = pipeline.deps.sessions.load([pipeline.blobs.stat(i["uri"]) for i in analysis["inputs"]],
                                          "pod-session", analysis["output_uri"], events=True)
    covered = [host.hostname for host in session.hosts_with_events()]
    assert any(host.endswith("process1") for host in covered) and 1 <= len(covered) <= 2
    events = run_tool(session, "aggregate_xplane_events", {"pattern": "PjitFunction"})
    assert events.ok and events.summary["hosts_covered"] == covered and events.summary["hosts_in_session"] == 6


def test_a_session_that_cannot_be_summarised_keeps_the_session_limit_and_says_why(tmp_path):
    pipeline = _pipeline(tmp_path, max_bytes=100_000)
    pipeline.folder.mkdir()
    for rank in sorted((PROFILES / "torch_ranks" / "straggler").glob("*.pt.trace.json.gz")):
        shutil.copyfile(rank, pipeline.folder / rank.name)
    analysis = pipeline.announce()
    assert analysis["status"] == "FAILED"
    assert "over the 97.7 KiB limit per session" in analysis["failure_reason"]
    assert "a PyTorch trace: each kernel's FLOPs are shared out" in analysis["failure_reason"]


def test_the_straggler_among_128_hosts_is_named_from_the_summaries(lockstep, tmp_path):
    """127 copies of the host that waits in every all-reduce and the one that prepares its input on the host: the
    summaries name the straggler and its cause, as the 32-host whole read does (tests/test_hosts_map.py)."""
    paths = _hosts(_pod(tmp_path / "pod", lockstep["straggler_input"], 128))
    _, summaries = _summaries(paths)
    session = host_summary.summary_session(host_summary.assemble(summaries), "pod")
    hosts = run_tool(session, "get_hosts")
    assert hosts.ok, hosts.reason
    assert hosts.summary["hosts"] == 128 and hosts.summary["straggler"].endswith("process1")
    assert hosts.summary["straggler_cause"] == "host_other"
    assert [session.hosts[k].hostname for k in host_summary.hosts_that_matter(session)][0].endswith("process1")


@pytest.mark.parametrize("max_bytes, xprof_memory_gib", [(400_000, "8"), (10**9, "8"), (10**9, "0.0715")])
def test_xprofs_views_of_a_device_session_over_the_limit_cover_a_named_subset_of_its_hosts(
        max_bytes, xprof_memory_gib, tmp_path, monkeypatch):
    """Four hosts of a real TPU capture in the pipeline: under the session limit and XProf's memory XProf's views
    read every host's file and say nothing of hosts; over either (the session limit; 64 MiB + 24 x ~400 KB of
    memory, XProf's estimate for two of the four files) they are built for the hosts that matter that fit, and each
    view's answer names them, instead of the session failing."""
    monkeypatch.setenv("XDIAG_XPROF_MEMORY_GIB", xprof_memory_gib)
    pipeline = _pipeline(tmp_path, max_bytes=max_bytes)
    paths = _device_pod(pipeline.folder, ["tpu_v5e/healthy"] * 4)
    assert sum(path.stat().st_size for path in paths) > 400_000
    analysis = pipeline.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    stored = pipeline.state.get(ANALYSES, analysis["analysis_id"])
    assert stored["tools"]["get_xprof_overview"]["status"] == "ok"
    session = pipeline.deps.sessions.load([pipeline.blobs.stat(i["uri"]) for i in analysis["inputs"]],
                                          "pod-session", analysis["output_uri"])
    names = [host.hostname for host in session.hosts]
    answer = views(session).overview()
    overview = json.dumps(run_tool(session, "get_xprof_overview").detail)
    report = html.unescape(re.sub(r"<[^>]+>", " ", pipeline.blobs.get(analysis["report_uri"]).decode()))
    if max_bytes > sum(path.stat().st_size for path in paths) and xprof_memory_gib == "8":
        assert "hosts_covered" not in answer and "hosts_covered" not in overview
        assert "XProf's figures cover all 4 hosts of the session together" in report
    else:
        assert answer["hosts_in_session"] == 4
        assert answer["hosts_covered"] == [names[k] for k in host_summary.hosts_that_matter(session)]
        assert '"hosts_covered"' in overview
        covered = answer["hosts_covered"]
        assert f"XProf's figures cover {len(covered)} of the session's 4 hosts" in report
        assert f"({', '.join(covered)})" in report and "cover all 4 hosts" not in report


@pytest.mark.parametrize("xprof_memory_gib", ["0.0715", "8"])
def test_xdiag_analyze_of_device_hosts_beyond_xprofs_memory_builds_its_views_for_a_named_subset(
        xprof_memory_gib, tmp_path, monkeypatch):
    """`xdiag analyze` of four hosts of a real TPU capture: where XProf's conversions may take memory for every
    host's file together, its views read them all; where they may take 64 MiB + 24 x ~400 KB (two of the four
    files, XProf's estimate, xdiag.analysis.xprof.memory_budget), the views are built for the hosts that matter that
    fit, and the tools' answers and the report name them, instead of XProf saying nothing."""
    from typer.testing import CliRunner
    from xdiag.cli import app

    paths = _device_pod(tmp_path / "pod", ["tpu_v5e/healthy"] * 4)
    monkeypatch.setenv("XDIAG_XPROF_MEMORY_GIB", xprof_memory_gib)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "pod"), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    memory = json.loads((out / "tools" / "get_memory_profile.json").read_text())
    assert memory["status"] == "ok" and memory["source"].startswith("XProf")
    report = html.unescape(re.sub(r"<[^>]+>", " ", (out / "summary.html").read_text()))
    if xprof_memory_gib == "8":
        assert "hosts_covered" not in memory["summary"]
        assert "XProf's figures cover all 4 hosts of the session together" in report
    else:
        covered = memory["summary"]["hosts_covered"]
        assert memory["summary"]["hosts_in_session"] == 4 and 1 <= len(covered) <= 2
        assert sum(path.stat().st_size for path in paths[:len(covered)]) <= 402_000 < 3 * paths[0].stat().st_size
        assert f"XProf's figures cover {len(covered)} of the session's 4 hosts" in report
        assert f"({', '.join(covered)})" in report


def _analyze(folder: Path, out: Path, max_bytes: float):
    from typer.testing import CliRunner
    from xdiag.cli import app

    return CliRunner().invoke(app, ["analyze", str(folder), "--out", str(out), "-q",
                                    "--max-profile-gib", f"{max_bytes / 2**30:.9f}"])


def test_xdiag_analyze_of_many_hosts_is_bound_by_each_host_file_not_by_their_sum(lockstep, tmp_path):
    """A folder of six hosts read host by host, each summarised: the limit binds each file (one over it is refused
    by name), not all of them together, and the straggler is named."""
    paths = _hosts(_pod(tmp_path / "pod", lockstep["straggler_input"], 6))
    largest = max(path.stat().st_size for path in paths)
    assert sum(path.stat().st_size for path in paths) > 1.5 * largest
    done = _analyze(tmp_path / "pod", tmp_path / "out", 1.5 * largest)
    assert done.exit_code == 0, done.output
    analysis = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert analysis["diagnosis"]["findings"][0]["key"] == "straggler_host"
    refused = _analyze(tmp_path / "pod", tmp_path / "refused", 0.5 * largest)
    assert refused.exit_code == 2
    assert re.search(r"\S+\.xplane\.pb is [\d.]+ [KM]iB, over the [\d.]+ [KM]iB limit per host file", refused.output)


def test_xdiag_analyze_of_hosts_that_cannot_be_summarised_keeps_the_session_limit_and_says_why(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    ranks = sorted((PROFILES / "torch_ranks" / "straggler").glob("*.pt.trace.json.gz"))
    for rank in ranks:
        shutil.copyfile(rank, folder / rank.name)
    largest = max(rank.stat().st_size for rank in ranks)
    refused = _analyze(folder, tmp_path / "out", 1.5 * largest)
    assert refused.exit_code == 2
    assert "limit per session that binds where its hosts cannot be summarised" in refused.output
    assert "a PyTorch trace: each kernel's FLOPs are shared out" in refused.output
