"""xdiag against XProf's own converters, side by side, on profiles of increasing size.

    python bench/run_bench.py [--sizes 5,20,200,2048] [--repeats 3] [--xprof-max-mib 256] [--out bench/results]

1. Profiles: real CPU captures of the bundled `dispatch_bound` workload (the Python tracer on, so
   the event count per MiB is high) at about 5 and 20 MiB, then larger ones made by
   `make_large_profile.py`, which replicates the 20 MiB capture's real lines in time.
2. Each size is analysed by `xdiag analyze` (all 15 tools, the investigation and the report) and
   by XProf's converters (`xprof.convert.raw_to_tool_data.xspace_to_tool_data` for the views
   XProf's UI computes), alternating, each run in a fresh process on a private copy of the file.
3. Per size: median wall time, CPU time and peak RSS of both, the ratio xdiag/XProf, xdiag's
   split across read / tools / investigate / render, and the growth exponents of time and
   memory with size (a least-squares fit of log(cost) against log(size)).

Results go to `<out>/results.json` and `<out>/results.md`, with the machine described.
Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
XPROF_VIEWS = (
    "overview_page", "op_profile", "roofline_model", "hlo_stats", "memory_profile", "framework_op_stats",
    "input_pipeline_analyzer", "kernel_stats", "utilization_viewer", "smart_suggestion", "pod_viewer",
)
XPROF_SCRIPT = """
import sys
from xprof.convert import raw_to_tool_data as convert
path = sys.argv[1]
for view in sys.argv[2:]:
    params = {"use_saved_result": False}
    convert.xspace_to_tool_data([path], view, params)
"""


def _run(cmd: list[str], env: dict | None = None) -> dict:
    """Runs one process; its wall time, CPU time and peak RSS (from wait4)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {code}: {err.strip().splitlines()[-1:] or out[-300:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024, "stdout": out}


def _private_copy(profile: Path, workdir: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=workdir))
    target = folder / profile.name
    try:
        os.link(profile, target)  # the converters write next to their input; the input itself is only read
    except OSError:
        shutil.copyfile(profile, target)
    return target


def run_xdiag(profile: Path, workdir: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=workdir))
    result = _run([sys.executable, "-m", "xdiag.cli", "analyze", str(_private_copy(profile, workdir)), "--out", str(out), "-q"])
    analysis = json.loads((out / "analysis.json").read_text())
    result["split_ms"] = {k: analysis["timings_ms"].get(k) for k in ("read", "tools", "investigate", "render")}
    result["events"] = analysis["profile"]["events"]
    return result


def run_xprof(profile: Path, workdir: Path) -> dict:
    return _run([sys.executable, "-c", XPROF_SCRIPT, str(_private_copy(profile, workdir)), *XPROF_VIEWS])


def make_profiles(sizes_mib: list[float], workdir: Path) -> list[Path]:
    """Real captures for the small sizes, real lines replicated in time for the large ones."""
    sys.path.insert(0, str(REPO / "shared"))
    from xdiag.workloads.capture import capture_workload

    profiles = []
    base: Path | None = None
    for size in sorted(sizes_mib):
        if size <= 30:
            steps = max(10, int(size * 12))  # dispatch_bound: ~0.085 MiB per step with the Python tracer on
            path = capture_workload("dispatch_bound", workdir / f"capture-{size:g}", steps=steps)
            base = path
        else:
            if base is None:
                base = capture_workload("dispatch_bound", workdir / "capture-base", steps=240)
            path = workdir / f"large-{size:g}.xplane.pb"
            subprocess.run([sys.executable, str(REPO / "bench" / "make_large_profile.py"), str(base), str(path),
                            "--size-mib", str(size)], check=True, env={**os.environ, "PYTHONPATH": str(REPO / "shared")})
        profiles.append(path)
        print(f"profile {path.name}: {path.stat().st_size / 2**20:.1f} MiB", flush=True)
    return profiles


