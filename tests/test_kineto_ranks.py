"""Multi-rank PyTorch Kineto traces (issue 38): one file per rank forming one session, a row per rank, a straggler
verdict from the collectives' arrivals; and a lone rank's file saying that no verdict is possible, and why.

Reads the real 4-rank gloo jobs committed under tests/profiles/torch_ranks/ (tests/capture/torch_ranks.py made them;
see tests/profiles/README.md): `balanced/`, where every rank does the same work, and `straggler/`, where one rank
does extra matrix products before each forward pass. The checks compare xdiag with the raw JSON read here with the
standard library: each rank's steps (`ProfilerStep#N`), its busy CPU time, and each all-reduce's span on every rank
(`gloo:all_reduce`, matched across ranks by step and message size, an independent key from xdiag's step and
occurrence), from which the last rank to arrive and how long the others wait for it follow.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.capture.torch_ranks import SLOW_RANK, WORLD
from tests.conftest import TESTS, missing_shared
from tests.test_consistency import check_report
from tests.test_kineto import TRACES, Diagnosed, Reading
from xdiag.cloud.embedded import analyze_session
from xdiag.profile.locate import locate_session
from xdiag.profile.session import read_session

JOBS = TESTS / "profiles" / "torch_ranks"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_ENQUEUE = re.compile(r"^c10d::|^record_param_comms$")


def _raw(path: Path) -> dict:
    with gzip.open(path) as handle:
        return json.load(handle)


def _files(job: str) -> list[Path]:
    return sorted((JOBS / job).glob("rank*.pt.trace.json.gz"))


class RawRank:
    """One rank's file as the standard library reads it: its rank, steps, busy CPU time and all-reduce spans (µs)."""

    def __init__(self, path: Path):
        raw = _raw(path)
        self.rank = raw["distributedInfo"]["rank"]
        self.world = raw["distributedInfo"]["world_size"]
        events = [e for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
        self.steps = sorted((int(_STEP.match(e["name"]).group(1)), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                            for e in events if _STEP.match(e["name"]))
        self.ops = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                    if e.get("cat") == "cpu_op" and not _ENQUEUE.match(e["name"])]
        self.collectives = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["args"]["Input Dims"][0][0])
                                  for e in events if e["name"] == "gloo:all_reduce")

    def step_of(self, ts: float) -> int | None:
        return next((n for n, a, b in self.steps if a <= ts < b), None)

    def mean_step_ms(self) -> float:
        return float(np.mean([b - a for _, a, b in self.steps])) / 1e3

    def busy_ms_per_step(self) -> float:
        """The union of its CPU ops' time inside its steps, per step."""
        merged: list[list[float]] = []
        for a, b in sorted(self.ops):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        inside = sum(max(0.0, min(b, e) - max(a, s)) for _, s, e in self.steps for a, b in merged)
        return inside / len(self.steps) / 1e3

    def instances(self) -> dict[tuple[int, int], tuple[float, float]]:
        """(step, message elements) -> (start, end) of that all-reduce on this rank."""
        out = {}
        for start, end, elements in self.collectives:
            step = self.step_of(start)
            if step is not None:
                out[(step, elements)] = (start, end)
        return out


def _raw_arrivals(ranks: list[RawRank]) -> dict:
    """Per all-reduce instance every rank's start before its own end of it (they leave together): who is last (the
    shortest time inside), the skew, and the time each other rank waits for the last one."""
    spans = [r.instances() for r in ranks]
    keys = set.intersection(*(set(s) for s in spans))
    last = {r.rank: 0 for r in ranks}
    skews, waits = [], []
    for key in sorted(keys):
        before_end = {r.rank: spans[i][key][1] - spans[i][key][0] for i, r in enumerate(ranks)}
        latest = min(before_end, key=before_end.get)
        last[latest] += 1
        skews.append(max(before_end.values()) - before_end[latest])
        waits.append(np.mean([v - before_end[latest] for k, v in before_end.items() if k != latest]))
    return {"instances": len(keys), "last": last, "skew_ms_mean": float(np.mean(skews)) / 1e3}


_CACHE: dict[str, Diagnosed] = {}


def _diagnosed(name: str, files: list[Path], tmp_path_factory) -> Diagnosed:
    if name not in _CACHE:
        folder = tmp_path_factory.mktemp(name)
        (folder / "in").mkdir()
        for path in files:
            shutil.copyfile(path, folder / "in" / path.name)
        target = folder / "in" if len(files) > 1 else folder / "in" / files[0].name
        analysis = analyze_session(locate_session(target), folder / "out")
        assert analysis.status == "DONE", analysis.failure_reason
        _CACHE[name] = Diagnosed(analysis, folder / "out")
    return _CACHE[name]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return lambda name: _diagnosed(name, _files(name), tmp_path_factory)


