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
MCP_OWN_TOOLS = {"analyze", "list_sessions", "explain_finding", "diff_sessions"}
ANALYSING = {"analyze", "diff_sessions"}  # the tools that may write an analysis folder


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


def test_a_tool_after_analyze_answers_from_what_the_analysis_computed(tmp_path):
    """`xdiag analyze` keeps its tools' answers per file version: `xdiag tool` on the same files then decodes nothing
    (on main it decoded the profile again: 3.2 s on a 16 MB capture) and prints the analysis's own answer."""
    env = {"XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    profile = str(H200 / "input_bound.xplane.pb")
    analysed = _xdiag("analyze", profile, "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path, env=env)
    assert analysed.returncode == 0, analysed.stderr
    for tool in ("get_step_trace", "get_hlo_op_profile"):
        done = _xdiag("tool", tool, profile, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == json.loads((tmp_path / "out" / "tools" / f"{tool}.json").read_text())
    assert not list((tmp_path / "cache").glob("*/session.xdiag"))  # no decode: nothing was read but the answers
    other = _xdiag("tool", "get_hlo_op_profile", profile, "--arg", "top_n=3", cwd=tmp_path, env=env)  # not asked
    assert other.returncode == 0 and len(list((tmp_path / "cache").glob("*/session.xdiag"))) == 1


def test_mcp_analyze_writes_below_an_allowed_folder_or_the_cache_and_the_tools_answer_from_it(tmp_path):
    """MCP `analyze` without `out` writes nothing in the server's working folder (main wrote ./xdiag-out there):
    below the allowed folder that holds the profile, else below the result cache's folder; the tools asked next
    answer from what it computed, without decoding the profile."""
    from mcp import Client, StdioServerParameters

    work, allowed = tmp_path / "work", tmp_path / "allowed"
    work.mkdir()
    allowed.mkdir()
    profile = allowed / "running_sum.xplane.pb"
    shutil.copyfile(TPU_V5E / "running_sum.xplane.pb", profile)
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}

    async def drive(args: list[str]) -> Path:
        params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", *args], env=env,
                                       cwd=work)
        async with Client(params, read_timeout_seconds=240) as client:
            analysed = _answer(await client.call_tool("analyze", {"path": str(profile)}))
            steps = _answer(await client.call_tool("get_step_trace", {"path": str(profile)}))
        folder = Path(analysed["analysis"])
        written = json.loads((folder / "tools" / "get_step_trace.json").read_text())
        assert steps["summary"] == written["summary"] and steps["duration_ms"] == written["duration_ms"]
        return folder

    in_cache = anyio.run(drive, [])
    assert in_cache.is_relative_to(tmp_path / "cache") and (in_cache / "summary.html").is_file()
    in_allowed = anyio.run(drive, ["--allow", str(allowed)])
    assert in_allowed == allowed / "xdiag-out" / "running_sum" and (in_allowed / "summary.html").is_file()
    assert not list(work.iterdir())  # nothing in the server's working folder
    assert not list((tmp_path / "cache").glob("*/session.xdiag"))  # the tool decoded nothing


EXAMPLES = TESTS.parent / "shared" / "xdiag" / "examples"


def test_mcp_analyze_quotes_each_findings_code_from_a_source_root_inside_the_allowed_folders(tmp_path):
    """MCP `analyze` with `source_root` (a checkout of the profiled program inside the allowed folders): each
    finding carries its lines with their code, as `xdiag analyze --source-root` writes them in analysis.json, so the
    agent sees what a finding is about without a second call; a source_root outside the folders, or no folder, is
    refused with the reason."""
    from mcp import Client

    allowed = tmp_path / "allowed"
    checkout = allowed / "checkout" / "workloads"  # the capture recorded /work/main/shared/xdiag/workloads/*.py
    shutil.copytree(EXAMPLES, checkout)
    shutil.copyfile(TPU_V5E / "layout_transpose.xplane.pb", allowed / "layout_transpose.xplane.pb")
    (tmp_path / "outside").mkdir()

    async def drive() -> None:
        async with Client(_allowed_server(tmp_path, allowed), read_timeout_seconds=240, mode="legacy") as client:
            analysed = _answer(await client.call_tool("analyze", {
                "path": str(allowed / "layout_transpose.xplane.pb"), "out": str(allowed / "out"),
                "source_root": str(allowed / "checkout")}))
            top = analysed["findings"][0]
            line = top["source_lines"][0]
            number = int(line["line"].rpartition(":")[2])
            assert top["key"] == "transposed_outputs" and line["line"].startswith("workloads/layout_transpose.py:")
            assert line["code"] == (EXAMPLES / "layout_transpose.py").read_text().splitlines()[number - 1].strip()
            assert line["code"].startswith("bdsh = jnp.transpose(")
            stored = json.loads((allowed / "out" / "analysis.json").read_text())["diagnosis"]["findings"][0]
            assert stored["source_lines"][0]["code"] == line["code"]  # one path: the analysis' own findings
            for source_root, reason in ((tmp_path / "outside", "outside the folders this server may use"),
                                        (allowed / "layout_transpose.xplane.pb", "not a folder")):
                result = await client.call_tool("analyze", {"path": str(allowed / "layout_transpose.xplane.pb"),
                                                            "out": str(allowed / "again"),
                                                            "source_root": str(source_root)})
                assert result.is_error and reason in result.content[0].text, result.content[0].text
            assert not (allowed / "again").exists()

    anyio.run(drive)


def test_tools_list_as_the_client_receives_it_fits_its_bound(tmp_path):
    """tools/list is paid by every session of a client: the JSON-RPC message on the wire, envelope included, under
    TOOLS_LIST_BYTES (the SDK's model of the result, which the other test weighs, leaves the envelope out)."""
    from xdiag.agent.mcp_server import TOOLS_LIST_BYTES

    server = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "mcp"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")})
    try:
        def ask(request_id: int, method: str, params: dict) -> bytes:
            server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                           "params": params}).encode() + b"\n")
            server.stdin.flush()
            while json.loads(line := server.stdout.readline()).get("id") != request_id:
                pass
            return line

        ask(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "test", "version": "0"}})
        server.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        received = ask(2, "tools/list", {})
        listed = json.loads(received)["result"]["tools"]
        assert {tool["name"] for tool in listed} == set(REGISTRY) | MCP_OWN_TOOLS
        assert len(received) <= TOOLS_LIST_BYTES, len(received)
    finally:
        server.kill()
        server.wait(timeout=30)


