"""`xdiag tool` on the 20 MiB capture: the first call, the same call again (answered from the local result cache),
another tool on the same file (the session decoded once, mapped), and `--no-cache`.

    python bench/tool_cache_bench.py [--size-mib 20] [--repeats 3] [--tools get_step_trace,...] [--workdir .bench-work]

The profile is run_bench's real `dispatch_bound` CPU capture of that size (made there, or here the same way). Each
run is a fresh process (`python -m xdiag.cli tool …`, as the console script runs it), timed by run_bench's `_run`
(wall time, CPU time of it and its children, peak RSS); each repeat starts from an empty cache folder of its own.
Results: `<out>/tool-cache.{json,md}`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402  (the bench's capture, runner and machine description)

TOOLS = ("get_step_trace", "get_hlo_op_profile", "get_kpi_metrics")


def _xdiag_tool(tool: str, profile: Path, cache: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(run_bench.REPO / "shared"), "XDIAG_LOCAL_CACHE_DIR": str(cache)}
    return run_bench._run([sys.executable, "-m", "xdiag.cli", "tool", tool, str(profile), *extra], env=env)


def measure(profile: Path, tools: list[str], repeats: int, workdir: Path) -> list[dict]:
    """Per repeat and tool, in a fresh cache: first, cached (the same call), then --no-cache; and one other tool
    after the first (a new answer on the session decoded once)."""
    rows = []
    for repeat in range(repeats):
        for i, tool in enumerate(tools):
            cache = Path(tempfile.mkdtemp(dir=workdir, prefix="tool-cache-"))
            first = _xdiag_tool(tool, profile, cache)
            cached = _xdiag_tool(tool, profile, cache)
            assert cached["stdout"] == first["stdout"], "the cached answer differs from the first"
            other_tool = tools[(i + 1) % len(tools)]
            other = _xdiag_tool(other_tool, profile, cache)
            no_cache = _xdiag_tool(tool, profile, cache, "--no-cache")
            cache_mib = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20
            for kind, run in (("first", first), ("cached", cached), (f"other tool ({other_tool})", other),
                              ("--no-cache", no_cache)):
                rows.append({"repeat": repeat, "tool": tool, "call": kind, "wall_s": round(run["wall_s"], 3),
                             "cpu_s": round(run["cpu_s"], 3), "peak_rss_mib": round(run["peak_rss_mib"], 1),
                             "cache_mib": round(cache_mib, 1)})
            print(f"{tool}: first {first['wall_s']:.2f} s, cached {cached['wall_s']:.2f} s, "
                  f"{other_tool} after it {other['wall_s']:.2f} s, --no-cache {no_cache['wall_s']:.2f} s", flush=True)
    return rows


def table(rows: list[dict], profile: Path) -> str:
    lines = [f"`xdiag tool` on {profile.name} ({profile.stat().st_size / 2**20:.1f} MiB), medians of "
             f"{max(r['repeat'] for r in rows) + 1} runs", "",
             "| tool | call | wall s | CPU s | peak RSS MiB |", "|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["tool"], r["call"]) for r in rows))
    for tool, call in keys:
        group = [r for r in rows if (r["tool"], r["call"]) == (tool, call)]
        med = {k: statistics.median(r[k] for r in group) for k in ("wall_s", "cpu_s", "peak_rss_mib")}
        lines.append(f"| {tool} | {call} | {med['wall_s']:.2f} | {med['cpu_s']:.2f} | {med['peak_rss_mib']:.0f} |")
    lines.append("")
    lines.append(f"cache folder after the four calls: {statistics.median(r['cache_mib'] for r in rows):.1f} MiB")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=float, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--workdir", type=Path, default=run_bench.REPO / ".bench-work")
    parser.add_argument("--out", type=Path, default=run_bench.REPO / "bench" / "results")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    run_bench.compile_bytecode()
    (profile,) = run_bench.make_profiles([args.size_mib], [], args.workdir)
    rows = measure(profile, args.tools.split(","), args.repeats, args.workdir)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tool-cache.json").write_text(json.dumps({"machine": run_bench.machine(), "profile": str(profile),
                                                          "rows": rows}, indent=2))
    (args.out / "tool-cache.md").write_text(table(rows, profile))
    print(table(rows, profile))


if __name__ == "__main__":
    main()