def _hosts(d: Diagnosed) -> dict:
    return d.tools["get_hosts"]


# ---- one session of one host per rank ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["balanced", "straggler"])
def test_a_folder_of_rank_files_is_one_session_with_a_row_per_rank(name, job):
    files = _files(name)
    assert len(files) == WORLD
    session = read_session(locate_session(JOBS / name).files)
    assert len(session.hosts) == WORLD
    hosts = _hosts(job(name))
    raw = {path.name: RawRank(path) for path in files}
    rows = hosts["detail"]["hosts"]
    assert len(rows) == WORLD
    for row in rows:
        mine = raw[row["file"]]
        assert (row["rank"], row["world_size"], row["backend"]) == (mine.rank, mine.world, "gloo")
        assert row["steps"] == len(mine.steps)
        assert row["step_time_ms_mean"] == pytest.approx(mine.mean_step_ms(), rel=0.001)
        assert row["compute_percent"] == pytest.approx(100 * mine.busy_ms_per_step() / mine.mean_step_ms(), abs=0.1)
    assert hosts["summary"]["ranks_in_session"] == list(range(WORLD))
    assert hosts["summary"]["world_size"] == WORLD
    assert "ranks_not_in_session" not in hosts["summary"] and "not_available" not in hosts["summary"]
    # Every all-reduce instance is found on every rank: two DDP buckets per step.
    arrivals = _raw_arrivals(list(raw.values()))
    steps = {len(r.steps) for r in raw.values()}
    assert hosts["summary"]["collective_instances"] == arrivals["instances"] == 2 * steps.pop()
    assert hosts["summary"]["arrival_skew_ms_mean"] == pytest.approx(arrivals["skew_ms_mean"], rel=0.02)


def test_the_balanced_job_has_no_straggler(job):
    d = job("balanced")
    hosts = _hosts(d)
    assert "straggler" not in hosts["summary"]
    assert "straggler_host" not in d.keys
    arrivals = _raw_arrivals([RawRank(p) for p in _files("balanced")])
    # No rank arrives last at most instances: the last one changes with the scheduling noise of four ranks on a
    # shared CPU.
    assert max(arrivals["last"].values()) / arrivals["instances"] < 0.6
    shares = {p["participant"]: p["last_arrival_share_percent"] for p in hosts["detail"]["participants"]}
    assert max(shares.values()) < 60


def test_the_straggler_job_names_the_slow_rank_with_its_own_cause(job):
    d = job("straggler")
    hosts = _hosts(d)
    ranks = {r.rank: r for r in (RawRank(p) for p in _files("straggler"))}
    arrivals = _raw_arrivals(list(ranks.values()))
    slow = max(arrivals["last"], key=arrivals["last"].get)
    assert slow == SLOW_RANK  # the raw file agrees with how the job was made...
    summary = hosts["summary"]
    assert summary["straggler_rank"] == slow  # ...and xdiag names the rank the trace's distributedInfo gives
    row = next(h for h in hosts["detail"]["hosts"] if h["host"] == summary["straggler"])
    assert row["rank"] == slow
    assert summary["straggler_last_arrival_share_percent"] == pytest.approx(
        100 * arrivals["last"][slow] / arrivals["instances"], abs=0.1)
    # Its own cause: it computes more per step than the others; by how much, from the raw CPU ops.
    peers = [ranks[k].busy_ms_per_step() for k in ranks if k != slow]
    assert summary["straggler_cause"] == "compute"
    assert summary["straggler_cause_excess_ms_per_step"] == pytest.approx(
        ranks[slow].busy_ms_per_step() - float(np.mean(peers)), rel=0.02)
    # The others' wait for it is counted once where two buckets wait at the same time: never above their step.
    waits = {p["participant"]: p["collective_wait_ms_per_step"] for p in hosts["detail"]["participants"]}
    for rank in hosts["detail"]["hosts"]:
        assert waits[rank["host"]] <= rank["step_time_ms_mean"]
    assert summary["straggler_caused_wait_ms_per_step"] < d.health["step_time_ms"]
    top = d.findings[0]
    assert top.key == "straggler_host"
    assert top.title.startswith(f"Rank {slow} ")
    assert "more device compute per step than its peers" in top.whats_happening


@pytest.mark.parametrize("name", ["balanced", "straggler"])
def test_the_rank_reports_agree_with_their_breakdown(name, job):
    d = job(name)
    tools = {name: result.get("summary") or {} for name, result in d.tools.items()
             if result.get("status") == "ok" and not name.startswith("followup-")}
    problems = check_report(d.analysis, tools, _page(d))
    assert not problems, problems