def test_the_op_profile_answers_each_ops_row_once(tmp_path):
    """get_hlo_op_profile as an agent receives it, on a TPU profile of four ops with XProf's views: each op's row
    once (main gave XProf's rows of the same ops by time, FLOPs and bytes beside detail.ops: each op four times),
    and XProf's own figures (its idle time, its categories) still there."""
    from xdiag.agent.mcp_server import XdiagTools

    tools = XdiagTools(cache=None, max_bytes=2**30, stack_dir=tmp_path)
    arguments = {"path": str(TPU_V5E / "widening_convert.xplane.pb")}
    answer = tools.call("get_hlo_op_profile", arguments)
    rows: list[str] = []  # every op row anywhere in the answer: a mapping naming an op and its time

    def walk(value) -> None:
        if isinstance(value, dict):
            name = value.get("op", value.get("name"))
            if isinstance(name, str) and ("total_ms" in value or "self_time_ms" in value):
                rows.append(name)
            for inner in value.values():
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(json.loads(tools.answer_text("get_hlo_op_profile", arguments, answer)))
    assert answer["summary"]["distinct_ops"] == 4
    assert sorted(rows) == sorted(row["op"] for row in answer["detail"]["ops"]) and len(set(rows)) == 4
    xprof = answer["detail"]["xprof"]
    assert xprof["idle_percent"] > 0 and xprof["detail"]["categories"], xprof


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
    # the fix is not said to fit: what xdiag read from the profile, and what it has not checked (issue 62)
    assert "already fits" not in done.stdout
    assert "premises it read from the profile" in done.stdout and "What it has not checked" in done.stdout


# --- xdiag mcp, driven by the MCP SDK's client -----------------------------------------------------------------


def _log_dir(tmp_path: Path) -> Path:
    """An XProf log dir of two sessions of real profiles."""
    for session, name in (("2026_12_01_10_00_00", "input_bound"), ("2026_12_02_10_00_00", "memory_bound")):
        folder = tmp_path / "logs" / "plugins" / "profile" / session
        folder.mkdir(parents=True)
        shutil.copyfile(H200 / f"{name}.xplane.pb", folder / "host0.xplane.pb")
    return tmp_path / "logs"


def _answer(result) -> dict:
    """A tool's answer: one text block of compact JSON (no structuredContent repeating it)."""
    assert not result.is_error, result.content[0].text
    assert len(result.content) == 1 and result.structured_content is None
    answer = json.loads(result.content[0].text)
    assert result.content[0].text == json.dumps(answer, separators=(",", ":"), ensure_ascii=False)  # compact
    return answer


