"""`xdiag mcp` as an agent meets it: a short call alone and during a long analysis, and a cancelled analysis.

    python bench/mcp_bench.py [--profile tests/profiles/tpu_v5e/gru_scan_train.xplane.pb] [--repeats 3]

Driven by the MCP SDK's client over stdio (`python -m xdiag.cli mcp`, a fresh server and an empty result cache per
repeat). Per repeat: the analysis alone; a short call (get_kpi_metrics on a small H200 profile, uncached) alone; the
same short call sent once the analysis's worker runs (its time and whether it finished before the analysis); a
second analysis cancelled a second into its run (the time from notifications/cancelled to the worker and every
process it started being gone) and the next call's time; six first calls on six TPU profiles sent together, with 2
workers and with 6 (the time until all are answered, the peak memory of the server and its workers together).
Results: `<out>/mcp.{json,md}`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import psutil

REPO = Path(__file__).resolve().parents[1]
SHORT = REPO / "tests" / "profiles" / "h200"


def _serving(server: psutil.Process, idle: int) -> list[psutil.Process]:
    """The server's workers, oldest first, once a call has taken one (one more than the `idle` ones started ahead
    before it): the call's worker is the oldest."""
    found = []
    for child in server.children():
        try:
            if "xdiag.agent.mcp_worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append((child.create_time(), child))
        except psutil.Error:  # ended between the listing and the look
            continue
    return [child for _, child in sorted(found, key=lambda item: item[0])] if len(found) > idle else []


async def _wait(condition, limit_s: float = 300.0):
    with anyio.fail_after(limit_s):
        while not (found := condition()):
            await anyio.sleep(0.01)
    return found


async def one_repeat(profile: Path, workdir: Path) -> dict:
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "PYTHONPATH": str(REPO / "shared"), "XDIAG_LOCAL_CACHE_DIR": str(workdir / "cache")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp"], env=env, cwd=workdir)
    copies = [workdir / f"{i}-{profile.name}" for i in range(3)]  # each analysis decodes afresh
    for copy in copies:
        shutil.copyfile(profile, copy)
    row: dict = {}
    async with Client(params, read_timeout_seconds=900, mode="legacy") as client:
        server = next(p for p in psutil.Process().children(recursive=True) if "mcp" in p.cmdline())

        async def timed(name: str, arguments: dict) -> float:
            started = time.perf_counter()
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result.content[0].text
            return time.perf_counter() - started

        row["analysis_alone_s"] = await timed("analyze", {"path": str(copies[0]), "out": str(workdir / "a0")})
        row["short_alone_s"] = await timed("get_kpi_metrics", {"path": str(SHORT / "healthy.xplane.pb")})
        finished: list[str] = []
        async with anyio.create_task_group() as group:
            async def analysis() -> None:
                row["analysis_with_short_s"] = await timed("analyze", {"path": str(copies[1]),
                                                                      "out": str(workdir / "a1")})
                finished.append("analyze")

            group.start_soon(analysis)
            await _wait(lambda: _serving(server, idle=1))
            row["short_during_analysis_s"] = await timed("get_kpi_metrics",
                                                         {"path": str(SHORT / "memory_bound.xplane.pb")})
            finished.append("short")
        row["short_finished_first"] = finished[0] == "short"
        scope = anyio.CancelScope()
        async with anyio.create_task_group() as group:
            async def cancelled() -> None:
                with scope:
                    await client.call_tool("analyze", {"path": str(copies[2]), "out": str(workdir / "a2")})

            group.start_soon(cancelled)
            worker = (await _wait(lambda: _serving(server, idle=1)))[0]
            await anyio.sleep(1.0)  # into the analysis: the session decoded, the tools running
            processes = [worker, *worker.children(recursive=True)]
            started = time.perf_counter()
            scope.cancel()
        _, alive = psutil.wait_procs(processes, timeout=60)
        row["cancel_to_processes_gone_s"] = time.perf_counter() - started
        row["processes_ended"] = len(processes)
        row["processes_left"] = len(alive)
        row["next_call_after_cancel_s"] = await timed("get_step_trace", {"path": str(SHORT / "healthy.xplane.pb")})
    row.update(await parallel_reads(workdir))
    return row


READS = ("gru_scan_train", "kv_decode", "lstm_scan", "decode_prefetched", "recompilation", "dispatch_bound")


async def parallel_reads(workdir: Path) -> dict:
    """Six first calls on six TPU profiles sent together to a fresh server: how long until all are answered, and
    the peak memory of the server and its workers together (sampled every 20 ms), with 2 workers and with 6."""
    from mcp import Client, StdioServerParameters

    profiles = [REPO / "tests" / "profiles" / "tpu_v5e" / f"{name}.xplane.pb" for name in READS]
    row = {}
    for workers in (2, 6):
        env = {**os.environ, "PYTHONPATH": str(REPO / "shared"),
               "XDIAG_LOCAL_CACHE_DIR": str(workdir / f"cache-reads-{workers}")}
        params = StdioServerParameters(command=sys.executable, args=["-m", "xdiag.cli", "mcp", "--workers",
                                                                     str(workers)], env=env, cwd=workdir)
        async with Client(params, read_timeout_seconds=900, mode="legacy") as client:
            server = next(p for p in psutil.Process().children(recursive=True) if "mcp" in p.cmdline())
            peak, done = 0, []

            async def read(profile: Path) -> None:
                result = await client.call_tool("get_hlo_op_profile", {"path": str(profile)})
                assert not result.is_error, result.content[0].text
                done.append(profile)

            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for profile in profiles:
                    group.start_soon(read, profile)
                while len(done) < len(profiles):
                    rss = 0
                    for process in [server, *server.children(recursive=True)]:
                        try:
                            rss += process.memory_info().rss
                        except psutil.NoSuchProcess:
                            pass
                    peak = max(peak, rss)
                    await anyio.sleep(0.02)
            row[f"six_reads_{workers}_workers_s"] = time.perf_counter() - started
            row[f"six_reads_{workers}_workers_peak_mib"] = round(peak / 2**20)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", type=Path, default=REPO / "tests" / "profiles" / "tpu_v5e" / "gru_scan_train.xplane.pb")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="mcp-bench-") as workdir:
            rows.append(anyio.run(one_repeat, args.profile, Path(workdir)))
            print(json.dumps(rows[-1]), flush=True)
    keys = [k for k in rows[0] if k.endswith(("_s", "_mib"))]
    medians = {k: round(statistics.median(r[k] for r in rows), 2) for k in keys}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mcp.json").write_text(json.dumps({"profile": args.profile.name, "rows": rows, "median": medians},
                                                  indent=2))
    lines = [f"`xdiag mcp` on {args.profile.name}, median of {len(rows)} (seconds)", "", "| measure | s (MiB) |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in medians.items()),
             "", f"short call finished first: {[r['short_finished_first'] for r in rows]}; processes left after "
                 f"cancel: {[r['processes_left'] for r in rows]} of {[r['processes_ended'] for r in rows]}"]
    (args.out / "mcp.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
