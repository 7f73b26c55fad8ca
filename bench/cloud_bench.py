"""The cloud path on the local stack: upload → summary.html, against the single-process `xdiag analyze` of the same file.

    python bench/cloud_bench.py [--size-mib 20] [--repeats 3] [--quiet-period 3] [--out bench/results]

The profile is run_bench.py's real `dispatch_bound` capture of that size. The bench starts the local stack (`xdiag up`:
the Pub/Sub and Firestore emulators, the Cloud Storage emulator, every function) in a folder of its own, uploads the
file as a new run `--repeats + 1` times (the first run, with cold function processes, is reported apart) and, between
uploads, times `xdiag analyze` of the same file in a fresh process. Per upload it prints where the time went, from
the timestamps the stages record (`xdiag upload --wait` shows the same): the upload and register's record, the quiet
period, collect, the tool runs, the fan-in, the investigation, the render.

The target it checks (issue 16): upload → summary.html ≤ quiet period + 1.5 × the single-process analysis. Results
go to `<out>/cloud.json` and `<out>/cloud.md`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared")]

from run_bench import machine, make_profiles, run_xdiag  # noqa: E402
from xdiag.cloud.localstack import LocalStack, StackSettings  # noqa: E402

STAGES = ("notify+register", "quiet period", "collect", "tools", "fan-in", "investigate", "render")


def upload_once(profile: Path, run: str) -> dict:
    """One upload through the stack whose environment is in os.environ; the stage split from the stages' records."""
    from xdiag.cloud.operations import client_config, stage_breakdown, state_store, upload_session, wait_for_analysis
    from xdiag.profile.locate import locate_session

    config, located = client_config(), locate_session(profile, None)
    started = time.time()
    upload_session(located, run, config)
    state = state_store(config)
    analysis = wait_for_analysis(state, run, located.name, timeout_s=600, since=started)
    total = time.time() - started
    if analysis["status"] != "DONE":
        raise RuntimeError(f"the analysis of run {run} ended {analysis['status']}: {analysis.get('failure_reason')}")
    return {"total_s": round(total, 2),
            "stages_s": {stage.name: round(stage.seconds, 3) for stage in stage_breakdown(state, analysis, started)},
            "tools_compute_s": round(analysis["timings_ms"].get("tools", 0) / 1000, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=float, default=20, help="the dispatch_bound capture's size")
    parser.add_argument("--repeats", type=int, default=3, help="warm uploads (after one cold)")
    parser.add_argument("--quiet-period", type=float, default=3.0, help="register's quiet period, as `xdiag up`'s")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--workdir", type=Path, default=None, help="captures are kept and reused here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xdiag-cloud-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    [profile] = make_profiles([args.size_mib], [], workdir)
    stack = LocalStack(workdir / "stack", StackSettings(quiet_period_s=args.quiet_period)).start(owner_pid=os.getpid())
    os.environ.update(stack.env)
    uploads, singles = [], []
    try:
        for i in range(args.repeats + 1):
            upload = upload_once(profile, f"cloud-bench-{int(time.time())}-{i}")
            single = run_xdiag(profile, workdir)
            uploads.append(upload)
            singles.append(single)
            split = "  ".join(f"{k} {v:.2f}" for k, v in upload["stages_s"].items())
            print(f"upload {i}{' (cold)' if i == 0 else ''}: {upload['total_s']:.2f} s  [{split}]  "
                  f"single process {single['wall_s']:.2f} s", flush=True)
    finally:
        stack.stop()

    warm = uploads[1:]
    single_s = statistics.median(s["wall_s"] for s in singles[1:])
    total_s = statistics.median(u["total_s"] for u in warm)
    target_s = args.quiet_period + 1.5 * single_s
    report = {
        "machine": machine(), "load_average": os.getloadavg(), "profile_mib": round(profile.stat().st_size / 2**20, 1),
        "quiet_period_s": args.quiet_period, "uploads": uploads, "single_process": singles,
        "median_warm_total_s": total_s, "median_single_s": single_s, "target_s": round(target_s, 2),
        "met": total_s <= target_s,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cloud.json").write_text(json.dumps(report, indent=2))
    (args.out / "cloud.md").write_text(render_markdown(report))
    print(render_markdown(report))


def render_markdown(report: dict) -> str:
    head = "| run | upload → summary.html s | " + " | ".join(STAGES) + " | tools' own compute s | single-process s |"
    rows = [head, "|" + "---|" * (len(STAGES) + 4)]
    for i, (upload, single) in enumerate(zip(report["uploads"], report["single_process"])):
        stages = " | ".join(f"{upload['stages_s'].get(s, float('nan')):.2f}" for s in STAGES)
        rows.append(f"| {i + 1}{' (cold)' if i == 0 else ''} | {upload['total_s']:.2f} | {stages} | "
                    f"{upload['tools_compute_s']:.2f} | {single['wall_s']:.2f} |")
    verdict = "met" if report["met"] else "not met"
    rows.append("")
    rows.append(f"Median of the warm runs: {report['median_warm_total_s']:.2f} s against quiet period + 1.5 × single "
                f"process = {report['quiet_period_s']:g} + 1.5 × {report['median_single_s']:.2f} = "
                f"{report['target_s']:.2f} s: **{verdict}** ({report['profile_mib']} MiB profile, load "
                f"{report['load_average'][0]:.1f}).")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
