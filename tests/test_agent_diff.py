"""The user's agent closes the loop over MCP (issue 74): `xdiag mcp` driven by the MCP SDK's client over stdio as an
agent would, on real TPU v5e captures: analyze the baseline, compare it with a capture after the change (faster,
with each finding's predicted gain beside the realized one), a capture against itself (no change), and a TPU
capture against a GPU one (refused, not a verdict)."""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import sys
from pathlib import Path

import anyio

from tests.conftest import H200, TESTS

TRIALS = TESTS / "profiles" / "fix_trials"
TPU_V5E = TESTS / "profiles" / "tpu_v5e"
PROGRAM = "mlp_f32_raw"  # f32 matmuls at HIGHEST precision; the change: the default precision
SECRET = "SECRET-OUTSIDE-0d41"


def _capture(label: str, folder: Path, program: str = PROGRAM) -> Path:
    """A fix trial's capture, as the program's own profiler call writes it: <folder>/run.xplane.pb each time."""
    folder.mkdir(parents=True)
    target = folder / "run.xplane.pb"
    target.write_bytes(lzma.decompress((TRIALS / f"{program}.{label}.xplane.pb.xz").read_bytes()))
    return target


def _own_gain_percent() -> float:
    """The gain the program measured itself over its profiled steps (the trial's steps.json)."""
    before, after = (json.loads((TRIALS / f"{PROGRAM}.{label}.steps.json").read_text())["traced"]["mean_ms"]
                     for label in ("before-a", "default"))
    return 100 * (1 - after / before)


def _answer(result) -> tuple[dict, int]:
    assert not result.is_error, result.content[0].text
    text = result.content[0].text
    return json.loads(text), len(text.encode())


def test_an_agent_compares_before_and_after_over_mcp(tmp_path):
    from mcp import Client, StdioServerParameters

    work = tmp_path / "project"
    before, after = _capture("before-a", work / "before"), _capture("default", work / "after")
    shutil.copyfile(TPU_V5E / "healthy.xplane.pb", work / "tpu_healthy.xplane.pb")
    shutil.copyfile(H200 / "healthy.xplane.pb", work / "gpu_healthy.xplane.pb")
    outside = tmp_path / "outside"  # an analysis folder outside the allowed one, and a link to it inside
    (outside / "tools").mkdir(parents=True)
    (outside / "analysis.json").write_text(json.dumps({"session_id": SECRET, "analysis_id": SECRET}))
    (work / "linked").symlink_to(outside, target_is_directory=True)
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", str(work)],
                                   env=env, cwd=tmp_path)
    sizes = {}

    async def drive() -> None:
        async with Client(params, read_timeout_seconds=600, mode="legacy") as client:
            listed = await client.list_tools()
            tool = next(t for t in listed.tools if t.name == "diff_sessions")
            assert tool.input_schema["required"] == ["before", "after"]
            assert not tool.annotations.read_only_hint and tool.annotations.idempotent_hint
            weight = len(listed.model_dump_json(by_alias=True, exclude_none=True).encode())
            assert weight <= 20_000, weight

            analysed, _ = _answer(await client.call_tool("analyze", {"path": str(before)}))
            top = analysed["findings"][0]
            assert top["key"] == "precision_highest_matmul"
            # the agent analyses the new capture too: both files are named run.xplane.pb, and the baseline's
            # analysis stays the baseline's
            again, _ = _answer(await client.call_tool("analyze", {"path": str(after)}))
            assert Path(again["analysis"]) == Path(analysed["analysis"]).with_name("run-2")
            # the change applied, captured again the same way: compared with the baseline's analysis folder
            diff, sizes["before/after"] = _answer(await client.call_tool(
                "diff_sessions", {"before": analysed["analysis"], "after": str(after)}))
            assert diff["verdict"] == "faster", diff["headline"]
            test = diff["step_test"]
            assert test["ci_low_percent"] < test["ci_high_percent"] < 0
            assert abs(test["realized_gain_percent"] - _own_gain_percent()) < 3, (test, _own_gain_percent())
            # the smallest gain these captures could show is below the one they confirmed (the smallest slowdown,
            # the same distance from no change on log step times, is larger)
            assert test["min_detectable_gain_percent"] <= test["realized_gain_percent"]
            assert test["min_detectable_gain_percent"] < test["min_detectable_percent"]
            outcome = next(o for o in diff["outcomes"] if o["key"] == top["key"])
            assert outcome["outcome"] in ("gone", "smaller")
            # predicted beside realized: the range the finding's lead lever gives, and the gain the steps show
            lead = re.search(r"\(predicted (\d+(?:\.\d+)?)–(\d+(?:\.\d+)?)%\)", top["expected_impact"])
            predicted = outcome["predicted"]
            assert [predicted["low_percent_of_step"], predicted["percent_of_step"]] == [float(g) for g in lead.groups()]
            assert predicted["low_percent_of_step"] <= outcome["realized_gain_percent"] <= predicted["percent_of_step"]
            assert outcome["realized_gain_percent"] == test["realized_gain_percent"]
            assert any(line.startswith(f"{top['key']} ({top['priority']}): {outcome['outcome']}; predicted "
                                       f"{lead.group(1)}–{lead.group(2)}% shorter steps") for line in diff["headline"])
            moved = diff["lines"]["moved"]
            assert moved and moved[0]["line"].endswith(f"{PROGRAM}.py:" + moved[0]["line"].rsplit(":", 1)[1])
            assert moved[0]["delta_ms_per_step"] < 0
            assert "step_ms" not in test["baseline"] and "step_time" not in diff  # each fact once
            # the ops the headline names as gone or new each held 1% of their side's step or more, where the lists
            # keep every row (a fusion of 0.3 µs per step, gone with a recompile, is not news)
            named = {name: float(ms) for line in diff["headline"] if line.startswith(("Ops gone: ", "Ops new: "))
                     for name, ms in re.findall(r"(\S+) \(([\d.e-]+) ms/step\)", line)}
            step = {"gone": test["baseline"]["mean_ms"], "appeared": test["candidate"]["mean_ms"]}
            listed = {c["name"]: kind for kind in step for c in diff["ops"][kind]}  # a row's list is its status
            assert all(ms >= 0.01 * step[listed[name]] for name, ms in named.items()), named
            assert not {"status", "modules"} & {k for kind in step for c in diff["ops"][kind] for k in c}
            assert any(c["baseline_ms_per_step"] < 0.01 * step["gone"] for c in diff["ops"]["gone"])
            for folder, profile in ((analysed["analysis"], before), (again["analysis"], after)):
                assert json.loads((Path(folder) / "analysis.json").read_text())["profile_uris"] == [str(profile)]
            assert diff["candidate"]["report_uri"] == again["report"]  # the same files: the same folder

            same, sizes["one capture"] = _answer(await client.call_tool(
                "diff_sessions", {"before": str(before), "after": str(before)}))
            assert same["verdict"] == "no_change" and "one capture" in same["headline"][1]
            assert same["step_test"]["ci_low_percent"] < 0 < same["step_test"]["ci_high_percent"]
            shows = same["step_test"]["min_detectable_gain_percent"], same["step_test"]["min_detectable_percent"]
            assert f"could show a step {shows[0]:.1f}% shorter or {shows[1]:.1f}% longer" in same["headline"][0]

            refused = await client.call_tool("diff_sessions", {"before": str(work / "tpu_healthy.xplane.pb"),
                                                               "after": str(work / "gpu_healthy.xplane.pb")})
            sizes["TPU against GPU"] = len(refused.content[0].text.encode())
            assert refused.is_error and refused.content[0].text.startswith("not compared: the platforms differ")
            assert "faster" not in refused.content[0].text and "Traceback" not in refused.content[0].text

            for elsewhere in (TPU_V5E / "healthy.xplane.pb", work / "linked", work / "linked" / "analysis.json"):
                refused = await client.call_tool("diff_sessions", {"before": str(elsewhere), "after": str(after)})
                said = refused.content[0].text
                assert refused.is_error and "outside the folders this server may use" in said and SECRET not in said

    anyio.run(drive)
    assert max(sizes.values()) < 30_000, sizes
    print(f"\ndiff_sessions answer bytes: {sizes}")  # shown with -s


