"""Profile several workloads one after another in this one process (an accelerator that one process holds).

``python -m xdiag.examples.in_process --logdir DIR [--archive FILE] [--steps N] NAME... | --accelerator | --all``

Where opening the device is slow or only one process may hold it (a TPU VM: ~15 s to open the chip, and a second
process is refused), the subprocess-per-workload capture of :mod:`xdiag.examples.capture` wastes the device's
time. This driver opens it once, runs each workload's setup, warm-up and traced steps in turn
(:func:`xdiag.examples.capture.trace_steps`, the same trace as the subprocess capture), and keeps going when one
workload fails or cannot run here. It writes ``DIR/<name>/plugins/profile/<session>/<host>.xplane.pb`` per workload,
``DIR/manifest.json`` (per workload: the file, steps, wall time, or why it failed; the JAX version and device), and
with ``--archive`` a gzipped tar of ``<name>.xplane.pb`` files and the manifest.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tarfile
import time
import traceback
from pathlib import Path

from xdiag.examples import ACCELERATOR_WORKLOADS, WORKLOADS, WorkloadSkipped, load_module
from xdiag.examples.capture import trace_steps


def capture_all(names: list[str], logdir: Path, steps: int | None = None, perfetto: frozenset[str] = frozenset()) -> dict:
    """Capture each workload in turn; return the manifest (also written to ``logdir/manifest.json``). The workloads
    named in ``perfetto`` also keep the profiler's Chrome trace (``chrome_trace`` in their entry)."""
    import jax

    device = jax.devices()[0]
    manifest = {"jax": jax.__version__, "platform": device.platform, "device_kind": device.device_kind,
                "devices": jax.device_count(), "workloads": {}}
    for name in names:
        t0 = time.perf_counter()
        entry: dict = {}
        try:
            module = load_module(name)
            state = module.setup()
            n = steps or module.DEFAULT_STEPS
            traced = trace_steps(module.step, state, logdir / name, n, getattr(module, "STEP_MARKERS", True),
                                 getattr(module, "BLOCK_EACH_STEP", True), perfetto=name in perfetto)
            if traced is None:
                entry = {"error": f"the profiler wrote no .xplane.pb under {logdir / name}"}
            else:
                path, wall = traced
                entry = {"path": str(path), "steps": n, "steps_wall_s": round(wall, 4),
                         "size_bytes": path.stat().st_size}
                chrome = sorted(path.parent.glob("*.json.gz"))
                if name in perfetto and chrome:
                    entry["chrome_trace"] = str(chrome[0])
        except WorkloadSkipped as exc:
            entry = {"skipped": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one failing workload must not cost the others their capture
            entry = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)}
        entry["process_wall_s"] = round(time.perf_counter() - t0, 2)
        stats = device.memory_stats() or {}  # what the workload left allocated (None on platforms without stats)
        if "bytes_in_use" in stats:
            entry["device_bytes_in_use_after"] = stats["bytes_in_use"]
        manifest["workloads"][name] = entry
        state = None
        gc.collect()
        status = entry.get("error") or entry.get("skipped") or f"{entry['path']} ({entry['size_bytes'] / 1e6:.2f} MB)"
        print(f"{name}: {status} [{entry['process_wall_s']} s]", flush=True)
    (logdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def write_archive(manifest: dict, logdir: Path, archive: Path) -> None:
    """A gzipped tar of ``<name>.xplane.pb`` per captured workload and the manifest."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(logdir / "manifest.json", arcname="manifest.json")
        for name, entry in manifest["workloads"].items():
            if "path" in entry:
                tar.add(entry["path"], arcname=f"{name}.xplane.pb")
            if "chrome_trace" in entry:
                tar.add(entry["chrome_trace"], arcname=f"{name}.trace.json.gz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xdiag.examples.in_process", description=__doc__.split("\n\n")[1])
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--logdir", required=True, type=Path)
    parser.add_argument("--archive", type=Path, help="also write a .tar.gz of the profiles and the manifest")
    parser.add_argument("--steps", type=int, help="measured steps (default: each workload's DEFAULT_STEPS)")
    parser.add_argument("--accelerator", action="store_true", help="every accelerator workload")
    parser.add_argument("--all", action="store_true", help="every single-process workload, bundled and accelerator")
    parser.add_argument("--perfetto", action="append", default=[], metavar="NAME",
                        help="also keep this workload's Chrome trace (<name>.trace.json.gz in the archive); repeatable")
    args = parser.parse_args(argv)
    names = list(args.names)
    if args.all:
        names += [n for n, w in WORKLOADS.items() if w.processes == 1]
    if args.all or args.accelerator:
        names += list(ACCELERATOR_WORKLOADS)
    if not names:
        parser.error("name at least one workload, or pass --accelerator or --all")
    unknown = [n for n in names if n not in WORKLOADS and n not in ACCELERATOR_WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    args.logdir.mkdir(parents=True, exist_ok=True)
    manifest = capture_all(list(dict.fromkeys(names)), args.logdir, args.steps, frozenset(args.perfetto))
    if args.archive:
        write_archive(manifest, args.logdir, args.archive)
    failed = [n for n, e in manifest["workloads"].items() if "error" in e]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
