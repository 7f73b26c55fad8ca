"""CLI: python -m xdiag.examples NAME [NAME...] --logdir DIR [--steps N] [--all] [--list] [--fixed]

Profiles each named workload in its own subprocess (see xdiag.examples.capture)
and prints one line per workload with the .xplane.pb path and its size.
Exits 1 if any workload fails; a workload that cannot run here (e.g. the
4-device collective one on a single accelerator) is reported as SKIPPED.
"""

from __future__ import annotations

import argparse
import sys

from xdiag.examples import ACCELERATOR_WORKLOADS, WORKLOADS, WorkloadSkipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xdiag.examples",
        description="Capture XProf profiles of JAX workloads with known performance problems.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="workloads to capture")
    parser.add_argument("--logdir", help="output directory; each workload writes <logdir>/<name>/")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default: per workload)")
    parser.add_argument("--all", action="store_true", help="capture every workload")
    parser.add_argument("--list", action="store_true", help="list workloads and their problems")
    parser.add_argument("--fixed", action="store_true",
                        help="run each workload with its problem fixed (its fixed_step), into <logdir>/<name>-fixed/")
    args = parser.parse_args(argv)

    if args.list:
        width = max(map(len, [*WORKLOADS, *ACCELERATOR_WORKLOADS]))
        for w in WORKLOADS.values():
            devices = f" [needs {w.needs_devices} devices]" if w.needs_devices > 1 else ""
            print(f"{w.name:<{width}}  {w.expected_finding:<21} {w.problem}{devices}")
        print("\naccelerator workloads (capture them in one process: python -m xdiag.examples.in_process --accelerator)")
        for w in ACCELERATOR_WORKLOADS.values():
            print(f"{w.name:<{width}}  {w.expected_finding:<21} {w.problem}")
        return 0

    names = list(WORKLOADS) if args.all else args.names
    if not names:
        parser.error("name at least one workload, or pass --all or --list")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if not args.logdir:
        parser.error("--logdir is required")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")

    from xdiag.examples.capture import WorkloadFailed, capture

    failed = []
    for name in names:
        try:
            r = capture(name, args.logdir, args.steps, fixed=args.fixed)
        except WorkloadSkipped as exc:
            print(f"SKIPPED {exc}", flush=True)
            continue
        except WorkloadFailed as exc:
            print(f"{name}: FAILED\n{exc}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        print(
            f"{name}: {r.path} {r.size_bytes / 1e6:.2f} MB "
            f"({r.steps} steps in {r.steps_wall_s:.2f}s, process {r.process_wall_s:.1f}s)",
            flush=True,
        )
    if failed:
        print(f"error: {len(failed)} workload(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