async def _drive(client_of, tmp_path: Path) -> None:
    import jsonschema
    from mcp.shared.exceptions import MCPError

    async with client_of() as client:
        answered = await client.list_tools()
        listed = {tool.name: tool for tool in answered.tools}
        assert set(listed) == set(REGISTRY) | MCP_OWN_TOOLS
        # tools/list is paid by every session of a client: under 20,000 bytes (main's was 44,507: the profile's
        # path said in 23 tools), with what the tools share said once, in the instructions the client is given
        weight = len(answered.model_dump_json(by_alias=True, exclude_none=True).encode())
        assert weight <= 20_000, weight
        assert "XProf log dir" in client.instructions and "next_offset" in client.instructions
        assert all(len(json.dumps(listed[name].input_schema["properties"]["path"])) < 100 for name in REGISTRY)
        for name, spec in REGISTRY.items():
            schema = listed[name].input_schema
            bound = set() if "top_n" in spec.parameters else {"max_rows"}
            assert schema["required"][0] == "path"
            assert set(schema["properties"]) == {"path", "session", "offset", *spec.parameters, *bound}
            assert spec.question in listed[name].description
        for tool in listed.values():
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)  # jsonschema: the MCP SDK's dependency
            hints = tool.annotations
            writes = tool.name in ANALYSING
            assert hints.read_only_hint is not writes and hints.open_world_hint is writes
            if not hints.read_only_hint:  # MCP reads these two only where a tool is not read-only
                assert hints.idempotent_hint and hints.destructive_hint is False
            assert not re.search(r"xdiag\.[a-z_]+\.[a-z_]+", tool.description), tool.description  # no Python names
        assert listed["get_hlo_op_profile"].input_schema["properties"]["top_n"] == {
            "type": "integer", "description": "how many ops to list (1-200, default 20)", "minimum": 1, "maximum": 200,
            "default": 20}
        assert listed["get_step_trace"].input_schema["properties"]["max_rows"]["default"] == 20

        profile = str(H200 / "input_bound.xplane.pb")
        steps = _answer(await client.call_tool("get_step_trace", {"path": profile}))
        assert steps["status"] == "ok" and steps["summary"]["steps"] == 12 and len(steps["detail"]["steps"]) == 12
        few = _answer(await client.call_tool("get_step_trace", {"path": profile, "max_rows": 5}))
        said = {cut["list"]: cut for cut in few["truncated"]["lists"]}
        assert len(few["detail"]["steps"]) == 5 and said["detail.steps"] == {
            "list": "detail.steps", "rows_shown": [1, 5], "rows": 12, "next_offset": 5}
        assert "offset=next_offset" in few["truncated"]["more"]
        rest = _answer(await client.call_tool("get_step_trace", {"path": profile, "max_rows": 5, "offset": 10}))
        assert [s["step"] for s in rest["detail"]["steps"]] == [s["step"] for s in steps["detail"]["steps"][10:]]
        ops = _answer(await client.call_tool("get_hlo_op_profile", {"path": profile, "top_n": 3}))
        assert ops["args"] == {"top_n": 3} and len(ops["detail"]["ops"]) == 3
        logs = _log_dir(tmp_path)
        memory = _answer(await client.call_tool("get_memory_profile", {"path": str(logs),
                                                                        "session": "2026_12_01_10_00_00"}))
        assert memory["status"] in ("ok", "not_available")
        llo = _answer(await client.call_tool("llo_load", {"path": profile}))
        assert llo["status"] == "not_available" and llo["reason"]

        sessions = _answer(await client.call_tool("list_sessions", {"path": str(logs)}))
        assert [s["session"] for s in sessions["sessions"]] == ["2026_12_01_10_00_00", "2026_12_02_10_00_00"]

        out = tmp_path / "analysis"
        analysed = _answer(await client.call_tool("analyze", {"path": profile, "out": str(out)}))
        assert analysed["status"] == "NEEDS_ATTENTION" and analysed["findings"][0]["key"] == "input_bound"
        assert Path(analysed["report"]).exists() and analysed["analysis"] == str(out)
        for finding in ("input_bound", 1):  # its key, or its rank as the description offers it
            explained = _answer(await client.call_tool("explain_finding", {"analysis": analysed["analysis"],
                                                                           "finding": finding}))
            assert explained["key"] == "input_bound" and explained["fix"] and explained["evidence"]
            said = json.dumps(explained, separators=(",", ":"), ensure_ascii=False)
            cited = {e["tool"] for e in explained["evidence"]}
            assert len(cited) < len(explained["evidence"])  # a tool quoted for several numbers: its question once
            for tool in cited:
                assert said.count(json.dumps(REGISTRY[tool].question, ensure_ascii=False)[1:-1]) == 1, tool
            assert explained["tool_questions"] == {tool: REGISTRY[tool].question for tool in cited}
        quoted = [e for e in explained["evidence"] if e["tool"] == "get_step_trace"]
        assert quoted and all(e["documented_field"] and e["reported"] == e["value"] for e in quoted)

        corrupt = tmp_path / "corrupt.xplane.pb"
        corrupt.write_bytes((H200 / "input_bound.xplane.pb").read_bytes()[:5000])
        (tmp_path / "not-an-analysis").mkdir()
        (tmp_path / "not-an-analysis" / "notes.txt").write_text("mine")
        for name, arguments, reason in (
            ("get_step_trace", {"path": str(tmp_path / "missing.xplane.pb")}, "no such file or directory"),
            ("get_step_trace", {"path": str(corrupt)}, "corrupt.xplane.pb: truncated"),
            ("get_step_trace", {"path": "/dev/zero"}, "/dev/zero: neither a regular file nor a folder"),
            ("get_step_trace", {"path": 123}, "argument 'path' must be a string, got 123"),
            ("get_step_trace", {}, "needs argument 'path'"),
            ("get_hlo_op_profile", {"path": profile, "top_n": 0}, "must be from 1 to 200, got 0"),
            ("get_hlo_op_profile", {"path": profile, "top_n": "many"}, "must be an integer"),
            ("get_hlo_op_profile", {"path": profile, "top_n": True}, "must be an integer"),
            ("get_step_trace", {"path": profile, "steps": 3}, "takes no argument(s) ['steps']; it takes ['max_rows'"),
            ("aggregate_xplane_events", {"path": profile}, "needs argument 'pattern'"),
            ("aggregate_xplane_events", {"path": profile, "pattern": "(a)\\1"}, "not a regular expression RE2"),
            ("analyze", {"path": str(tmp_path / "missing")}, "no such file or directory"),
            ("analyze", {"path": profile, "out": str(tmp_path / "not-an-analysis")}, "holds files but no analysis"),
            ("explain_finding", {"analysis": analysed["analysis"], "finding": "9"}, "its findings: 1 input_bound"),
            ("explain_finding", {"analysis": analysed["analysis"], "finding": 1.5}, "must be a string or integer"),
            ("list_sessions", {}, "no local stack in"),  # none was started in this folder
            ("list_sessions", {"path": str(logs.parent / "nothing-here")}, "no such file or directory"),
            ("list_sessions", {"path": str(profile)}, "no sessions under plugins/profile/<session>/"),
        ):
            result = await client.call_tool(name, arguments)
            assert result.is_error and reason in result.content[0].text, (name, arguments, result.content)
            assert "Traceback" not in result.content[0].text
        assert (tmp_path / "not-an-analysis" / "notes.txt").read_text() == "mine"
        with pytest.raises(MCPError) as raised:  # a tool the server does not have: a protocol error
            await client.call_tool("no_such_tool", {"path": profile})
        assert raised.value.code == -32602 and "unknown tool 'no_such_tool'" in raised.value.message


def test_mcp_over_stdio(tmp_path):
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp"], env=env, cwd=tmp_path)
    anyio.run(_drive, lambda: Client(params, read_timeout_seconds=240), tmp_path)
    assert list((tmp_path / "cache").glob("*/answers/*.json"))  # the server answers through the result cache


