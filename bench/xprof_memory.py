"""The memory each XProf conversion of a device profile holds, against the estimate xdiag sets its budget with.

    python bench/xprof_memory.py [PROFILE ...] [--workdir WORKDIR] [--out bench/results]

For each profile (default: every real device profile here, tests/profiles/h200 and ../shared/profiles, then the
device profiles run_bench.py built in `--workdir` from real device lines, `*-x*mib.xplane.pb`), the copy XProf reads
(`XprofViews`' private copy: without the host events it makes no use of) is converted by op_stats (`overview_page`)
and by `memory_profile`, each in a fresh process with the workers' malloc (`worker.allocator_library`). The figure is
the growth of the process's resident memory to its peak over the conversion (VmHWM after, less VmRSS before),
beside `memory_budget.conversion_bytes` of the copy. Results go to `<out>/xprof_memory.md`. Never run as a test: the
figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "shared"))

from xdiag.analysis.xprof import memory_budget, worker  # noqa: E402
from xdiag.analysis.xprof.session_dir import copy_without_unused_events  # noqa: E402

CONVERTERS = ("overview_page", "memory_profile")
_CONVERT = """
import sys
from xprof.cli.internal.oss import xprof_client

def status(field):  # kB in /proc/self/status; VmHWM is this process's own peak (ru_maxrss carries a parent's)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

client = xprof_client.LocalXprofClient()
before = status("VmRSS:")
client.fetch(sys.argv[2], sys.argv[1])
print(before, status("VmHWM:"))
"""


def default_profiles(workdir: Path | None = None) -> list[Path]:
    found = sorted((REPO / "tests" / "profiles" / "h200").glob("*.xplane.pb"))
    shared = REPO.parent / "shared" / "profiles"
    built = sorted(workdir.glob("*-x*mib.xplane.pb")) if workdir is not None else []
    return found + sorted(p for folder in ("tpu", "gpu") for p in (shared / folder).glob("*.xplane.pb")) + built


def grown_bytes(run_dir: Path, converter: str, scratch: Path) -> int:
    env = {**os.environ, "TMPDIR": str(scratch)}
    library = worker.allocator_library()
    if library:
        env.update(LD_PRELOAD=library, MIMALLOC_ALLOW_THP="0")
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(run_dir), converter], capture_output=True, text=True,
                          env=env, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{converter} of {run_dir}: {done.stderr[-1000:]}")
    before, peak = map(int, done.stdout.split())
    return peak - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="*", type=Path)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="run_bench.py's --workdir: its large device profiles are measured after the real ones")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    rows = ["| profile | MiB XProf reads | " + " | ".join(f"{c} MiB (x the copy)" for c in CONVERTERS)
            + " | estimate MiB |", "|---|---|" + "---|" * len(CONVERTERS) + "---|"]
    with tempfile.TemporaryDirectory(prefix="xdiag-xprof-memory-") as scratch:
        for profile in args.profiles or default_profiles(args.workdir):
            run_dir = Path(scratch) / profile.stem / "plugins" / "profile" / "session"
            run_dir.mkdir(parents=True)
            copy = run_dir / profile.name
            if not any(copy_without_unused_events(profile, copy)):
                shutil.copy(profile, copy)
            size = copy.stat().st_size
            cells = []
            for converter in CONVERTERS:
                grown = grown_bytes(run_dir, converter, Path(scratch))
                cells.append(f"{grown / 2**20:.0f} ({grown / size:.1f}x)")
            row = (f"| {profile.name} | {size / 2**20:.2f} | " + " | ".join(cells)
                   + f" | {memory_budget.conversion_bytes(size) / 2**20:.0f} |")
            rows.append(row)
            print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "xprof_memory.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