def test_an_idiom_s_predicted_range_is_what_the_diff_compares_with(tmp_path):
    """A one-hot embedding product replaced by a row lookup (TPU v5e): the finding stakes "up to N%" of the step
    and predicts the part of it its change recovers, "(predicted A–B%)"; the diff holds that range beside the
    realized gain, as the agent's report of predicted against realized needs, not the stake alone."""
    from mcp import Client, StdioServerParameters

    work = tmp_path / "project"
    before = _capture("before-a", work / "before", "onehot_embed")
    after = _capture("fixed", work / "after", "onehot_embed")
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--allow", str(work)],
                                   env=env, cwd=tmp_path)

    async def drive() -> tuple[dict, dict]:
        async with Client(params, read_timeout_seconds=600, mode="legacy") as client:
            analysed, _ = _answer(await client.call_tool("analyze", {"path": str(before)}))
            diff, _ = _answer(await client.call_tool("diff_sessions",
                                                     {"before": analysed["analysis"], "after": str(after)}))
            return analysed["findings"][0], diff

    top, diff = anyio.run(drive)
    assert top["key"] == "structured_matmul", top
    stake_percent = re.search(r"up to (\d+)% shorter steps", top["expected_impact"]).group(1)
    low, high = (float(g) for g in re.search(r"\(predicted ([\d.]+)–([\d.]+)%\)", top["expected_impact"]).groups())
    outcome = next(o for o in diff["outcomes"] if o["key"] == top["key"])
    assert diff["verdict"] == "faster" and outcome["outcome"] in ("gone", "smaller"), diff["headline"]
    assert (outcome["predicted"]["low_percent_of_step"], outcome["predicted"]["percent_of_step"]) == (low, high)
    assert high < float(stake_percent) + 0.5 and low <= outcome["realized_gain_percent"] <= high, outcome
    assert any(line.startswith(f"structured_matmul ({top['priority']}): {outcome['outcome']}; predicted {low:.3g}–"
                               f"{high:.3g}% shorter steps") for line in diff["headline"]), diff["headline"]