def _http_server(tmp_path: Path, *args: str, env: dict[str, str] | None = None, open_files: int | None = None):
    """`xdiag mcp --http` on a free port, and its URL (`open_files`: the most files the server may hold open)."""
    def limit_files() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    server = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "mcp", "--http", "--port", "0", *args],
                              cwd=tmp_path, env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache"),
                                                 **(env or {})},
                              stderr=subprocess.PIPE, text=True, preexec_fn=limit_files if open_files else None)
    said, url = [], None
    for line in server.stderr:  # the line saying where it listens (after any warning of the imports)
        said.append(line)
        if url := re.search(r"http://127\.0\.0\.1:\d+/mcp", line):
            break
    if not url:
        server.kill()
        raise AssertionError("".join(said))
    threading.Thread(target=server.stderr.read, daemon=True).start()  # a full pipe would stop the server
    return server, url.group(0)


def test_mcp_over_streamable_http_on_loopback(tmp_path):
    from mcp import Client

    server, url = _http_server(tmp_path)
    try:
        anyio.run(_drive, lambda: Client(url, read_timeout_seconds=240), tmp_path)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_mcp_http_closes_idle_connections_and_still_answers(tmp_path):
    """Connections that never send a request take neither the server's open files nor its answers: with 400 of them
    open (past the 256 files the server may hold; main stopped answering at its limit: 1,100 on 1,024), a call
    answers within 10 s, and an idle connection is closed after the request-head timeout."""
    import socket

    import httpx2

    server, url = _http_server(tmp_path, open_files=256)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    idle = []
    try:
        for _ in range(400):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        idle[-1].sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a request head that never ends
        started = time.monotonic()
        answered = httpx2.post(url, json=initialize, headers=headers, timeout=10)
        assert answered.status_code == 200 and time.monotonic() - started < 10, answered.text
        last = idle[-1]
        last.settimeout(20)  # http_guard.HEADER_TIMEOUT_S (10 s), and the slack of a loaded machine
        assert last.recv(1) == b""  # closed by the server: the head did not come in time
    finally:
        for sock in idle:
            sock.close()
        server.terminate()
        server.wait(timeout=30)


def test_mcp_http_with_a_token_refuses_calls_without_it(tmp_path):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    server, url = _http_server(tmp_path, env={"XDIAG_MCP_TOKEN": "s3cret-token"})
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    async def drive() -> None:
        for token in (None, "wrong-token"):
            with_token = {**headers, **({"Authorization": f"Bearer {token}"} if token else {})}
            refused = httpx2.post(url, json=initialize, headers=with_token, timeout=30)
            assert refused.status_code == 401, refused.text
        authorised = create_mcp_http_client(headers={"Authorization": "Bearer s3cret-token"})
        async with Client(streamable_http_client(url, http_client=authorised), read_timeout_seconds=120) as client:
            result = await client.call_tool("get_kpi_metrics", {"path": str(H200 / "healthy.xplane.pb")})
            assert _answer(result)["status"] == "ok"

    try:
        anyio.run(drive)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_mcp_paths_stay_inside_the_clients_roots_and_the_allowed_folders(tmp_path):
    import mcp_types as types
    from mcp import Client, StdioServerParameters

    inside = tmp_path / "project"
    inside.mkdir()
    shutil.copyfile(H200 / "healthy.xplane.pb", inside / "healthy.xplane.pb")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copyfile(H200 / "memory_bound.xplane.pb", allowed / "memory_bound.xplane.pb")

    async def roots(context) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=inside.as_uri(), name="project")])

    async def drive() -> None:
        env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
        params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", str(allowed)],
                                       env=env, cwd=tmp_path)
        async with Client(params, read_timeout_seconds=240, mode="legacy", list_roots_callback=roots) as client:
            for path in (inside / "healthy.xplane.pb", allowed / "memory_bound.xplane.pb"):
                assert _answer(await client.call_tool("get_kpi_metrics", {"path": str(path)}))["status"] == "ok"
            for name, arguments in (
                ("get_kpi_metrics", {"path": str(H200 / "healthy.xplane.pb")}),
                ("get_kpi_metrics", {"path": str(inside / ".." / ".." / "elsewhere.xplane.pb")}),
                ("list_sessions", {"path": str(tmp_path)}),
                ("analyze", {"path": str(inside / "healthy.xplane.pb"), "out": str(tmp_path / "out")}),
            ):
                result = await client.call_tool(name, arguments)
                assert result.is_error and "outside the folders this server may use" in result.content[0].text
            assert not (tmp_path / "out").exists()

    anyio.run(drive)


def test_mcp_a_path_no_file_can_have_is_a_bad_request(tmp_path):
    """A `path` holding a NUL byte, an `out` whose name is longer than the system takes: the request is refused as
    such, never labelled as xdiag's own failure (before: "xdiag failed: ValueError: embedded null byte", "xdiag
    failed: OSError: [Errno 36] File name too long")."""
    from mcp import Client

    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copyfile(TPU_V5E / "running_sum.xplane.pb", allowed / "run.xplane.pb")
    profile, too_long = str(allowed / "run.xplane.pb"), str(allowed / ("o" * 300))

    async def drive() -> None:
        async with Client(_allowed_server(tmp_path, allowed), read_timeout_seconds=240, mode="legacy") as client:
            said = {}
            for name, arguments in (("get_kpi_metrics", {"path": profile + "\0x"}),
                                    ("analyze", {"path": profile + "\0x"}),
                                    ("analyze", {"path": profile, "out": too_long}),
                                    ("explain_finding", {"analysis": too_long, "finding": 1})):
                result = await client.call_tool(name, arguments)
                said[name, tuple(arguments)] = (result.is_error, result.content[0].text)
        nul = (True, f"path {profile + chr(0) + 'x'!r}: not a path (it holds a NUL byte)")
        assert said == {
            ("get_kpi_metrics", ("path",)): nul, ("analyze", ("path",)): nul,
            ("analyze", ("path", "out")): (True, f"out {too_long}: a name longer than the system takes (255 bytes a "
                                                 "name, 4096 a path)"),
            ("explain_finding", ("analysis", "finding")): (True, f"analysis {too_long}: a name longer than the system "
                                                                 "takes (255 bytes a name, 4096 a path)")}
        assert not any((allowed / "xdiag-out").glob("*"))

    anyio.run(drive)