def _fit(x: list[float], y: list[float]) -> float | None:
    if len(x) < 2:
        return None
    return round(float(np.polyfit(np.log(x), np.log(y), 1)[0]), 2)


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5,20,200,2048", help="profile sizes in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xprof-max-mib", type=float, default=256,
                        help="skip XProf above this size (its converters need many times the file size in RAM)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xdiag-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for profile in make_profiles(sizes, workdir):
        size_mib = profile.stat().st_size / 2**20
        runs: dict[str, list[dict]] = {"xdiag": [], "xprof": []}
        for _ in range(args.repeats):  # alternate, so drift on the machine hits both alike
            runs["xdiag"].append(run_xdiag(profile, workdir))
            if size_mib <= args.xprof_max_mib:
                runs["xprof"].append(run_xprof(profile, workdir))
        row = {"profile": profile.name, "size_mib": round(size_mib, 1), "events": runs["xdiag"][0]["events"]}
        for tool, results in runs.items():
            if results:
                row[tool] = {k: round(statistics.median(r[k] for r in results), 3) for k in ("wall_s", "cpu_s", "peak_rss_mib")}
            else:
                row[tool] = {"not_run": f"over --xprof-max-mib {args.xprof_max_mib:g}"}
        row["xdiag"]["split_ms"] = {k: statistics.median(r["split_ms"][k] for r in runs["xdiag"]) for k in runs["xdiag"][0]["split_ms"]}
        row["xdiag"]["peak_rss_over_size"] = round(row["xdiag"]["peak_rss_mib"] / size_mib, 2)
        if runs["xprof"]:
            row["ratio_wall_xdiag_over_xprof"] = round(row["xdiag"]["wall_s"] / row["xprof"]["wall_s"], 3)
            row["ratio_rss_xdiag_over_xprof"] = round(row["xdiag"]["peak_rss_mib"] / row["xprof"]["peak_rss_mib"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    sizes_x = [r["size_mib"] for r in rows]
    growth = {
        "xdiag_wall_exponent": _fit(sizes_x, [r["xdiag"]["wall_s"] for r in rows]),
        "xdiag_rss_exponent": _fit(sizes_x, [r["xdiag"]["peak_rss_mib"] for r in rows]),
    }
    measured = [r for r in rows if "wall_s" in r["xprof"]]
    growth["xprof_wall_exponent"] = _fit([r["size_mib"] for r in measured], [r["xprof"]["wall_s"] for r in measured])
    growth["xprof_rss_exponent"] = _fit([r["size_mib"] for r in measured], [r["xprof"]["peak_rss_mib"] for r in measured])
    report = {"machine": machine(), "repeats": args.repeats, "xprof_views": list(XPROF_VIEWS), "rows": rows, "growth": growth,
              "date": time.strftime("%Y-%m-%d")}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(render_markdown(report))
    print(render_markdown(report))


def render_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Measured {report['date']} on {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}; "
        f"median of {report['repeats']} runs, each in a fresh process.",
        "",
        "| profile | MiB | events | xdiag wall s | xdiag CPU s | xdiag peak RSS MiB | RSS/size | XProf wall s | XProf CPU s | XProf peak RSS MiB | wall xdiag/XProf | xdiag read / tools / investigate / render ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        x, p = r["xdiag"], r["xprof"]
        split = " / ".join(f"{x['split_ms'][k]:.0f}" for k in ("read", "tools", "investigate", "render"))
        if "wall_s" in p:
            xp = f"{p['wall_s']} | {p['cpu_s']} | {p['peak_rss_mib']:.0f} | {r['ratio_wall_xdiag_over_xprof']}"
        else:
            xp = f"not run ({p['not_run']}) | | | "
        lines.append(f"| {r['profile']} | {r['size_mib']} | {r['events']:,} | {x['wall_s']} | {x['cpu_s']} | "
                     f"{x['peak_rss_mib']:.0f} | {x['peak_rss_over_size']} | {xp} | {split} |")
    g = report["growth"]
    lines += ["", f"Growth with size (exponent of a power-law fit; 1 = linear): xdiag time {g['xdiag_wall_exponent']}, "
              f"xdiag memory {g['xdiag_rss_exponent']}, XProf time {g['xprof_wall_exponent']}, XProf memory {g['xprof_rss_exponent']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
