"""The stages over the embedded adapters: at-least-once delivery, fan-in once, bad input recorded."""

from __future__ import annotations

import os

import pytest
from xdiag.cloud.embedded import analyze_session, build_embedded
from xdiag.cloud.memory import InProcessBus, MemoryStateStore
from xdiag.errors import PoisonMessage
from xdiag.model import CaptureReady, InvestigationReady, ReportReady, ToolDone, ToolRun
from xdiag.pipeline.publish_once import PUBLISHED, PublishOnce
from xdiag.pipeline.stages.collect import collect
from xdiag.pipeline.stages.investigate import investigate
from xdiag.pipeline.stages.render import render
from xdiag.pipeline.stages.tool_runs import aggregate, run_tool
from xdiag.pipeline.topics import (
    ANALYSES,
    CLAIMS,
    TOPIC_INVESTIGATIONS,
    TOPIC_TOOL_RESULTS,
    TOPIC_TOOL_RUNS,
    tools_collection,
)
from xdiag.profile.locate import locate_session
from xdiag.tools import BROAD_TOOLS


def _capture(path, out, analysis_id="a1") -> CaptureReady:
    return CaptureReady(analysis_id=analysis_id, run_id="run", session_id="s1", profile_uris=[str(path)], output_uri=str(out))


def test_every_message_delivered_twice_gives_one_analysis(cpu_profiles, tmp_path):
    deps, bus = build_embedded()
    duplicate_each = bus.publish

    def publish_twice(topic, message):  # Pub/Sub delivers at least once
        duplicate_each(topic, message)
        duplicate_each(topic, message)

    bus.publish = publish_twice
    bus.publish("captures", _capture(cpu_profiles["input_bound"], tmp_path / "out"))
    bus.drain()
    investigations = [m for t, m in bus.delivered if t == TOPIC_INVESTIGATIONS]
    assert len(investigations) == 2  # both copies of the one claim's message…
    analysis = deps.state.get(ANALYSES, "a1")
    assert analysis["status"] == "DONE" and analysis["result"] == "NEEDS_ATTENTION"
    assert [k for k, _ in deps.state.list(CLAIMS) if k.endswith(".investigate")] == ["a1.investigate"]  # one claim
    assert len(analysis["diagnosis"]["follow_up_calls"]) <= 4
    assert sorted(p.stem for p in (tmp_path / "out" / "tools").glob("*.json") if not p.stem.startswith("followup")) == sorted(BROAD_TOOLS)


def test_duplicate_tool_result_fires_investigation_once(cpu_profiles, tmp_path):
    deps, bus = build_embedded()
    collect(_capture(cpu_profiles["healthy"], tmp_path), deps)
    for tool in BROAD_TOOLS:
        run_tool(ToolRun(analysis_id="a1", tool=tool), deps)
    bus._queue.clear()
    for _ in range(3):
        aggregate(ToolDone(analysis_id="a1", tool="get_hosts"), deps)
    assert [t for t, _ in bus._queue] == [TOPIC_INVESTIGATIONS]


def test_fan_in_messages_go_without_a_claim_and_the_others_once():
    """The fan-in takes a repeated ToolDone as the first (above), so it is published again, without a round trip to
    claim it; a repeated ToolRun would run its tool twice, so it is published once."""
    bus, state = InProcessBus(), MemoryStateStore()
    once = PublishOnce(bus, state)
    run, done = ToolRun(analysis_id="a1", tool="get_hosts"), ToolDone(analysis_id="a1", tool="get_hosts")
    for _ in range(2):
        once.publish(TOPIC_TOOL_RUNS, run)
        once.publish(TOPIC_TOOL_RESULTS, done)
    assert list(bus._queue) == [(TOPIC_TOOL_RUNS, run), (TOPIC_TOOL_RESULTS, done), (TOPIC_TOOL_RESULTS, done)]
    assert len(state.list(PUBLISHED)) == 1


def test_aggregate_waits_for_all_15_tools(cpu_profiles, tmp_path):
    deps, bus = build_embedded()
    collect(_capture(cpu_profiles["healthy"], tmp_path), deps)
    for tool in BROAD_TOOLS[:-1]:
        run_tool(ToolRun(analysis_id="a1", tool=tool), deps)
    bus._queue.clear()
    aggregate(ToolDone(analysis_id="a1", tool=BROAD_TOOLS[0]), deps)
    assert not bus._queue