SECRET = "SECRET-OUTSIDE-7f3a"
"""Bytes only files outside the allowed folder hold: no answer, listing or error may show them."""


def _outside_and_allowed(tmp_path: Path) -> tuple[Path, Path]:
    """A folder outside (a profile, a trace whose field an error would quote, an analysis, a session) and the allowed
    folder beside it, where whoever may write it has planted links to each of them."""
    outside, allowed = tmp_path / "outside", tmp_path / "allowed"
    (outside / "session").mkdir(parents=True)
    (outside / "analysis" / "tools").mkdir(parents=True)
    shutil.copyfile(TPU_V5E / "layout_transpose.xplane.pb", outside / "secret.xplane.pb")
    shutil.copyfile(TPU_V5E / "layout_transpose.xplane.pb", outside / "session" / "host0.xplane.pb")
    (outside / "notes.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "n", "ts": SECRET, "dur": 1, "pid": 1, "tid": 1}]}))
    (outside / "analysis" / "analysis.json").write_text(json.dumps({"session_id": SECRET, "diagnosis": {"findings": [
        {"key": SECRET, "title": SECRET, "evidence": [{"tool": "get_kpi_metrics", "metric": "step_time_ms"}]}]}}))
    (outside / "analysis" / "tools" / "get_kpi_metrics.json").write_text(json.dumps({"summary": {"step_time_ms": SECRET}}))
    (allowed / "session").mkdir(parents=True)
    (allowed / "analysis").mkdir()
    (allowed / "logs" / "plugins" / "profile" / "inside").mkdir(parents=True)
    shutil.copyfile(TPU_V5E / "running_sum.xplane.pb", allowed / "inside.xplane.pb")
    shutil.copyfile(TPU_V5E / "running_sum.xplane.pb", allowed / "logs" / "plugins" / "profile" / "inside" / "host0.xplane.pb")
    (allowed / "link.xplane.pb").symlink_to(outside / "secret.xplane.pb")
    (allowed / "session" / "host0.xplane.pb").symlink_to(outside / "secret.xplane.pb")  # found by listing
    (allowed / "trace.json").symlink_to(outside / "notes.json")
    (allowed / "traces").mkdir()
    (allowed / "traces" / "rank0.json").symlink_to(outside / "notes.json")  # its error would quote the field
    (allowed / "logs" / "plugins" / "profile" / "zz_outside").symlink_to(outside / "session", target_is_directory=True)
    (allowed / "analysis" / "analysis.json").symlink_to(outside / "analysis" / "analysis.json")
    (allowed / "analysis_folder").symlink_to(outside / "analysis", target_is_directory=True)
    return outside, allowed


def _allowed_server(tmp_path: Path, allowed: Path):
    from mcp import StdioServerParameters

    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    return StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", str(allowed)],
                                 env=env, cwd=tmp_path)


def test_mcp_never_reads_through_a_link_out_of_the_allowed_folders(tmp_path):
    """A link inside the allowed folder to a file or folder outside is never followed: named as `path`, found by
    listing a session folder or a log dir, as an analysis or its analysis.json; the answer says it leads outside and
    nothing of the outside file (its bytes, its sessions) appears in any answer or error."""
    from mcp import Client

    outside, allowed = _outside_and_allowed(tmp_path)

    async def drive() -> None:
        async with Client(_allowed_server(tmp_path, allowed), read_timeout_seconds=240, mode="legacy") as client:
            assert _answer(await client.call_tool("get_kpi_metrics", {"path": str(allowed / "inside.xplane.pb")}))
            analysis = _answer(await client.call_tool("analyze", {"path": str(allowed / "inside.xplane.pb"),
                                                                  "out": str(allowed / "out")}))
            if analysis["findings"]:  # what is inside is analysed and explained, bounded as every call is
                assert _answer(await client.call_tool("explain_finding", {"analysis": analysis["analysis"],
                                                                          "finding": 1}))["key"]
            answered = {}  # what each call answered from outside
            for label, name, arguments in (
                ("link", "get_kpi_metrics", {"path": str(allowed / "link.xplane.pb")}),
                ("listed", "get_kpi_metrics", {"path": str(allowed / "session")}),
                ("error bytes", "get_kpi_metrics", {"path": str(allowed / "trace.json")}),
                ("listed error bytes", "get_kpi_metrics", {"path": str(allowed / "traces")}),
                ("log dir session", "get_kpi_metrics", {"path": str(allowed / "logs"), "session": "zz_outside"}),
                ("explain", "explain_finding", {"analysis": str(allowed / "analysis"), "finding": 1}),
                ("explain folder", "explain_finding", {"analysis": str(allowed / "analysis_folder"), "finding": 1}),
            ):
                result = await client.call_tool(name, arguments)
                said = "no session 'zz_outside'" if label == "log dir session" else "outside the folders this server"
                if SECRET in result.content[0].text or not result.is_error or said not in result.content[0].text:
                    answered[label] = result.content[0].text[:200]
            listed = await client.call_tool("list_sessions", {"path": str(allowed / "logs")})
            if [s["session"] for s in _answer(listed)["sessions"]] != ["inside"] or str(outside) in listed.content[0].text:
                answered["list_sessions"] = listed.content[0].text[:200]
        assert not answered, f"{len(answered)} calls read or listed outside: {answered}"

    anyio.run(drive)