def _page(d: Diagnosed) -> str:
    import html

    page = re.sub(r"<(style|script)\b.*?</\1>", " ", d.html, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


# ---- a lone rank's file, or some of the ranks ---------------------------------------------------------------------


def _lone_rank(d: Diagnosed, rank: int, world: int) -> None:
    hosts = _hosts(d)
    said = f"rank {rank} of {world}"
    reason = hosts["summary"]["not_available"]["straggler"]
    assert said in reason and f"other {world - 1} ranks' traces are not in it" in reason
    assert hosts["summary"]["ranks_not_in_session"] == world - 1
    assert "straggler" not in hosts["summary"] and "straggler_host" not in d.keys
    assert d.health["straggler"]["not_available"] == reason
    text = _page(d)
    assert f"straggler: not available: this is {said}" in text
    assert "One rank (" in text and f": {said}): the other ranks' traces are not in the session" in text


def test_a_lone_rank_of_the_job_says_it_is_rank_r_of_w_and_why_there_is_no_verdict(tmp_path_factory):
    path = _files("straggler")[1]
    raw = RawRank(path)
    d = _diagnosed("lone_rank", [path], tmp_path_factory)
    _lone_rank(d, raw.rank, raw.world)
    # Its time in the all-reduce may be the wait for a slower rank: the collectives finding says it cannot tell.
    collectives = next(f for f in d.findings if f.key == "collectives")
    assert "may be waiting for a slower rank" in collectives.whats_happening


def test_a_lone_rank_of_a_public_8_gpu_job(tmp_path_factory):
    path = TRACES / "kineto_HTA_trace_diff_control_A100x8.json.gz"
    if not path.exists():
        missing_shared(path)
    distributed = _raw(path)["distributedInfo"]
    d = _diagnosed("lone_a100", [path], tmp_path_factory)
    _lone_rank(d, distributed["rank"], distributed["world_size"])


def test_some_ranks_of_the_job_compare_those_and_name_the_missing(tmp_path_factory):
    files = [p for p in _files("straggler") if RawRank(p).rank in (0, SLOW_RANK)]
    d = _diagnosed("two_ranks", files, tmp_path_factory)
    hosts = _hosts(d)
    assert hosts["summary"]["ranks_in_session"] == [0, SLOW_RANK]
    assert hosts["summary"]["ranks_not_in_session"] == WORLD - 2
    assert hosts["detail"]["ranks_not_in_session"] == sorted(set(range(WORLD)) - {0, SLOW_RANK})
    assert hosts["summary"].get("straggler_rank") == SLOW_RANK


# ---- expert readings --------------------------------------------------------------------------------------------


READINGS = {
    "balanced": Reading(
        "Four CPU ranks (gloo, DDP, two gradient buckets per step) doing the same work: ten 24.3 ms steps, each rank "
        "computing ~40% of its step and waiting in the all-reduce ~50% (the ranks time-share two cores, so arrivals "
        "differ by ~10 ms and the last to arrive changes from step to step: 6/4/4/6 of the 20 instances). No "
        "straggler; the all-reduce that the backward pass cannot hide is the largest loss (collectives).",
        "NEEDS_ATTENTION", "collectives", 10, 24.33, {"compute": 40.43, "collective": 50.18, "host_other": 9.39}),
    "straggler": Reading(
        "The same job with rank 2 running 16 extra 384x384 matmuls before each forward: it arrives last at all 20 "
        "all-reduces (mean skew 37.9 ms) and computes 32.6 ms per step more than the others (75% of its step against "
        "~22%); the other three wait ~35 ms per step inside the all-reduce for it, so every rank's step is ~61 ms. "
        "The finding is the straggler, rank 2, with its extra compute as the cause (not collectives: the others' "
        "collective time is the wait for it).",
        "NEEDS_ATTENTION", "straggler_host", 10, 61.19, {"compute": 35.55, "collective": 59.24, "host_other": 5.22}),
}


@pytest.mark.parametrize("name", sorted(READINGS))
def test_expert_reading(name, job):
    reading, d = READINGS[name], job(name)
    assert d.analysis.result.value == reading.status, (d.keys, d.health.get("unhealthy_because"))
    assert (d.keys[0] if d.keys else None) == reading.top, d.keys
    assert d.health["steps"] == reading.steps
    assert d.health["step_source"].startswith(reading.step_source)
    assert d.health["step_time_ms"] == pytest.approx(reading.step_ms, rel=0.01)
    for category, percent in reading.breakdown.items():
        assert d.breakdown[category] == pytest.approx(percent, abs=1.5), (category, d.breakdown)
