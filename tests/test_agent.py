"""xdiag in a coding agent: tool help from the registry, typed arguments, the local result cache, the agent skill,
and `xdiag mcp` driven by the MCP SDK's own client over stdio and streamable HTTP, on real profiles."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner
from xdiag.agent.result_cache import ResultCache, answer_tool
from xdiag.cli import app
from xdiag.profile.locate import locate_session
from xdiag.tools import REGISTRY, run_tool
from xdiag.tools.describe import describe_all, field_patterns, parse_cli_args, returns
from xdiag.tools.registry import ToolSpec

from tests.conftest import H200, TESTS

TPU_V5E = TESTS / "profiles" / "tpu_v5e"
RANKS = TESTS / "profiles" / "torch_ranks" / "straggler"
MCP_OWN_TOOLS = {"analyze", "list_sessions", "explain_finding"}


def _xdiag(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def cpu_capture(tmp_path_factory) -> Path:
    """A real CPU profile of one bundled JAX workload (host-plane analysis: what the device profiles do not cover)."""
    from xdiag.examples.capture import capture_workload

    return capture_workload("host_sync", tmp_path_factory.mktemp("agent-cpu"))


# --- what a tool takes and returns, from the registry ---------------------------------------------------------


def test_every_tool_help_shows_the_fields_its_summary_returns():
    runner = CliRunner()
    for name, spec in REGISTRY.items():
        fields = returns(spec).fields
        assert fields, f"{name}'s docstring names no summary field (`summary: a, b_c, …`)"
        done = runner.invoke(app, ["tool", name, "--help"])
        assert done.exit_code == 0, done.output
        assert spec.question in done.output
        listed = done.output.split("Summary fields:\n", 1)[1].split("\n\n", 1)[0].split()
        assert listed == list(fields), name
        for arg in spec.parameters:
            assert f"--arg {arg}=" in done.output


def test_every_summary_field_a_tool_returns_is_documented(cpu_capture, monkeypatch):
    """Run every tool on real CPU, GPU (H200), TPU (v5e) and PyTorch (4 ranks) profiles: each summary key must match
    a field its docstring names, so `--help` and the MCP descriptions tell the truth."""
    from xdiag.profile.session import read_session

    monkeypatch.setenv("XDIAG_XPROF_VIEWS", "0")  # XProf's converters add only its own xprof_* fields
    profiles = [cpu_capture, H200 / "recompilation.xplane.pb", H200 / "input_bound.xplane.pb",
                TPU_V5E / "host_offload.xplane.pb", TPU_V5E / "conv_net_train.xplane.pb", RANKS]
    answered: dict[str, int] = {name: 0 for name in REGISTRY}
    for profile in profiles:
        located = locate_session(profile)
        session = read_session(located.files, name=located.name)
        top_op = run_tool(session, "get_hlo_op_profile").summary.get("top_op")
        for name, spec in REGISTRY.items():
            args = {"pattern": "."} if "pattern" in spec.parameters else {}
            if "op" in spec.parameters:
                if top_op is None:
                    continue
                args = {"op": top_op}
            result = run_tool(session, name, args)
            assert result.status.value != "failed", (profile, name, result.reason)
            if result.status.value != "ok":
                continue
            answered[name] += 1
            patterns = field_patterns(returns(spec).fields)
            undocumented = [key for key in result.summary if not any(p.match(key) for p in patterns)]
            assert not undocumented, f"{name} on {profile.name} returns {undocumented}, which its docstring does not name"
    # XProf's suggestions need its converters (off here); no profile here carries a TPU's LLO lines
    assert {name for name, n in answered.items() if n == 0} == {"get_smart_suggestions", "llo_load", "llo_query"}


def test_tools_json_lists_every_tool_with_typed_arguments_and_defaults():
    done = CliRunner().invoke(app, ["tools", "--json"])
    assert done.exit_code == 0, done.output
    listed = {tool["name"]: tool for tool in json.loads(done.stdout)}
    assert set(listed) == set(REGISTRY)
    assert listed["get_roofline_model"]["arguments"]["top_n"] == {
        "type": "integer", "description": "how many ops to list (1-200, default 20)", "required": False, "default": 20,
        "minimum": 1, "maximum": 200}
    pattern = listed["aggregate_xplane_events"]["arguments"]["pattern"]
    assert pattern["required"] and pattern["format"] == "re2" and "default" not in pattern
    assert listed["get_hlo_neighborhood"]["arguments"]["depth"]["default"] == 1
    assert "step_time_ms_{mean,median,min,max}" in listed["get_step_trace"]["returns"]["summary_fields"]
    assert listed["get_step_trace"]["broad"] and not listed["get_hlo_neighborhood"]["broad"]


def _choice(session, mode: str = "fast", ratio: float = 0.5, exact: bool = False):  # a tool's function, for its spec
    raise AssertionError("not run")


def test_command_line_arguments_are_typed_and_checked_as_for_the_investigator():
    spec = ToolSpec(name="choice", question="?", func=_choice, broad=False, follow_up=False, parameters={
        "mode": {"type": "string", "enum": ["fast", "exact"]}, "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "exact": {"type": "boolean"}})
    assert parse_cli_args(spec, ["mode=exact", "ratio=0.25", "exact=true"]) == {"mode": "exact", "ratio": 0.25, "exact": True}
    for bad, reason in (("mode=slow", "must be one of ['fast', 'exact']"), ("ratio=2", "must be from 0 to 1"),
                        ("ratio=x", "is not a number"), ("exact=maybe", "is not a boolean"), ("other=1", "no argument")):
        with pytest.raises(ValueError, match=re.escape(reason)):
            parse_cli_args(spec, [bad])
    with pytest.raises(ValueError, match="not a regular expression RE2 accepts"):
        parse_cli_args(REGISTRY["aggregate_xplane_events"], ["pattern=(a)\\1"])


def test_a_bad_argument_exits_2_with_the_reason_and_keeps_nothing(tmp_path):
    profile = str(H200 / "input_bound.xplane.pb")
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    for arg, reason in (("top_n=abc", "'abc' is not an integer"), ("top_n=500", "must be from 1 to 200, got 500"),
                        ("depth=2", "takes no argument(s) ['depth']")):
        done = _xdiag("tool", "get_hlo_op_profile", profile, "--arg", arg, cwd=tmp_path, env=env)
        assert done.returncode == 2 and reason in done.stderr and not done.stdout
    assert not (tmp_path / "cache").exists()


# --- the local result cache ------------------------------------------------------------------------------------


def test_a_second_tool_call_answers_from_the_cache_and_a_changed_file_afresh(tmp_path):
    profile = tmp_path / "input_bound.xplane.pb"
    shutil.copyfile(H200 / "input_bound.xplane.pb", profile)
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    first = _xdiag("tool", "get_hlo_op_profile", str(profile), "--arg", "top_n=3", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    answers = list((tmp_path / "cache").glob("*/answers/*.json"))
    assert len(answers) == 1 and (answers[0].parents[1] / "session.xdiag").exists()
    header, _, kept = answers[0].read_text().partition("\n")
    assert kept == first.stdout and header == f"xdiag-answer sha256={hashlib.sha256(kept.encode()).hexdigest()}"
    # The kept answer is what the next call prints (marked here so that the test sees where it came from)...
    marked = first.stdout.replace('"tool": "get_hlo_op_profile"', '"tool": "get_hlo_op_profile", "kept": 1')
    answers[0].write_text(f"xdiag-answer sha256={hashlib.sha256(marked.encode()).hexdigest()}\n{marked}")
    again = _xdiag("tool", "get_hlo_op_profile", str(profile), "--arg", "top_n=3", cwd=tmp_path, env=env)
    assert again.returncode == 0 and '"kept": 1' in again.stdout
    # ...where its digest matches it: one that does not (a planted answer, a truncated one) is answered afresh.
    answers[0].write_text(marked)
    planted = _xdiag("tool", "get_hlo_op_profile", str(profile), "--arg", "top_n=3", cwd=tmp_path, env=env)
    assert planted.returncode == 0 and '"kept"' not in planted.stdout
    assert json.loads(planted.stdout)["summary"] == json.loads(first.stdout)["summary"]
    fresh = _xdiag("tool", "get_hlo_op_profile", str(profile), "--arg", "top_n=3", "--no-cache", cwd=tmp_path, env=env)
    assert fresh.returncode == 0 and '"kept"' not in fresh.stdout
    # Another tool on the same file version maps the session decoded once.
    other = _xdiag("tool", "get_step_trace", str(profile), cwd=tmp_path, env=env)
    assert other.returncode == 0 and len(list((tmp_path / "cache").glob("*/session.xdiag"))) == 1
    # A replaced file is another version: decoded and answered again, never the old answer.
    os.utime(profile, ns=(time.time_ns(), time.time_ns() + 10**9))
    changed = _xdiag("tool", "get_hlo_op_profile", str(profile), "--arg", "top_n=3", cwd=tmp_path, env=env)
    assert changed.returncode == 0 and '"kept"' not in changed.stdout
    assert json.loads(changed.stdout)["summary"] == json.loads(first.stdout)["summary"]
    assert len(list((tmp_path / "cache").glob("*/session.xdiag"))) == 2


def test_no_cache_keeps_nothing(tmp_path):
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    done = _xdiag("tool", "get_kpi_metrics", str(H200 / "healthy.xplane.pb"), "--no-cache", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_be_written_is_said_and_the_tool_still_answers(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "a-file" / "cache")}
    done = _xdiag("tool", "get_kpi_metrics", str(H200 / "healthy.xplane.pb"), cwd=tmp_path, env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["status"] == "ok"
    assert "cannot be written" in done.stderr


def test_a_failed_answer_is_never_kept(tmp_path):
    cache = ResultCache(tmp_path / "cache")
    files = [H200 / "healthy.xplane.pb"]
    text, status = answer_tool(files, "healthy", "get_hlo_op_profile", {"top_n": 0}, cache, 2**30)  # unchecked: fails
    assert status == "failed" and "bad arguments" in json.loads(text)["reason"]
    assert cache.answer(files, "get_hlo_op_profile", {"top_n": 0}) is None
    text, status = answer_tool(files, "healthy", "get_hlo_op_profile", {"top_n": 2}, cache, 2**30)
    assert status == "ok" and cache.answer(files, "get_hlo_op_profile", {"top_n": "2"}) == text  # --arg top_n=2 too


def test_the_cache_is_bounded_and_drops_the_least_recently_used_session(tmp_path):
    names = ("healthy", "memory_bound", "widening_convert")
    files = {name: [H200 / f"{name}.xplane.pb"] for name in names}
    roomy = ResultCache(tmp_path / "cache", limit_bytes=2**30)
    for name in names[:2]:
        answer_tool(files[name], name, "get_kpi_metrics", {}, roomy, 2**30)
        time.sleep(0.02)
    assert roomy.answer(files["healthy"], "get_kpi_metrics", {})  # a use: healthy is now the most recent
    sizes = {name: sum(f.stat().st_size for f in roomy.entry(files[name]).rglob("*") if f.is_file())
             for name in names[:2]}
    tight = ResultCache(tmp_path / "cache", limit_bytes=sizes["healthy"] + sizes["memory_bound"])
    answer_tool(files["widening_convert"], "widening_convert", "get_kpi_metrics", {}, tight, 2**30)
    kept = {name for name in names if tight.entry(files[name]).exists()}
    assert kept == {"healthy", "widening_convert"}  # memory_bound, least recently used, went past the limit


# --- the agent skill -------------------------------------------------------------------------------------------


def test_skill_names_every_tool_and_is_an_agent_skill():
    done = CliRunner().invoke(app, ["skill"])
    assert done.exit_code == 0
    front = re.match(r"---\nname: ([a-z0-9-]+)\ndescription: (.+?)\n---\n", done.stdout)
    assert front and len(front.group(1)) <= 64 and len(front.group(2)) <= 1024
    for name in [*REGISTRY, *MCP_OWN_TOOLS]:
        assert f"`{name}`" in done.stdout, f"SKILL.md does not say when to use {name}"


# --- xdiag mcp, driven by the MCP SDK's client -----------------------------------------------------------------


def _log_dir(tmp_path: Path) -> Path:
    """An XProf log dir of two sessions of real profiles."""
    for session, name in (("2026_12_01_10_00_00", "input_bound"), ("2026_12_02_10_00_00", "memory_bound")):
        folder = tmp_path / "logs" / "plugins" / "profile" / session
        folder.mkdir(parents=True)
        shutil.copyfile(H200 / f"{name}.xplane.pb", folder / "host0.xplane.pb")
    return tmp_path / "logs"


async def _drive(client_of, tmp_path: Path) -> None:
    from mcp.shared.exceptions import MCPError

    async with client_of() as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == set(REGISTRY) | MCP_OWN_TOOLS
        for name, spec in REGISTRY.items():
            schema = listed[name].input_schema
            assert schema["required"][0] == "path" and set(schema["properties"]) == {"path", "session", *spec.parameters}
            assert spec.question in listed[name].description
        assert listed["get_hlo_op_profile"].input_schema["properties"]["top_n"] == {
            "type": "integer", "description": "how many ops to list (1-200, default 20)", "minimum": 1, "maximum": 200,
            "default": 20}

        profile = str(H200 / "input_bound.xplane.pb")
        steps = (await client.call_tool("get_step_trace", {"path": profile})).structured_content
        assert steps["status"] == "ok" and steps["summary"]["steps"] == 12
        ops = (await client.call_tool("get_hlo_op_profile", {"path": profile, "top_n": 3})).structured_content
        assert ops["args"] == {"top_n": 3} and len(ops["detail"]["ops"]) == 3
        logs = _log_dir(tmp_path)
        memory = (await client.call_tool("get_memory_profile", {"path": str(logs), "session": "2026_12_01_10_00_00"}))
        assert memory.structured_content["status"] in ("ok", "not_available")
        assert json.loads(memory.content[0].text) == memory.structured_content
        llo = (await client.call_tool("llo_load", {"path": profile})).structured_content
        assert llo["status"] == "not_available" and llo["reason"]

        sessions = (await client.call_tool("list_sessions", {"path": str(logs)})).structured_content
        assert [s["session"] for s in sessions["sessions"]] == ["2026_12_01_10_00_00", "2026_12_02_10_00_00"]

        out = tmp_path / "analysis"
        analysed = (await client.call_tool("analyze", {"path": profile, "out": str(out)})).structured_content
        assert analysed["status"] == "NEEDS_ATTENTION" and analysed["findings"][0]["key"] == "input_bound"
        assert Path(analysed["report"]).exists() and analysed["analysis"] == str(out)
        explained = (await client.call_tool("explain_finding", {"analysis": analysed["analysis"],
                                                                "finding": "input_bound"})).structured_content
        assert explained["fix"] and explained["evidence"]
        quoted = [e for e in explained["evidence"] if e["tool"] == "get_step_trace"]
        assert quoted and all(e["documented_field"] and e["reported"] == e["value"] for e in quoted)

        for name, arguments, reason in (
            ("get_step_trace", {"path": str(tmp_path / "missing.xplane.pb")}, "no such file or directory"),
            ("get_hlo_op_profile", {"path": profile, "top_n": 0}, "must be from 1 to 200, got 0"),
            ("get_hlo_op_profile", {"path": profile, "top_n": "many"}, "must be a integer"),
            ("get_step_trace", {"path": profile, "steps": 3}, "takes no argument(s) ['steps']"),
            ("aggregate_xplane_events", {"path": profile}, "needs argument 'pattern'"),
            ("no_such_tool", {"path": profile}, "unknown tool 'no_such_tool'"),
            ("analyze", {"path": str(tmp_path / "missing")}, "no such file or directory"),
            ("explain_finding", {"analysis": analysed["analysis"], "finding": "9"}, "its findings: 1 input_bound"),
            ("list_sessions", {}, "no local stack in"),  # none was started in this folder
            ("list_sessions", {"path": str(logs.parent / "nothing-here")}, "no such file or directory"),
            ("list_sessions", {"path": str(profile)}, "no sessions under plugins/profile/<session>/"),
        ):
            with pytest.raises(MCPError) as raised:
                await client.call_tool(name, arguments)
            assert reason in raised.value.message, (name, arguments, raised.value.message)


def test_mcp_over_stdio(tmp_path):
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp"], env=env, cwd=tmp_path)
    anyio.run(_drive, lambda: Client(params, read_timeout_seconds=240), tmp_path)
    assert list((tmp_path / "cache").glob("*/answers/*.json"))  # the server answers through the result cache


def test_mcp_over_streamable_http_on_loopback(tmp_path):
    from mcp import Client

    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    server = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "mcp", "--http", "--port", "0"], cwd=tmp_path,
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        said, url = [], None
        for line in server.stderr:  # the line saying where it listens (after any warning of the imports)
            said.append(line)
            if url := re.search(r"http://127\.0\.0\.1:\d+/mcp", line):
                break
        assert url, "".join(said)
        threading.Thread(target=server.stderr.read, daemon=True).start()  # a full pipe would stop the server
        anyio.run(_drive, lambda: Client(url.group(0), read_timeout_seconds=240), tmp_path)
    finally:
        server.terminate()
        server.wait(timeout=30)