def test_mcp_explains_a_finding_whose_tool_outputs_link_out_without_their_numbers(tmp_path):
    """An analysis inside the allowed folder whose tools/ is a link to one outside: the finding is explained, the
    evidence read through the link left out (before: the whole call failed, the link out refused)."""
    from mcp import Client

    outside, allowed = _outside_and_allowed(tmp_path)
    (allowed / "linked_tools").mkdir()
    (allowed / "linked_tools" / "analysis.json").write_text(json.dumps({"session_id": "inside", "diagnosis": {
        "findings": [{"key": "slow_step", "title": "t", "evidence": [{"tool": "get_kpi_metrics",
                                                                      "metric": "step_time_ms"}]}]}}))
    (allowed / "linked_tools" / "tools").symlink_to(outside / "analysis" / "tools", target_is_directory=True)

    async def drive() -> dict:
        async with Client(_allowed_server(tmp_path, allowed), read_timeout_seconds=240, mode="legacy") as client:
            result = await client.call_tool("explain_finding", {"analysis": str(allowed / "linked_tools"),
                                                                "finding": 1})
            assert SECRET not in result.content[0].text
            return _answer(result)

    explained = anyio.run(drive)
    assert explained["key"] == "slow_step" and explained["session"] == "inside"
    assert explained["evidence"] == [{"tool": "get_kpi_metrics", "metric": "step_time_ms", "documented_field": True}]


def test_mcp_answers_nothing_from_outside_while_a_link_flips_between_check_and_read(tmp_path):
    """A profile inside the allowed folder replaced, again and again, by a link to one outside (an atomic rename
    each time, 200 flips at most): every call answers the inside profile or refuses; none answers the outside one.
    Bounded in calls and time; an answer from outside fails the test whatever the timing."""
    from mcp import Client

    outside, allowed = _outside_and_allowed(tmp_path)
    flipped = allowed / "flip.xplane.pb"
    shutil.copyfile(allowed / "inside.xplane.pb", flipped)
    inside_step = None
    outside_step = None
    answers: list[str] = []
    stop = threading.Event()
    flips = [0]

    def flip() -> None:  # file, link, file, link …: each a rename over the name, so the name is always there
        staged = allowed / ".staged"
        while not stop.is_set() and flips[0] < 200:
            staged.unlink(missing_ok=True)
            if flips[0] % 2:
                shutil.copyfile(allowed / "inside.xplane.pb", staged)
            else:
                staged.symlink_to(outside / "secret.xplane.pb")
            os.replace(staged, flipped)
            flips[0] += 1
            time.sleep(0.03)

    async def drive() -> None:
        nonlocal inside_step, outside_step
        async with Client(_allowed_server(tmp_path, allowed), read_timeout_seconds=240, mode="legacy") as client:
            inside_step = _answer(await client.call_tool("get_kpi_metrics", {
                "path": str(allowed / "inside.xplane.pb")}))["summary"]["step_time_ms"]
            flipper = threading.Thread(target=flip, daemon=True)
            flipper.start()
            deadline = time.monotonic() + 120
            # Both bounds matter: refusals come back quicker than the flips, so count flips as well as calls.
            while (flipper.is_alive() and time.monotonic() < deadline and len(answers) < 400
                   and (len(answers) < 60 or flips[0] < 40)):
                result = await client.call_tool("get_kpi_metrics", {"path": str(flipped)})
                answers.append(result.content[0].text if result.is_error else
                               f"ok {_answer(result)['summary']['step_time_ms']}")
            stop.set()
            flipper.join()
        async with Client(_allowed_server(tmp_path, outside), read_timeout_seconds=240, mode="legacy") as client:
            outside_step = _answer(await client.call_tool("get_kpi_metrics", {
                "path": str(outside / "secret.xplane.pb")}))["summary"]["step_time_ms"]

    anyio.run(drive)
    assert inside_step != outside_step and len(answers) >= 10 and flips[0] >= 20, (answers, flips)
    print(f"{len(answers)} calls over {flips[0]} flips: {sum(a.startswith('ok') for a in answers)} answered inside")
    from_outside = [a for a in answers if a == f"ok {outside_step}" or SECRET in a]
    assert not from_outside, f"{len(from_outside)} of {len(answers)} calls answered from outside: {answers}"
    assert all(a == f"ok {inside_step}" or "outside the folders this server may use" in a or "cannot be read" in a
               for a in answers), answers


# --- answers sized for an agent --------------------------------------------------------------------------------


_CRASH = re.compile(r"^\w+(Error|Exception)\b.*\(at [\w.]+\.py:\d+\)$")
"""How run_tool records a tool's bug (`KeyError: 'x' (at get_step_trace.py:88)`): never an answer."""