def test_rerunning_a_tool_does_not_recompute_it(cpu_profiles, tmp_path):
    deps, _ = build_embedded()
    collect(_capture(cpu_profiles["healthy"], tmp_path), deps)
    run_tool(ToolRun(analysis_id="a1", tool="get_step_trace"), deps)
    first = deps.state.get(tools_collection("a1"), "get_step_trace")
    run_tool(ToolRun(analysis_id="a1", tool="get_step_trace"), deps)
    assert deps.state.get(tools_collection("a1"), "get_step_trace") == first


def test_investigate_and_render_twice_change_nothing(cpu_profiles, tmp_path):
    deps, bus = build_embedded()
    bus.publish("captures", _capture(cpu_profiles["host_sync"], tmp_path / "out"))
    bus.drain()
    before = deps.state.get(ANALYSES, "a1")
    investigate(InvestigationReady(analysis_id="a1"), deps)
    render(ReportReady(analysis_id="a1"), deps)
    after = deps.state.get(ANALYSES, "a1")
    assert after["diagnosis"] == before["diagnosis"] and after["status"] == "DONE"


@pytest.mark.parametrize(
    "content, reason",
    [(b"", "empty file"), (os.urandom(2048), "not an XSpace profile|truncated|malformed")],
)
def test_bad_profile_fails_the_analysis_with_a_reason_and_keeps_the_file(tmp_path, content, reason):
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(content)
    analysis = analyze_session(locate_session(bad), tmp_path / "out")
    assert analysis.status == "FAILED"
    import re

    assert re.search(reason, analysis.failure_reason)
    assert bad.read_bytes() == content, "the raw profile stays as it was"
    html = (tmp_path / "out" / "summary.html").read_text()
    assert "FAILED" in html and analysis.failure_reason.split(":")[0] in html


def test_unknown_analysis_is_an_error_not_a_silent_pass(tmp_path):
    deps, _ = build_embedded()
    with pytest.raises(LookupError, match="unknown analysis"):
        run_tool(ToolRun(analysis_id="nope", tool="get_hosts"), deps)
    with pytest.raises(PoisonMessage, match="unknown analysis"):  # dead-lettered with the reason, not dropped
        aggregate(ToolDone(analysis_id="nope", tool="get_hosts"), deps)


def test_a_tool_that_is_not_a_broad_tool_is_refused_and_adds_nothing(cpu_profiles, tmp_path):
    deps, _ = build_embedded()
    collect(_capture(cpu_profiles["healthy"], tmp_path), deps)
    with pytest.raises(PoisonMessage, match="not one of the broad tools"):
        run_tool(ToolRun(analysis_id="a1", tool="get_everything"), deps)
    assert deps.state.get(tools_collection("a1"), "get_everything") is None


def test_follow_up_budget_is_enforced_by_the_stage(cpu_profiles, tmp_path):
    from xdiag.model import Diagnosis, Status

    class Greedy:
        name = "greedy"

        def investigate(self, health, results, call_tool):
            answers = [call_tool("get_hosts", {}, "h") for _ in range(6)]
            answers.append(call_tool("get_xprof_overview", {}, "not a follow-up"))
            self.answers = answers
            return Diagnosis(status=Status.NEEDS_ATTENTION, summary="s", investigator=self.name)

    greedy = Greedy()
    deps, bus = build_embedded(investigators={"greedy": lambda: greedy})
    message = _capture(cpu_profiles["input_bound"], tmp_path / "out").model_copy(update={"investigator": "greedy"})
    bus.publish("captures", message)
    bus.drain()
    assert [a is not None for a in greedy.answers[:6]] == [True] * 4 + [False] * 2
    calls = deps.state.get(ANALYSES, "a1")["diagnosis"]["follow_up_calls"]
    assert sum("limit of 4" in (c["reason"] or "") for c in calls) == 2
    assert sum("not a follow-up tool" in (c["reason"] or "") for c in calls) == 1


