"""xdiag's cold start, an agent's calls, and the whole `xdiag analyze` run beside XProf's own converters.

    python bench/startup_bench.py [--repeats 3] [--profile A.xplane.pb] [--workdir DIR] [--out bench/results]
                                  [--agent-repeats 21] [--baseline OTHER/shared] [--agent-calls-only]

1. The profile: the real 20 MiB CPU capture that run_bench.py makes (`dispatch_bound`, the Python tracer on), or
   `--profile`. A capture already in --workdir is used again.
2. Cold start, each in a fresh process: `xdiag --help`; `python -c pass` (the interpreter alone); and the imports of
   `xdiag analyze`: a process importing exactly the xdiag modules a whole analyze run of the profile loaded (listed
   once, in-process), so that its time less the interpreter's is what the imports cost the run.
3. An agent's calls (issue 73's goal: each within 0.15 s wall): `xdiag --help` and `xdiag tool get_step_trace
   PROFILE` answered from the local result cache (filled once before the timings), `--agent-repeats` fresh
   processes each, alternating, min and median of wall and CPU; beside them the interpreter alone and what the
   venv's `.pth` hooks import at its start (`-X importtime`, the modules `site` imports); and the heavy libraries
   each call imports (numpy, pydantic, jinja2, protobuf, rich, typer; read from its `-X importtime`). With
   `--baseline`, the same calls of another checkout's package (its `shared/` folder, e.g. a worktree of main)
   alternate with this one's, side by side.
4. The whole run: `xdiag analyze` of the profile and XProf's converters of the views its UI computes
   (run_bench.run_xdiag and run_bench.run_xprof, alternating, each on a private copy of the file); not with
   `--agent-calls-only`, which also skips 2.

Medians unless said; results in `<out>/startup.json` and `<out>/startup.md`. Never run as a test: timings depend on
the machine.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import json
import os
import shutil
import site
import statistics
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


AGENT_GOAL_WALL_S = 0.15
"""Each agent call's wall time at most this (cold interpreter, warm disk), judged on the median."""
HEAVY = ("numpy", "pydantic", "jinja2", "google.protobuf", "rich", "typer")
"""The libraries an agent's call should import only where it uses them."""