def test_every_answer_fits_an_agents_context_on_the_largest_profiles(tmp_path, capsys):
    """Every tool's answer, as the server sends it, at its default bounds and at their maximum, on the largest
    committed profiles: under 32,000 bytes at the defaults and 100,000 at the maximum; the largest printed."""
    from xdiag.agent.mcp_server import XdiagTools
    from xdiag.errors import XdiagError
    from tests.conftest import SHARED_PROFILES

    tools = XdiagTools(ResultCache(tmp_path / "cache"), 2**31, tmp_path / "stack")
    profiles = [TPU_V5E / "gru_scan_train.xplane.pb", TPU_V5E / "kv_decode.xplane.pb", *sorted(H200.glob("*.pb")),
                *sorted(SHARED_PROFILES.glob("*/*.xplane.pb"))]
    largest: dict[str, tuple[int, str, str]] = {}
    for profile in profiles:
        try:
            top_op = tools.call("get_hlo_op_profile", {"path": str(profile)})["summary"].get("top_op")
        except XdiagError as exc:  # a profile no tool can read (the mangled one): its error is the answer
            assert profile.parent.name == "bad" and not _CRASH.search(str(exc)), (profile, exc)
            continue
        for name, spec in REGISTRY.items():
            base = {"path": str(profile), **({"pattern": "."} if "pattern" in spec.parameters else {})}
            if "op" in spec.parameters:
                if top_op is None:
                    continue
                base["op"] = top_op
            bound = "top_n" if "top_n" in spec.parameters else "max_rows"
            for case, arguments in (("default", base), ("maximum", {**base, bound: 200})):
                try:
                    answer = tools.call(name, tools.check(name, arguments))
                except XdiagError as exc:  # an error result is one line, and a reason, not a crash
                    assert len(str(exc)) < 2000 and not _CRASH.search(str(exc)), (name, profile, exc)
                    continue
                text = tools.answer_text(name, tools.check(name, arguments), answer)
                named = set(re.findall(r"`((?:get|llo|list|detect)_[a-z_]+)`", text))
                assert named <= set(tools.specs), (name, profile, named)  # no other product's tools to call
                size = len(text.encode())
                if size > largest.get(f"{name} {case}", (0,))[0]:
                    largest[f"{name} {case}"] = (size, profile.name, case)
    with capsys.disabled():
        print("\nthe largest answers (bytes):")
        for key, (size, profile, _) in sorted(largest.items(), key=lambda item: -item[1][0])[:8]:
            print(f"  {size:7d}  {key} on {profile}")
    for key, (size, profile, case) in largest.items():
        assert size < (32_000 if case == "default" else 100_000), (key, profile, size)
    assert largest["get_hlo_op_profile maximum"][0] > 32_000  # top_n=200 gives more than the default, bounded


def test_a_long_list_is_cut_to_fit_and_says_how_to_page():
    from xdiag.agent.bounded import bound_answer

    answer = {"status": "ok", "summary": {"n": 300}, "detail": {"rows": [{"i": i, "pad": "x" * 500} for i in range(300)],
                                                               "small": [1, 2]}}
    fitted = json.loads(bound_answer(answer, 200, 0, 30_000, "call again with offset=next_offset"))
    kept = len(fitted["detail"]["rows"])
    assert 40 < kept < 60 and len(json.dumps(fitted, separators=(",", ":"))) <= 30_000
    assert fitted["detail"]["small"] == [1, 2] and fitted["summary"] == {"n": 300}
    assert fitted["truncated"]["lists"] == [{"list": "detail.rows", "rows_shown": [1, kept], "rows": 300,
                                             "next_offset": kept}]
    assert f"cut to {kept} rows per list to fit 30000 bytes" in fitted["truncated"]["more"]
    paged = json.loads(bound_answer(answer, 200, kept, 30_000, ""))
    assert paged["detail"]["rows"][0]["i"] == kept
    whole = {"status": "ok", "detail": {"rows": [1, 2, 3]}}
    assert bound_answer(whole, 20, 0, 30_000, "") == '{"status":"ok","detail":{"rows":[1,2,3]}}'


# --- calls side by side, and cancel ------------------------------------------------------------------------------

LONG_ANALYSIS = TPU_V5E / "gru_scan_train.xplane.pb"  # the largest committed profile: an analysis of many seconds


def _server_process():
    """The `xdiag mcp` process this test started (the SDK's stdio client starts it as a child of the test)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "xdiag.cli" in child.cmdline() and "mcp" in child.cmdline():
            return child
    raise AssertionError("no xdiag mcp process")


def _workers(server) -> list:
    """The server's worker processes, oldest first: those serving calls and the one started ahead for the next."""
    import psutil

    found = []
    for child in server.children():
        try:
            if "xdiag.agent.mcp_worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append((child.create_time(), child))
        except psutil.Error:  # ended between the listing and the look (a zombie, or gone)
            continue
    return [child for _, child in sorted(found, key=lambda item: item[0])]


def _serving(server) -> list:
    """Once a call has taken a worker: the worker serving it (the oldest) and the one started ahead (a second)."""
    return _workers(server) if len(_workers(server)) >= 2 else []


async def _until(condition, what: str, limit_s: float = 120):
    """Waits for a fact to hold (polling); the limit only ends a test that would hang, it measures nothing."""
    with anyio.fail_after(limit_s):
        while not (found := condition()):
            await anyio.sleep(0.05)
    return found


def test_short_calls_answer_during_a_long_analysis_and_a_cancelled_one_stops(tmp_path):
    """Agents send calls together: two short calls on two other profiles answer while an analysis runs (in parallel,
    each in a worker of its own); cancelling the analysis ends its worker and every process it started, and leaves
    the worker started ahead for the next call."""
    import psutil
    from mcp import Client, StdioServerParameters

    shutil.copyfile(LONG_ANALYSIS, tmp_path / LONG_ANALYSIS.name)
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp"], env=env, cwd=tmp_path)
    finished: list[str] = []
    seen_workers: list[int] = []

    async def drive() -> None:
        async with Client(params, read_timeout_seconds=600, mode="legacy") as client:
            server = _server_process()

            async def call(label: str, name: str, arguments: dict) -> None:
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result.content[0].text
                finished.append(label)

            async with anyio.create_task_group() as calls:
                analysis = anyio.CancelScope()

                async def analyze() -> None:
                    with analysis:
                        await call("analyze", "analyze", {"path": str(tmp_path / LONG_ANALYSIS.name)})

                calls.start_soon(analyze)
                analysis_worker = (await _until(lambda: _serving(server), "the analysis's worker"))[0]
                async with anyio.create_task_group() as short:
                    for label in ("healthy", "memory_bound"):
                        short.start_soon(call, label, "get_kpi_metrics", {"path": str(H200 / f"{label}.xplane.pb")})
                    while len(finished) < 2:  # both short calls run at once beside the analysis
                        seen_workers.append(len(_workers(server)))
                        await anyio.sleep(0.02)
                assert not analysis.cancel_called and "analyze" not in finished and analysis_worker.is_running()
                started = [analysis_worker, *analysis_worker.children(recursive=True)]
                analysis.cancel()  # the client sends notifications/cancelled
            _, alive = psutil.wait_procs(started, timeout=60)
            assert not alive and len(_workers(server)) == 1  # only the one started ahead is left
            assert finished == ["healthy", "memory_bound"] or finished == ["memory_bound", "healthy"]
            again = await client.call_tool("get_step_trace", {"path": str(H200 / "healthy.xplane.pb")})
            assert _answer(again)["status"] == "ok"

    anyio.run(drive)
    assert max(seen_workers) == 4, seen_workers  # the analysis's, both short calls' and the one started ahead