def test_the_investigation_deadline_holds_during_a_tool_call(cpu_profiles, tmp_path, monkeypatch):
    """A follow-up tool still running at the investigation's deadline is answered as stopped (the investigation
    goes on), and a call after the deadline is refused before it runs."""
    import threading

    from xdiag.model import Diagnosis, Status
    from xdiag.pipeline.stages import investigate as investigate_stage

    release = threading.Event()
    real = investigate_stage.execute_tool

    def stuck(session, name, args):  # a tool that does not return while the investigation waits
        if name == "get_hosts":
            release.wait(60)
        return real(session, name, args)

    class Patient:
        name = "patient"

        def investigate(self, health, results, call_tool):
            self.answers = [call_tool("get_hosts", {}, "h"), call_tool("get_roofline_model", {}, "r")]
            return Diagnosis(status=Status.NEEDS_ATTENTION, summary="s", investigator=self.name)

    patient = Patient()
    monkeypatch.setattr(investigate_stage, "execute_tool", stuck)
    deps, bus = build_embedded(investigators={"patient": lambda: patient})
    deps.investigation_deadline_s = 0.5
    bus.publish("captures", _capture(cpu_profiles["healthy"], tmp_path / "out").model_copy(
        update={"investigator": "patient"}))
    try:
        bus.drain()
    finally:
        release.set()
    stopped, refused = patient.answers
    assert stopped.status.value == "failed" and "still running at the investigation's deadline" in stopped.reason
    assert refused.status.value == "failed" and "deadline of 0.5 s has passed" in refused.reason
    assert deps.state.get(ANALYSES, "a1")["status"] == "DONE"


def test_a_pytorch_trace_in_a_session_folder_is_a_host_file_and_xplanes_come_first(tmp_path):
    """torch.profiler's `<worker>.pt.trace.json[.gz]` names a host of the session like `<host>.xplane.pb`; XProf's
    own `<host>.trace.json.gz` beside an xplane (a view of it) and other JSON are not hosts; a folder holding both
    formats is analysed from its xplanes, as `xdiag analyze` locates them."""
    from xdiag.cloud.memory import LocalBlobStore
    from xdiag.pipeline.layout import parse_profile_uri, session_files, session_prefix

    root = str(tmp_path / "bucket")
    prefix = session_prefix(root, "run", "s1")
    named = parse_profile_uri(prefix + "worker0.1764846000000.pt.trace.json.gz")
    assert named is not None and (named.session, named.host) == ("s1", "worker0.1764846000000")
    assert parse_profile_uri(prefix + "rank1.pt.trace.json").host == "rank1"
    for other in ("host0.trace.json.gz", "config.json", ".pt.trace.json.gz"):
        assert parse_profile_uri(prefix + other) is None, other
    store = LocalBlobStore()
    store.put(prefix + "rank0.pt.trace.json.gz", b"{}")
    store.put(prefix + "rank1.pt.trace.json.gz", b"{}")
    assert [i.uri.rsplit("/", 1)[-1] for i in session_files(store, root, "run", "s1")] == [
        "rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    store.put(prefix + "host0.xplane.pb", b"x")
    assert [i.uri.rsplit("/", 1)[-1] for i in session_files(store, root, "run", "s1")] == ["host0.xplane.pb"]


def test_an_automatic_capture_s_baseline_is_the_run_s_last_healthy_session_and_another_s_the_previous_one():
    """Sessions s1 (on demand), s2 (automatic), s3 (automatic), each analysed after the one before: s3 is compared
    with s1 (s2 was itself taken because the run got slower), an on-demand s4 with s3, the latest."""
    from xdiag.model import Analysis
    from xdiag.pipeline.layout import state_key
    from xdiag.pipeline.previous import LAST_HEALTHY, PREVIOUS, baseline_analysis
    from xdiag.pipeline.topics import sessions_collection

    deps, _ = build_embedded()
    kinds = {"s1": "on_demand", "s2": "auto", "s3": "auto", "s4": "on_demand"}
    for n, (session, kind) in enumerate(kinds.items()):
        deps.state.set(sessions_collection("run"), state_key(session),
                       {"session_id": session, "kind": kind, "analysis_id": f"a-{session}"})
        deps.state.set(ANALYSES, f"a-{session}", {"analysis_id": f"a-{session}", "run_id": "run", "session_id": session,
                                                   "status": "DONE", "output_uri": f"/out/{session}",
                                                   "created_at": f"2026-12-06T07:0{n}:00Z"})

    def baseline(session: str, n: int):
        analysis = Analysis(analysis_id=f"a-{session}", run_id="run", session_id=session, profile_uris=[],
                            output_uri=f"/out/{session}", created_at=f"2026-12-06T07:0{n}:00Z")
        doc, role = baseline_analysis(deps, analysis)
        return (doc or {}).get("session_id"), role

    assert baseline("s1", 0) == (None, PREVIOUS)  # a run's first session compares with nothing
    assert baseline("s2", 1) == ("s1", LAST_HEALTHY)
    assert baseline("s3", 2) == ("s1", LAST_HEALTHY)
    assert baseline("s4", 3) == ("s3", PREVIOUS)