def _imports(command: list[str], env: dict) -> tuple[list[tuple[int, int, str]], str]:
    """(self µs, cumulative µs, indented name) of every module the command (a Python script and its arguments, or
    Python's own) imports, from `-X importtime`; and its stdout."""
    script = [] if command[0] == sys.executable else command[:1]
    done = subprocess.run([sys.executable, "-X", "importtime", *script, *command[1:]], capture_output=True, text=True,
                          env=env, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            rows.append((int(own), int(cumulative), name.rstrip()))
    return rows, done.stdout


def _heavy(rows: list[tuple[int, int, str]]) -> list[str]:
    names = {name.strip() for _, _, name in rows}
    return [top for top in HEAVY if any(name == top or name.startswith(f"{top}.") for name in names)]


def site_hooks(repeats: int) -> dict:
    """What the interpreter's start imports for the venv's `.pth` hooks: `site` and each module it imports (the
    hooks' modules: _pynvml_redirector, cmeel_pth, _distutils_hack...), cumulative ms, the median of `repeats`
    `python -X importtime -c pass` (which itself slows imports: compare them with each other, not with wall times)."""
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        rows, _ = _imports([sys.executable, "-c", "pass"], dict(os.environ))
        depth = [(len(name) - len(name.lstrip()) - 1) // 2 for _, _, name in rows]
        site_at = next(i for i, (_, _, name) in enumerate(rows) if depth[i] == 0 and name.strip() == "site")
        # `site`'s own imports are listed after the top-level module before it, each one level down
        first = max([i + 1 for i in range(site_at) if depth[i] == 0], default=0)
        run = {"site": rows[site_at][1] / 1000}
        run.update({rows[i][2].strip(): rows[i][1] / 1000 for i in range(first, site_at) if depth[i] == 1})
        runs.append(run)
    names = [name for name in runs[0] if all(name in run for run in runs)]
    return {name: round(statistics.median(run[name] for run in runs), 1) for name in names}


def agent_calls(profile: Path, repeats: int, workdir: Path, trees: dict[str, Path]) -> dict:
    """Per tree (label -> a `shared/` folder holding an xdiag package): `xdiag --help` and a cached `xdiag tool
    get_step_trace`, each a fresh process of the console script, alternating between the trees; min and median of
    wall and CPU seconds, and the heavy libraries each imports. The interpreter alone beside them."""
    xdiag_script = Path(sys.executable).with_name("xdiag")
    commands = {"help": [str(xdiag_script), "--help"],
                "tool_cached": [str(xdiag_script), "tool", "get_step_trace", str(profile)]}
    envs = {}
    for label, shared in trees.items():
        compileall.compile_dir(shared / "xdiag", quiet=1)  # as pip's install compiles them (run_bench.compile_bytecode)
        cache = Path(tempfile.mkdtemp(dir=workdir, prefix=f"agent-cache-{label}-"))
        envs[label] = {**os.environ, "PYTHONPATH": str(shared), "XDIAG_LOCAL_CACHE_DIR": str(cache)}
        run_bench._run(commands["tool_cached"], env=envs[label])  # the answer kept: every timed call is answered
    runs: dict[tuple[str, str], list[dict]] = {(label, name): [] for label in trees for name in commands}
    interpreter = []
    for _ in range(repeats):
        interpreter.append(run_bench._run([sys.executable, "-c", "pass"]))
        for name, command in commands.items():
            for label in trees:
                runs[(label, name)].append(run_bench._run(command, env=envs[label]))

    def figures(results: list[dict]) -> dict:
        return {f"{stat}_{measure}": round(function(r[measure] for r in results), 3)
                for stat, function in (("min", min), ("median", statistics.median)) for measure in ("wall_s", "cpu_s")}

    calls = []
    for (label, name), results in runs.items():
        rows, _ = _imports(commands[name], envs[label])
        wall = figures(results)
        calls.append({"tree": label, "call": name, "command": " ".join(["xdiag", *commands[name][1:]]), **wall,
                      "heavy_imported": _heavy(rows), "modules_imported": len(rows),
                      "goal_met": wall["median_wall_s"] <= AGENT_GOAL_WALL_S})
    pth_files = sorted(path.name for folder in site.getsitepackages() for path in Path(folder).glob("*.pth"))
    return {"repeats": repeats, "python": sys.executable, "pth_files": pth_files, "interpreter": figures(interpreter),
            "calls": calls, "site_hooks_ms": site_hooks(min(repeats, 7))}


def whole_run(profile: Path, repeats: int, workdir: Path) -> dict:
    runs: dict[str, list[dict]] = {"xdiag": [], "xprof": []}
    for _ in range(repeats):  # alternating, so drift on the machine hits both alike
        runs["xdiag"].append(run_bench.run_xdiag(profile, workdir))
        runs["xprof"].append(run_bench.run_xprof(profile, workdir))
    result = {tool: run_bench._median(results) for tool, results in runs.items()}
    result["ratio_wall_xdiag_over_xprof"] = round(result["xdiag"]["wall_s"] / result["xprof"]["wall_s"], 3)
    return result


def render_agent_markdown(report: dict) -> str:
    a = report["agent_calls"]
    lines = [
        f"Agent calls, measured {report['date']} on {report['machine']['cores']} cores; load average "
        f"{report['load_average']} before the runs, {report['load_average_after']} after; {a['repeats']} fresh "
        f"processes each, alternating. Seconds; the goal: each call's median wall at most {AGENT_GOAL_WALL_S} s.",
        "",
        "| call | package | wall min / median | CPU min / median | heavy libraries imported (modules) | goal |",
        "|---|---|---|---|---|---|",
        f"| `python -c pass` (the interpreter alone) | | {a['interpreter']['min_wall_s']} / "
        f"{a['interpreter']['median_wall_s']} | {a['interpreter']['min_cpu_s']} / {a['interpreter']['median_cpu_s']} "
        "| | |",
    ]
    for call in sorted(a["calls"], key=lambda c: (c["call"], c["tree"] != "this")):
        lines.append(
            f"| `{call['command']}` | {call['tree']} | {call['min_wall_s']} / {call['median_wall_s']} | "
            f"{call['min_cpu_s']} / {call['median_cpu_s']} | {', '.join(call['heavy_imported']) or 'none'} "
            f"({call['modules_imported']}) | {'met' if call['goal_met'] else 'not met'} |")
    hooks = a["site_hooks_ms"]
    lines += ["", f"Python: `{a['python']}`, its `.pth` files: {', '.join(a['pth_files']) or 'none'}. The "
              "interpreter's start, `python -X importtime -c pass` (ms, cumulative, median): `site` "
              f"{hooks['site']}, of which " + ", ".join(f"{name} {ms}" for name, ms in hooks.items() if name != "site"),
              ""]
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    if "whole_run" not in report:
        return render_agent_markdown(report)
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
        render_agent_markdown(report),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="instead of the 20 MiB CPU capture")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=run_bench.REPO / "bench" / "results")
    parser.add_argument("--agent-repeats", type=int, default=21, help="fresh processes per agent call and package")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout's shared/ folder: its agent calls timed beside this one's")
    parser.add_argument("--agent-calls-only", action="store_true", help="skip the cold start and the whole run")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xdiag-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.workdir is None:
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    run_bench._become_subreaper()
    run_bench.compile_bytecode()
    profile = args.profile or run_bench.make_profiles([20], [], workdir)[0]
    trees = {"this": run_bench.REPO / "shared", **({"baseline": args.baseline} if args.baseline else {})}
    report = {
        "machine": run_bench.machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repeats": args.repeats, "load_average": round(os.getloadavg()[0], 2),
        "profile": run_bench._label(profile, workdir), "size_mib": round(profile.stat().st_size / 2**20, 1),
        "trees": {label: str(shared) for label, shared in trees.items()},
        "agent_calls": agent_calls(profile, args.agent_repeats, workdir, trees),
    }
    if not args.agent_calls_only:
        modules = analyze_modules(profile, workdir)
        report.update({"xdiag_modules": len(modules), "cold_start": cold_start(modules, args.repeats),
                       "whole_run": whole_run(profile, args.repeats, workdir)})
    report["load_average_after"] = round(os.getloadavg()[0], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "startup.md").write_text(render_markdown(report))
    print(render_markdown(report))


if __name__ == "__main__":
    main()