def _wire_server(tmp_path: Path):
    """`xdiag mcp` on stdio driven as JSON-RPC lines: (the process, send(message), response(id, others): the
    response to that request, the messages before it appended to `others`)."""
    import queue

    server = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "mcp"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")})
    received: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [received.put(json.loads(line)) for line in server.stdout], daemon=True).start()

    def send(message: dict) -> None:
        server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        server.stdin.flush()

    def response(request_id: int, others: list) -> dict:
        while (message := received.get(timeout=300)).get("id") != request_id:
            others.append(message)
        return message

    return server, send, response


def test_a_cancelled_call_gets_no_answer_and_frees_its_lane(tmp_path):
    """The wire as a client sees it: after notifications/cancelled no response ever comes for that request, and the
    next analysis (the lane holds one at a time) is answered."""
    import psutil

    shutil.copyfile(LONG_ANALYSIS, tmp_path / LONG_ANALYSIS.name)
    server, send, response = _wire_server(tmp_path)

    def call(request_id: int, name: str, arguments: dict) -> None:
        send({"id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})

    try:
        send({"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                          "clientInfo": {"name": "test", "version": "0"}}})
        others: list = []
        assert response(1, others)["result"]["protocolVersion"] == "2025-11-25"
        send({"method": "notifications/initialized"})
        call(2, "analyze", {"path": str(tmp_path / LONG_ANALYSIS.name), "out": str(tmp_path / "cancelled")})
        process = psutil.Process(server.pid)
        worker = anyio.run(_until, lambda: _serving(process), "the analysis's worker")[0]
        send({"method": "notifications/cancelled", "params": {"requestId": 2, "reason": "the user stopped it"}})
        worker.wait(timeout=60)
        call(3, "analyze", {"path": str(H200 / "healthy.xplane.pb"), "out": str(tmp_path / "next")})
        answered = response(3, others)
        assert not answered["result"].get("isError"), answered
        assert json.loads(answered["result"]["content"][0]["text"])["status"] in ("OPTIMAL", "NEEDS_ATTENTION")
        send({"id": 4, "method": "ping"})
        response(4, others)
        assert not [m for m in others if m.get("id") == 2]  # the cancelled request got no answer
        assert not (tmp_path / "cancelled" / "analysis.json").exists()
        # A server killed outright (no cancel): its worker ends itself and what it started.
        call(5, "analyze", {"path": str(tmp_path / LONG_ANALYSIS.name), "out": str(tmp_path / "orphaned")})
        orphans = anyio.run(_until, lambda: _serving(process), "the next analysis's worker")
        server.kill()
        _, alive = psutil.wait_procs(orphans, timeout=60)
        assert not alive  # the worker serving the analysis and the one started ahead
        assert not (tmp_path / "orphaned" / "analysis.json").exists()
    finally:
        server.kill()
        server.wait(timeout=30)


def test_a_cancelled_analysis_leaves_nothing_in_the_temporary_folder(tmp_path):
    """A cancelled `analyze` (its worker killed outright, with what it started): what it had in TMPDIR (XProf's
    private copy, 278 MiB on a large capture) is removed by the server; only folders of processes still running
    (a detached converter's) may stay."""
    import psutil
    import re

    shutil.copyfile(LONG_ANALYSIS, tmp_path / LONG_ANALYSIS.name)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "mcp"], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache"),
                                   "TMPDIR": str(temporary)})

    def send(message: dict) -> None:
        server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        server.stdin.flush()

    def left() -> list[str]:  # xdiag's folders no running process owns
        owned = [(p.name, re.search(r"-pid(\d+)-", p.name)) for p in temporary.iterdir() if p.name.startswith("xdiag")]
        return [name for name, pid in owned if pid is None or not psutil.pid_exists(int(pid.group(1)))]

    try:
        send({"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                          "clientInfo": {"name": "test", "version": "0"}}})
        assert json.loads(server.stdout.readline())["id"] == 1
        send({"method": "notifications/initialized"})
        send({"id": 2, "method": "tools/call", "params": {"name": "analyze", "arguments": {
            "path": str(tmp_path / LONG_ANALYSIS.name), "out": str(tmp_path / "cancelled")}}})
        anyio.run(_until, lambda: any(p.name.startswith("xdiag-xprof") for p in temporary.iterdir()),
                  "XProf's private copy")
        send({"method": "notifications/cancelled", "params": {"requestId": 2, "reason": "the user stopped it"}})
        send({"id": 3, "method": "ping"})
        while json.loads(server.stdout.readline()).get("id") != 3:
            pass
        deadline = time.monotonic() + 30  # the worker's group is killed; the server then sweeps
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left(), left()
    finally:
        server.kill()
        server.wait(timeout=30)
