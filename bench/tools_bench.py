"""The analysis after the read: each broad tool's CPU time on one profile, the session read once per repeat.

    python bench/tools_bench.py PROFILE [--repeats 3] [--base DIR] [--out bench/results]

Each repeat is a fresh process that reads the profile (untimed), then runs the broad tools in the order an analysis
runs them (`xdiag.tools.BROAD_TOOLS`, XProf's views off as `--no-xprof-views` turns them off), each timed in CPU
seconds: the first tool pays for the tables the others share (the op table, the step rows, the op statistics).
With `--base` (another checkout of xdiag, e.g. `git worktree add /tmp/base main`) the same runs with that checkout's
`shared/` on the path, alternating with this one's repeat by repeat: the two side by side on one machine whatever its
load. Medians; results in `<out>/tools-<profile>.{json,md}`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys, time
from pathlib import Path
os.environ["XDIAG_XPROF_VIEWS"] = "0"
from xdiag.profile.session import read_session
from xdiag.tools import BROAD_TOOLS, run_tool
path = Path(sys.argv[1])
session = read_session([path], name=path.name.split(".")[0])
times, began = {}, time.process_time()
for name in BROAD_TOOLS:
    start = time.process_time()
    run_tool(session, name, {})
    times[name] = time.process_time() - start
times["all tools"] = time.process_time() - began
print(json.dumps(times))
"""


def measure(checkout: Path, profile: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "shared")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(profile)], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", type=Path, help="another checkout of xdiag, measured alternately")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    checkouts = {"this": REPO, **({"base": args.base.resolve()} if args.base else {})}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in checkouts}
    loads = []
    for repeat in range(args.repeats):
        for label, checkout in checkouts.items():
            loads.append(os.getloadavg()[0])
            runs[label].append(measure(checkout, args.profile))
            print(f"repeat {repeat + 1} {label}: all tools {runs[label][-1]['all tools']:.3f} s CPU", flush=True)
    medians = {label: {tool: statistics.median(run[tool] for run in done) for tool in done[0]}
               for label, done in runs.items()}
    result = {"profile": str(args.profile), "bytes": args.profile.stat().st_size, "repeats": args.repeats,
              "load_average": [min(loads), max(loads)], "cpu_s_median": medians,
              "checkouts": {label: str(path) for label, path in checkouts.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"tools-{args.profile.name.split('.')[0]}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    labels = list(medians)
    tools = sorted(medians["this"], key=lambda tool: -max(medians[label][tool] for label in labels))
    lines = [f"# Broad tools' CPU time: {args.profile.name} ({args.profile.stat().st_size / 2**20:.1f} MiB)", "",
             f"Medians of {args.repeats}, CPU seconds; load average {min(loads):.1f}-{max(loads):.1f}.", "",
             "| tool | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    lines += [f"| {tool} | " + " | ".join(f"{medians[label][tool]:.3f}" for label in labels) + " |"
              for tool in tools if max(medians[label][tool] for label in labels) >= 0.001]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
