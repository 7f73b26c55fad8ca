"""xdiag's cold start and the whole `xdiag analyze` run, beside XProf's own converters on the same profile.

    python bench/startup_bench.py [--repeats 3] [--profile A.xplane.pb] [--workdir DIR] [--out bench/results]

1. The profile: the real 20 MiB CPU capture that run_bench.py makes (`dispatch_bound`, the Python tracer on), or
   `--profile`. A capture already in --workdir is used again.
2. Cold start, each in a fresh process: `xdiag --help`; `python -c pass` (the interpreter alone); and the imports of
   `xdiag analyze`: a process importing exactly the xdiag modules a whole analyze run of the profile loaded (listed
   once, in-process), so that its time less the interpreter's is what the imports cost the run.
3. The whole run: `xdiag analyze` of the profile and XProf's converters of the views its UI computes
   (run_bench.run_xdiag and run_bench.run_xprof, alternating, each on a private copy of the file).

Medians; results in `<out>/startup.json` and `<out>/startup.md`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import run_bench

XDIAG = str(Path(sys.executable).with_name("xdiag"))
LIST_ANALYZE_MODULES = """
import json, sys
from typer.testing import CliRunner
from xdiag.cli import app
done = CliRunner().invoke(app, ["analyze", sys.argv[1], "--out", sys.argv[2], "-q"])
assert done.exit_code == 0, done.output
print(json.dumps([name for name in sys.modules if name.startswith("xdiag.")]))
"""


def analyze_modules(profile: Path, workdir: Path) -> list[str]:
    """The xdiag modules a whole `xdiag analyze` of the profile loads, in the order it loaded them."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    done = subprocess.run([sys.executable, "-c", LIST_ANALYZE_MODULES, str(profile), str(out)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def cold_start(modules: list[str], repeats: int) -> dict:
    """Medians of wall and CPU seconds: the interpreter alone, `xdiag --help`, and importing what `xdiag analyze`
    imports (CPU time, which other work on the machine does not stretch, as much as wall time)."""
    imports = "\n".join(f"import {name}" for name in modules)
    commands = {
        "interpreter": [sys.executable, "-c", "pass"],
        "help": [XDIAG, "--help"],
        "analyze_imports": [sys.executable, "-c", imports],
    }
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            runs[name].append(run_bench._run(command))
    result = {name: run_bench._median(results) for name, results in runs.items()}
    for measure in ("wall_s", "cpu_s"):
        result["analyze_imports"][f"less_interpreter_{measure}"] = round(
            result["analyze_imports"][measure] - result["interpreter"][measure], 3)
    return result


def whole_run(profile: Path, repeats: int, workdir: Path) -> dict:
    runs: dict[str, list[dict]] = {"xdiag": [], "xprof": []}
    for _ in range(repeats):  # alternating, so drift on the machine hits both alike
        runs["xdiag"].append(run_bench.run_xdiag(profile, workdir))
        runs["xprof"].append(run_bench.run_xprof(profile, workdir))
    result = {tool: run_bench._median(results) for tool, results in runs.items()}
    result["ratio_wall_xdiag_over_xprof"] = round(result["xdiag"]["wall_s"] / result["xprof"]["wall_s"], 3)
    return result


def render_markdown(report: dict) -> str:
    m, c, w = report["machine"], report["cold_start"], report["whole_run"]
    imports = c["analyze_imports"]

    def both(figures: dict) -> str:
        return f"{figures['wall_s']} / {figures['cpu_s']}"

    return "\n".join([
        f"Measured {report['date']} on {m['cores']} cores, {m['memory_gib']} GiB, Python {m['python']}; load average "
        f"{report['load_average']} before the runs; median of {report['repeats']}, each a fresh process.",
        "",
        f"Profile: {report['profile']} ({report['size_mib']} MiB); `xdiag analyze` loads {report['xdiag_modules']} "
        "xdiag modules. Seconds, wall / CPU.",
        "",
        "| interpreter alone | `xdiag --help` | analyze's imports (less the interpreter) | `xdiag analyze` "
        "| XProf's converters | xdiag/XProf wall (CPU) | imports / analyze CPU |",
        "|---|---|---|---|---|---|---|",
        f"| {both(c['interpreter'])} | {both(c['help'])} | {both(imports)} ({imports['less_interpreter_wall_s']} / "
        f"{imports['less_interpreter_cpu_s']}) | {both(w['xdiag'])} | {both(w['xprof'])} "
        f"| {w['ratio_wall_xdiag_over_xprof']} ({w['xdiag']['cpu_s'] / w['xprof']['cpu_s']:.3f}) "
        f"| {imports['less_interpreter_cpu_s'] / w['xdiag']['cpu_s']:.2f} |",
        "",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="instead of the 20 MiB CPU capture")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=run_bench.REPO / "bench" / "results")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xdiag-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.workdir is None:
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    run_bench._become_subreaper()
    run_bench.compile_bytecode()
    profile = args.profile or run_bench.make_profiles([20], [], workdir)[0]
    modules = analyze_modules(profile, workdir)
    report = {
        "machine": run_bench.machine(), "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats,
        "load_average": round(os.getloadavg()[0], 2), "profile": run_bench._label(profile, workdir),
        "size_mib": round(profile.stat().st_size / 2**20, 1), "xdiag_modules": len(modules),
        "cold_start": cold_start(modules, args.repeats),
        "whole_run": whole_run(profile, args.repeats, workdir),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "startup.md").write_text(render_markdown(report))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
