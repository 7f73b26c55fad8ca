"""xdiag against XProf's own converters, side by side, on profiles of increasing size.

    python bench/run_bench.py [--sizes 5,20,200,2048] [--captures host_sync:760] [--repeats 3]
                              [--device-profiles A.xplane.pb,...] [--device-large-mib 93]
                              [--xprof-max-mib 256] [--base OTHER] [--out bench/results]
    python bench/run_bench.py --hosts 1,8,32,128 [--one-process-max-hosts 32] [--repeats 3] [--workdir DIR]
    python bench/run_bench.py --tpu [--tpu-profiles A.xplane.pb,...] [--tpu-host-mib 2048] [--repeats 3] [--workdir DIR]
                              [--tpu-modes first,kept,own,waited] [--base OTHER]

1. Profiles: real CPU captures of the bundled `dispatch_bound` workload (the Python tracer on, so
   the event count per MiB is high) at about 5 and 20 MiB, then larger ones made by
   `make_large_profile.py`, which replicates the 20 MiB capture's real lines in time; and real
   captures of other workloads (`--captures NAME:STEPS`), whose events carry more bytes each, so
   XProf's converters are cheaper per byte on them.
   Device profiles: the real ones named by `--device-profiles` and one of `--device-large-mib` made
   from the largest one's real device lines. Each is analysed three ways: xdiag's own analysis
   (XProf's views off), the whole analysis (the default: XProf's views concurrently in worker
   processes for sessions of 16 MiB or more, in-process below) and the whole analysis with every
   conversion in-process one after another; beside them
   XProf's converters alone. CPU time counts every process of a run (the bench reaps orphaned
   workers as a child subreaper), wall time is the command's.
2. Each size is analysed by `xdiag analyze` (all 15 tools, the investigation and the report) and
   by XProf's converters (`xprof.convert.raw_to_tool_data.xspace_to_tool_data` for the views
   XProf's UI computes), alternating, each run in a fresh process on a private copy of the file.
3. Per size: median wall time, CPU time and peak RSS of both, the ratio xdiag/XProf, xdiag's
   split across read / tools / investigate / render, and the growth exponents of time and
   memory with size (a least-squares fit of log(cost) against log(size)).
   With `--base OTHER` (another checkout of xdiag, e.g. `git worktree add /tmp/base main`), each repeat also runs
   `xdiag analyze` with that checkout's package, alternating with this one's and XProf's: the code before and after
   a change, side by side with XProf in one sitting (row `<profile> (base)`).

Results go to `<out>/results.json` and `<out>/results.md`, with the machine described.

`--hosts` runs only the many-host bench instead (issue 37): sessions of N copies of the 20 MiB capture, each
analysed host by host (the default read) and in one process, wall time, CPU time and the peak RSS of the largest
single process; `<out>/hosts.{json,md}`.
`--tpu` runs only the TPU rows instead: the committed real TPU v5e capture (bench/profiles, 87.6 MiB), the other
real TPU profiles named, and a 2 GB host made from the capture's lines, each analysed as a user runs it the first time
and again (XProf's views kept from the first), without XProf's views and waiting for them, beside XProf's converters;
`<out>/tpu.{json,md}`; `--base OTHER` alternates another checkout's package with this one's there too.
Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import ctypes
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEVICE_PROFILES = (
    REPO / "tests" / "profiles" / "h200" / "recompilation.xplane.pb",
    REPO.parent / "shared" / "profiles" / "gpu" / "v100x8_tf_bert_worker.xplane.pb",
    REPO.parent / "shared" / "profiles" / "tpu" / "tpu_v6e_inference.xplane.pb",
)
XPROF_VIEWS = (
    "overview_page", "op_profile", "roofline_model", "hlo_stats", "memory_profile", "framework_op_stats",
    "input_pipeline_analyzer", "kernel_stats", "utilization_viewer", "smart_suggestion", "pod_viewer",
)
XPROF_SCRIPT = """
import sys
from xprof.convert import raw_to_tool_data as convert
path = sys.argv[1]
for view in sys.argv[2:]:
    convert.xspace_to_tool_data([path], view, {})
"""
"""XProf's converters as its own UI runs them (`use_saved_result` defaults to true there, profile_plugin.py): the
first view converts op_stats and keeps it beside the file, the next views read it. Each run is on a private copy in a
fresh folder, so nothing is kept from an earlier run (fresh caches)."""


def _become_subreaper() -> None:
    """Orphaned descendants (XProf's forkserver and its workers) are re-parented to this process, so
    their CPU time reaches RUSAGE_CHILDREN once they are reaped."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _live_children() -> set[int] | None:
    """This process's children now (every thread's), or None where /proc does not list them."""
    try:
        return {int(pid) for task in Path("/proc/self/task").iterdir()
                for pid in (task / "children").read_text().split()}
    except OSError:
        return None


def _reap_orphans(keep: set[int] | None, limit_s: float = 30.0) -> None:
    """Reaps the orphans a run left until none is left but the children in `keep` (the cloud bench's stack,
    alive throughout: waiting for every child to exit would wait the whole limit)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            live = _live_children()
            if keep is not None and live is not None and live <= keep:
                return
            time.sleep(0.05)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(cmd: list[str], env: dict | None = None) -> dict:
    """Runs one process: wall time, peak RSS (its own, from wait4) and CPU time of it and every
    process it started (those it left behind are reaped here first)."""
    cpu_before, children_before = _children_cpu_s(), _live_children()
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_file, stderr=err_file, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        _reap_orphans(keep=children_before)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read().decode(), err_file.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {proc.returncode}: {err.strip().splitlines()[-1:] or out[-300:]}")
    return {"wall_s": wall, "cpu_s": _children_cpu_s() - cpu_before, "peak_rss_mib": usage.ru_maxrss / 1024,
            "stdout": out}


def _private_copy(profile: Path, workdir: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=workdir))
    target = folder / profile.name
    try:
        os.link(profile, target)  # the converters write next to their input; the input itself is only read
    except OSError:
        shutil.copyfile(profile, target)
    return target


def run_xdiag(profile: Path, workdir: Path, options: tuple[str, ...] = (), **env: str) -> dict:
    """`xdiag analyze` of a private copy with an empty local cache of its own (fresh caches, as XProf's side has)."""
    out, cache = Path(tempfile.mkdtemp(dir=workdir)), Path(tempfile.mkdtemp(dir=workdir))
    try:
        result = _run([str(Path(sys.executable).with_name("xdiag")), "analyze", str(_private_copy(profile, workdir)),
                       "--out", str(out), "-q", *options], env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(cache), **env})
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    analysis = json.loads((out / "analysis.json").read_text())
    result["split_ms"] = {k: analysis["timings_ms"].get(k) for k in ("read", "tools", "investigate", "render")}
    result["events"] = analysis["profile"]["events"]
    return result


def run_xprof(profile: Path, workdir: Path) -> dict:
    return _run([sys.executable, "-c", XPROF_SCRIPT, str(_private_copy(profile, workdir)), *XPROF_VIEWS])


def make_profiles(sizes_mib: list[float], captures: list[tuple[str, int]], workdir: Path) -> list[Path]:
    """Real captures for the small sizes, real lines replicated in time for the large ones, then the
    real captures of other workloads."""
    sys.path.insert(0, str(REPO / "shared"))
    from xdiag.examples.capture import capture_workload as capture_afresh

    def capture_workload(workload: str, logdir: Path, steps: int) -> Path:
        """A capture already in --workdir (an earlier run of the bench) is used again."""
        earlier = sorted(logdir.glob("**/*.xplane.pb"))
        return earlier[-1] if earlier else capture_afresh(workload, logdir, steps=steps)

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
            _replicate(base, path, size)
        profiles.append(path)
        print(f"profile {path.name}: {path.stat().st_size / 2**20:.1f} MiB", flush=True)
    for workload, steps in captures:
        path = capture_workload(workload, workdir / f"capture-{workload}-{steps}", steps=steps)
        profiles.append(path)
        print(f"profile {workload} ({steps} steps): {path.stat().st_size / 2**20:.1f} MiB", flush=True)
    return profiles


def _replicate(source: Path, target: Path, size_mib: float) -> None:
    if target.exists():  # made by an earlier run of the bench in this --workdir
        return
    subprocess.run([sys.executable, str(REPO / "bench" / "make_large_profile.py"), str(source), str(target),
                    "--size-mib", str(size_mib)], check=True, env={**os.environ, "PYTHONPATH": str(REPO / "shared")})


def _label(profile: Path, workdir: Path) -> str:
    """The row's name: the capture folder's name (capture-20, capture-memory_bound-200) or the file's."""
    try:
        return profile.relative_to(workdir).parts[0].removesuffix(".xplane.pb")
    except ValueError:
        return profile.name.removesuffix(".xplane.pb")


def _median(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in ("wall_s", "cpu_s", "peak_rss_mib")}


def bench_device(profiles: list[Path], repeats: int, workdir: Path) -> list[dict]:
    """Per device profile: xdiag's own analysis, the whole analysis as it runs by default (XProf's views
    concurrent from 16 MiB) and with them one after another, and XProf's converters alone; medians and
    ratios to xdiag's own."""
    modes = {  # the whole analysis waits for XProf's views, which `xdiag analyze` converts beside it from 16 MiB
        "own": {"XDIAG_XPROF_VIEWS": "0"},
        "whole_concurrent": {},
        "whole_sequential": {"XDIAG_XPROF_PROCESSES": "0"},
    }
    waits = ("--xprof-wait", "600")
    rows = []
    for profile in profiles:
        runs: dict[str, list[dict]] = {mode: [] for mode in (*modes, "xprof")}
        for _ in range(repeats):
            for mode, env in modes.items():
                runs[mode].append(run_xdiag(profile, workdir, () if mode == "own" else waits, **env))
            runs["xprof"].append(run_xprof(profile, workdir))
        row = {"profile": profile.name.removesuffix(".xplane.pb"), "size_mib": round(profile.stat().st_size / 2**20, 1),
               "events": runs["own"][0]["events"]}
        for mode, results in runs.items():
            row[mode] = _median(results)
        own = row["own"]["wall_s"]
        row["ratio_whole_over_own"] = round(row["whole_concurrent"]["wall_s"] / own, 2)
        row["ratio_sequential_over_own"] = round(row["whole_sequential"]["wall_s"] / own, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


TREE_PEAK = """
import ctypes, json, os, resource, subprocess, sys, threading, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphaned descendants are reaped here
me = os.getpid()
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
peaks = {"all": 0, "command_all": 0}
done = threading.Event()
command_running = [True]

def descendants():
    found, todo = [], [me]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found

def rss_kib(pid):
    # RSS from statm (smaps_rollup's PSS walks every page table: sampled this often it slowed a 2 GiB process); the
    # pages processes share are counted in each, against xdiag's several processes, never for them.
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except (OSError, IndexError, ValueError):
        return 0

def sample():
    while not done.is_set():
        total = sum(rss_kib(pid) for pid in set(descendants()))
        peaks["all"] = max(peaks["all"], total)
        if command_running[0]:
            peaks["command_all"] = max(peaks["command_all"], total)
        done.wait(0.05)

threading.Thread(target=sample, daemon=True).start()
started = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
command_wall_s = time.perf_counter() - started
command_running[0] = False
command_tree = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
done.set()
print(json.dumps({"peak_rss_mib": usage.ru_maxrss / 1024, "command_wall_s": command_wall_s,
                  "command_tree_peak_rss_mib": command_tree, "descendants_wall_s": time.perf_counter() - started,
                  "tree_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "command_all_rss_mib": peaks["command_all"] / 1024, "all_rss_mib": peaks["all"] / 1024}))
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs a command and prints, last, the peak RSS of the command's process (and the processes it waited for), the
command's own wall time and the largest process of its tree by the time it exited, then, once every process it left
behind has exited too (XProf's conversion workers outlive the forkserver that started them; `xdiag analyze`'s
detached converter of XProf's views runs after it), the time until then and the largest process of its whole tree.
Beside them, the peak of the memory of every process of the tree summed (RSS, sampled every 50 ms from /proc): while the
command ran (`command_all_rss_mib`: the memory of everything the command runs at once, the analysis and XProf's
converter beside it) and until the last process ended (`all_rss_mib`)."""


TPU_CAPTURE_XZ = REPO / "bench" / "profiles" / "kv_decode_100steps.xplane.pb.xz"
"""A real TPU v5e capture (one chip, JAX 0.10.2): the bundled kv_decode workload, batch-1 KV-cache decoding, 100
traced steps; 87.6 MiB, 1.7M events, xz-compressed to 17 MiB to be committed."""
TPU_CAPTURE_SHA256 = "167951fc71abc567f0cd1ac36ca119d04b82ae6e7942d231fb0e6c0387415a53"


def tpu_capture(workdir: Path) -> Path:
    """The real TPU capture, decompressed into `workdir` once and checked against its digest."""
    import hashlib
    import lzma

    target = workdir / "tpu-capture" / "kv_decode_100steps.xplane.pb"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(".part")
        with lzma.open(TPU_CAPTURE_XZ) as source, part.open("wb") as out:
            shutil.copyfileobj(source, out, 2**22)
        part.rename(target)
    digest = hashlib.sha256()
    with target.open("rb") as handle:
        for block in iter(lambda: handle.read(2**22), b""):
            digest.update(block)
    if digest.hexdigest() != TPU_CAPTURE_SHA256:
        raise SystemExit(f"{target}: sha256 {digest.hexdigest()}, not the committed capture's {TPU_CAPTURE_SHA256}")
    return target


def _tree_run(cmd: list[str], env: dict) -> dict:
    result = _run([sys.executable, "-c", TREE_PEAK, *cmd], env=env)
    result.update(json.loads(result.pop("stdout").strip().splitlines()[-1]))
    result["wall_s"] = result.pop("command_wall_s")  # the command's, not the wait for what it left behind
    return result


TPU_MODES = ("first", "kept", "own", "waited")
"""How `bench_tpu` runs `xdiag analyze` on each TPU profile (see there); `--tpu-modes` picks some."""


def bench_tpu(profiles: list[Path], repeats: int, workdir: Path, xprof_max_mib: float,
              packages: dict[str, Path | None] | None = None, modes: tuple[str, ...] = TPU_MODES) -> list[dict]:
    """Per TPU profile, each run a fresh process on a private copy: `xdiag analyze` as a user runs it the first time
    (an empty local cache: XProf's views converted after the report, by a detached process), again (the views kept
    from the first run), with `--no-xprof-views`, and with `--xprof-wait 600` (the report waits for XProf's views,
    converted beside it: what the first run's report would hold had it waited); beside them XProf's 11 converters.
    Wall time is the command's; peak RSS the largest process of its tree by the time it exited, and of everything it
    started until that ended too (the detached converter after it). `packages`: the xdiag package each side runs
    (its PYTHONPATH; None: as installed), their runs alternating with XProf's in each repeat; a side other than
    "xdiag" gets rows of its own (`<profile> (<side>)`). `modes`: which of TPU_MODES run ("kept" needs "first")."""
    xdiag = str(Path(sys.executable).with_name("xdiag"))
    packages = packages or {"xdiag": None}
    rows = []
    for profile in profiles:
        size_mib = profile.stat().st_size / 2**20
        limit_gib = max(2.0, profile.stat().st_size / 2**30 + 0.1)
        runs: dict[str, dict[str, list[dict]]] = {side: {mode: [] for mode in modes} for side in packages}
        xprof_runs: list[dict] = []
        for _ in range(repeats):
            for side, package in packages.items():
                env = {**os.environ, **({"PYTHONPATH": str(package)} if package else {})}
                copy = _private_copy(profile, workdir)
                cache = Path(tempfile.mkdtemp(dir=workdir))
                for mode, options in (("first", []), ("kept", []), ("own", ["--no-xprof-views"])):
                    if mode not in modes:
                        continue
                    out = Path(tempfile.mkdtemp(dir=workdir))
                    result = _tree_run([xdiag, "analyze", str(copy), "--out", str(out), "-q", "--max-profile-gib",
                                        f"{limit_gib:.1f}", *options], env={**env, "XDIAG_LOCAL_CACHE_DIR": str(cache)})
                    analysis = json.loads((out / "analysis.json").read_text())
                    result["events"] = analysis["profile"]["events"]
                    result["read_s"] = analysis["timings_ms"]["read"] / 1000
                    runs[side][mode].append(result)
                    shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(cache, ignore_errors=True)
                if size_mib <= xprof_max_mib and "waited" in modes:
                    out, cache = Path(tempfile.mkdtemp(dir=workdir)), Path(tempfile.mkdtemp(dir=workdir))
                    runs[side]["waited"].append(_tree_run(
                        [xdiag, "analyze", str(_private_copy(profile, workdir)), "--out", str(out), "-q",
                         "--xprof-wait", "600"], env={**env, "XDIAG_LOCAL_CACHE_DIR": str(cache)}))
                    shutil.rmtree(cache, ignore_errors=True)
            if size_mib <= xprof_max_mib:
                xprof_runs.append(_tree_run([sys.executable, "-c", XPROF_SCRIPT, str(_private_copy(profile, workdir)),
                                             *XPROF_VIEWS], env=dict(os.environ)))
        label = _label(profile, workdir)
        xprof = ({**_median(xprof_runs), **{k: round(statistics.median(r[k] for r in xprof_runs), 3)
                                            for k in ("all_rss_mib", "command_all_rss_mib")}} if xprof_runs
                 else {"not_run": f"over --xprof-max-mib {xprof_max_mib:g}"})
        for side in packages:
            events = next((r["events"] for mode in ("own", "first", "kept") for r in runs[side].get(mode, [])), None)
            row = {"profile": label if side == "xdiag" else f"{label} ({side})", "size_mib": round(size_mib, 1),
                   "events": events, "xprof": xprof}
            for mode in TPU_MODES:
                results = runs[side].get(mode, [])
                if not results:
                    row[mode] = {"not_run": "not asked for" if mode not in modes
                                 else f"over --xprof-max-mib {xprof_max_mib:g}"}
                    continue
                row[mode] = {**_median(results), **{k: round(statistics.median(r[k] for r in results), 3) for k in (
                    "command_tree_peak_rss_mib", "tree_peak_rss_mib", "descendants_wall_s", "command_all_rss_mib",
                    "all_rss_mib")}}
                if "read_s" in results[0]:
                    read_s = statistics.median(r["read_s"] for r in results)
                    row[mode].update(read_s=round(read_s, 3),
                                     read_mb_per_s=round(profile.stat().st_size / 1e6 / read_s))
                if "wall_s" in xprof:
                    row[mode]["wall_over_xprof"] = round(row[mode]["wall_s"] / xprof["wall_s"], 3)
                    row[mode]["rss_over_xprof"] = round(row[mode]["command_all_rss_mib"] / xprof["all_rss_mib"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def render_tpu_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# xdiag analyze on TPU profiles ({report['date']}, {m['cores']} cores, {m['memory_gib']} GiB, median of "
        f"{report['repeats']}" + (f", load {report['load_1min']} at the end" if "load_1min" in report else "") + ")",
        "",
        "Wall s (CPU s of every process) / peak MiB of the memory of every process of the command's tree at once while "
        "it ran (RSS summed, sampled every 50 ms) (× XProf's wall / × XProf's memory); first: an empty local cache, XProf's views "
        "converted after the report by a detached process (its own wall s / peak RSS after); kept: the same file "
        "again; waited: --xprof-wait 600. XProf's converters run as its UI runs them (op_stats kept beside the file "
        "after the first view), on a fresh copy; --no-xprof-views also gives its read's wall time and rate (the file's MB "
        "over it). Goals (issue 64): first ≤ 0.15×, waited ≤ 0.5×, --no-xprof-views ≤ 0.1× XProf's wall time; memory "
        "≤ 0.4× XProf's; a 2 GB host ≤ 4 GiB at ≥ 300 MB/s of read. A row `(base)`: the --base checkout's package, its "
        "runs alternating with this one's and XProf's in each repeat.",
        "",
        "| profile | MiB | events | first | converter after it | kept | --no-xprof-views | waited | XProf's 11 converters |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(run: dict) -> str:
        if "not_run" in run:
            return f"not run ({run['not_run']})"
        ratio = (f" ({run['wall_over_xprof']}× / {run['rss_over_xprof']}×)" if "wall_over_xprof" in run else "")
        return f"{run['wall_s']} ({run['cpu_s']}) / {run['command_all_rss_mib']:.0f}{ratio}"

    for r in report["rows"]:
        first = r["first"]
        after = ("" if "not_run" in first else
                 f"{round(first['descendants_wall_s'] - first['wall_s'], 2)} / {first['tree_peak_rss_mib']:.0f}"
                 if first["tree_peak_rss_mib"] > first["command_tree_peak_rss_mib"] else "none (in line)")
        xprof = r["xprof"]
        xprof_cell = (f"{xprof['wall_s']} ({xprof['cpu_s']}) / {xprof['all_rss_mib']:.0f}" if "wall_s" in xprof
                      else f"not run ({xprof['not_run']})")
        own = cell(r["own"]) + (f"; read {r['own']['read_s']} s, {r['own']['read_mb_per_s']} MB/s"
                                if "read_s" in r["own"] else "")
        lines.append(f"| {r['profile']} | {r['size_mib']} | {r['events'] or 0:,} | {cell(first)} | {after} | "
                     f"{cell(r['kept'])} | {own} | {cell(r['waited'])} | {xprof_cell} |")
    return "\n".join(lines) + "\n"


def _pod(capture: Path, hosts: int, workdir: Path) -> Path:
    """A session folder of `hosts` byte-for-byte copies of one real host capture (each its own file: nothing shared
    in the page cache that separate hosts would not share), made once per --workdir."""
    folder = workdir / f"hosts-{capture.name.removesuffix('.xplane.pb')}-{hosts}"
    if len(list(folder.glob("*.xplane.pb"))) != hosts:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for k in range(hosts):
            shutil.copyfile(capture, folder / f"host-{k:04d}.xplane.pb")
    return folder


def bench_hosts(capture: Path, hosts: list[int], repeats: int, workdir: Path, one_process_max: int) -> list[dict]:
    """Per host count: `xdiag analyze` of a session of that many copies of `capture`, read host by host (the
    default) and, up to `one_process_max` hosts, in one process (XDIAG_READ_BY_HOST=0); medians of wall time, CPU
    time (every process) and the peak RSS of the largest single process (wait4 counts the analysing process and the
    map workers it reaped), of the largest process of its whole tree (TREE_PEAK: XProf's conversion workers too), and
    the read's share of the wall time."""
    rows = []
    for count in hosts:
        folder = _pod(capture, count, workdir)
        modes = {"by_host": {}, **({"one_process": {"XDIAG_READ_BY_HOST": "0"}} if count <= one_process_max else {})}
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(repeats):
            for mode, env in modes.items():
                out = Path(tempfile.mkdtemp(dir=workdir))
                limit_gib = max(2.0, count * capture.stat().st_size / 2**30 + 1)  # the session's whole size is checked
                result = _run([sys.executable, "-c", TREE_PEAK, str(Path(sys.executable).with_name("xdiag")), "analyze",
                               str(folder), "--out", str(out), "-q", "--max-profile-gib", f"{limit_gib:.1f}"],
                              env={**os.environ, **env})
                result.update(json.loads(result.pop("stdout").strip().splitlines()[-1]))
                analysis = json.loads((out / "analysis.json").read_text())
                result["read_s"] = analysis["timings_ms"]["read"] / 1000
                runs[mode].append(result)
                shutil.rmtree(out, ignore_errors=True)
        row = {"hosts": count, "size_mib": round(count * capture.stat().st_size / 2**20, 1)}
        for mode, results in runs.items():
            row[mode] = {**_median(results), "read_s": round(statistics.median(r["read_s"] for r in results), 3),
                         "tree_peak_rss_mib": round(statistics.median(r["tree_peak_rss_mib"] for r in results), 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    single = next((r["by_host"]["tree_peak_rss_mib"] for r in rows if r["hosts"] == 1), None)
    for row in rows:
        if single:
            row["peak_rss_over_one_host"] = round(row["by_host"]["tree_peak_rss_mib"] / single, 2)
    return rows


def render_hosts_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# xdiag analyze on many-host sessions ({report['date']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"median of {report['repeats']})",
        "",
        f"Each host a copy of {report['capture']} ({report['capture_mib']} MiB, a real capture).",
        "",
        "| hosts | MiB | host by host: wall s | CPU s | read s | peak RSS MiB, analysis or map worker | "
        "any process (× one host) | one process: wall s | CPU s | read s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        b, o = r["by_host"], r.get("one_process")
        one = (f"{o['wall_s']} | {o['cpu_s']} | {o['read_s']} | {o['peak_rss_mib']:.0f}" if o else "not run | | |")
        lines.append(f"| {r['hosts']} | {r['size_mib']} | {b['wall_s']} | {b['cpu_s']} | {b['read_s']} | "
                     f"{b['peak_rss_mib']:.0f} | {b['tree_peak_rss_mib']:.0f} ({r.get('peak_rss_over_one_host', '')}) "
                     f"| {one} |")
    return "\n".join(lines) + "\n"


def _fit(x: list[float], y: list[float]) -> float | None:
    if len(x) < 2:
        return None
    return round(float(np.polyfit(np.log(x), np.log(y), 1)[0]), 2)


def compile_bytecode() -> None:
    """xdiag's modules compiled to bytecode before anything is timed, as pip's install compiles them: in a checkout
    installed editable, where PYTHONDONTWRITEBYTECODE is set (as on these machines), every run would otherwise compile
    the modules it imports again (~0.3 s of each run's time, more than half of a small profile's own analysis)."""
    compileall.compile_dir(REPO / "shared" / "xdiag", quiet=1)


def machine() -> dict:
    sys.path.insert(0, str(REPO / "shared"))
    from xdiag.analysis.xprof.worker import allocator_library

    malloc = allocator_library()
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "xprof_workers_malloc": Path(malloc).name if malloc else "system",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5,20,200,2048", help="profile sizes in MiB")
    parser.add_argument("--captures", default="host_sync:760",
                        help="more real CPU captures as WORKLOAD:STEPS, comma-separated ('' for none)")
    parser.add_argument("--device-profiles", default=",".join(str(p) for p in DEVICE_PROFILES),
                        help="real device profiles, comma-separated ('' for none)")
    parser.add_argument("--device-large-mib", type=float, default=93,
                        help="also a device profile of this size from the largest one's real lines (0: none)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xprof-max-mib", type=float, default=256,
                        help="skip XProf above this size (its converters need many times the file size in RAM)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--base", type=Path, default=None,
                        help="another checkout of xdiag: its `xdiag analyze` alternating with this one's on the size "
                             "rows and, with --tpu, on the TPU rows (the code before a change)")
    parser.add_argument("--hosts", default="",
                        help="instead of the rest: many-host sessions of these host counts (e.g. 1,8,32,128), each "
                             "host a copy of the 20 MiB capture; results/hosts.{json,md}")
    parser.add_argument("--hosts-profile", type=Path, default=None,
                        help="with --hosts: each host a copy of this real profile (e.g. a TPU capture) instead; "
                             "results/hosts-<name>.{json,md}")
    parser.add_argument("--tpu", action="store_true",
                        help="instead of the rest: the TPU rows (results/tpu.{json,md}): the committed real TPU v5e "
                             "capture (bench/profiles), --tpu-profiles and a host of --tpu-host-mib built from the capture")
    parser.add_argument("--tpu-profiles", default=str(REPO / "tests" / "profiles" / "tpu_v5e" / "gru_scan_train.xplane.pb"),
                        help="with --tpu: more real TPU profiles, comma-separated")
    parser.add_argument("--tpu-host-mib", type=float, default=2048,
                        help="with --tpu: also a host of this size from the real capture's lines (0: none)")
    parser.add_argument("--tpu-modes", default=",".join(TPU_MODES),
                        help=f"with --tpu: which runs of xdiag analyze, of {','.join(TPU_MODES)} (kept needs first)")
    parser.add_argument("--one-process-max-hosts", type=int, default=32,
                        help="with --hosts: also read in one process up to this many hosts")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xdiag-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.workdir is None:  # nothing to reuse it for: its captures and large profiles (GiBs) go at exit
        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    _become_subreaper()
    compile_bytecode()
    captures = [(name, int(steps)) for name, steps in (c.split(":") for c in args.captures.split(",") if c)]
    if args.tpu:
        capture = tpu_capture(workdir)
        profiles = [capture, *(Path(p) for p in args.tpu_profiles.split(",") if p)]
        if args.tpu_host_mib:
            host = workdir / f"{capture.name.removesuffix('.xplane.pb')}-x{args.tpu_host_mib:g}mib.xplane.pb"
            _replicate(capture, host, args.tpu_host_mib)
            profiles.append(host)
        modes = tuple(mode for mode in args.tpu_modes.split(",") if mode)
        if not set(modes) <= set(TPU_MODES) or ("kept" in modes and "first" not in modes):
            parser.error(f"--tpu-modes: some of {','.join(TPU_MODES)}, kept with first")
        packages = {"xdiag": REPO / "shared", "base": args.base.resolve() / "shared"} if args.base else None
        report = {"machine": machine(), "repeats": args.repeats, "date": time.strftime("%Y-%m-%d"),
                  "load_1min": round(os.getloadavg()[0], 1),
                  "rows": bench_tpu(profiles, args.repeats, workdir, args.xprof_max_mib, packages, modes)}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tpu.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "tpu.md").write_text(render_tpu_markdown(report))
        print(render_tpu_markdown(report))
        return
    if args.hosts:
        capture = args.hosts_profile or make_profiles([20], [], workdir)[0]
        report = {"machine": machine(), "repeats": args.repeats, "date": time.strftime("%Y-%m-%d"),
                  "capture": _label(capture, workdir), "capture_mib": round(capture.stat().st_size / 2**20, 1),
                  "rows": bench_hosts(capture, [int(h) for h in args.hosts.split(",")], args.repeats, workdir,
                                      args.one_process_max_hosts)}
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"hosts-{args.hosts_profile.name.removesuffix('.xplane.pb')}" if args.hosts_profile else "hosts"
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / f"{stem}.md").write_text(render_hosts_markdown(report))
        print(render_hosts_markdown(report))
        return
    rows, base_rows = [], []  # base_rows: --base's runs, beside this checkout's in the table, not in the growth fit
    packages = {"xdiag": REPO / "shared", **({"base": args.base.resolve() / "shared"} if args.base else {})}
    for profile in make_profiles(sizes, captures, workdir):
        size_mib = profile.stat().st_size / 2**20
        runs: dict[str, list[dict]] = {"xdiag": [], "base": [], "xprof": []}
        for _ in range(args.repeats):  # alternate, so drift on the machine hits both alike
            for side, package in packages.items():
                pythonpath = {"PYTHONPATH": str(package)} if args.base else {}  # this checkout's own, or as installed
                runs[side].append(run_xdiag(profile, workdir, **pythonpath))
            if size_mib <= args.xprof_max_mib:
                runs["xprof"].append(run_xprof(profile, workdir))
        label = _label(profile, workdir)
        for side in packages:
            row = {"profile": label if side == "xdiag" else f"{label} (base)", "size_mib": round(size_mib, 1),
                   "events": runs[side][0]["events"], "xdiag": _median(runs[side])}
            row["xprof"] = (_median(runs["xprof"]) if runs["xprof"]
                            else {"not_run": f"over --xprof-max-mib {args.xprof_max_mib:g}"})
            row["xdiag"]["split_ms"] = {k: statistics.median(r["split_ms"][k] for r in runs[side])
                                        for k in runs[side][0]["split_ms"]}
            row["xdiag"]["peak_rss_over_size"] = round(row["xdiag"]["peak_rss_mib"] / size_mib, 2)
            if runs["xprof"]:
                row["ratio_wall_xdiag_over_xprof"] = round(row["xdiag"]["wall_s"] / row["xprof"]["wall_s"], 3)
                row["ratio_cpu_xdiag_over_xprof"] = round(row["xdiag"]["cpu_s"] / row["xprof"]["cpu_s"], 3)
                row["ratio_rss_xdiag_over_xprof"] = round(row["xdiag"]["peak_rss_mib"] / row["xprof"]["peak_rss_mib"],
                                                          3)
            (rows if side == "xdiag" else base_rows).append(row)
            print(json.dumps(row), flush=True)
    device_profiles = [Path(p) for p in args.device_profiles.split(",") if p]
    if device_profiles and args.device_large_mib:
        largest = max(device_profiles, key=lambda p: p.stat().st_size)
        large = workdir / f"{largest.name.removesuffix('.xplane.pb')}-x{args.device_large_mib:g}mib.xplane.pb"
        _replicate(largest, large, args.device_large_mib)
        device_profiles.append(large)
    device_rows = bench_device(device_profiles, args.repeats, workdir)
    scaled = rows[: len(sizes)]  # the dispatch_bound series; the other captures are not points of it
    sizes_x = [r["size_mib"] for r in scaled]
    growth = {
        "xdiag_wall_exponent": _fit(sizes_x, [r["xdiag"]["wall_s"] for r in scaled]),
        "xdiag_cpu_exponent": _fit(sizes_x, [r["xdiag"]["cpu_s"] for r in scaled]),
        "xdiag_rss_exponent": _fit(sizes_x, [r["xdiag"]["peak_rss_mib"] for r in scaled]),
    }
    measured = [r for r in scaled if "wall_s" in r["xprof"]]
    growth["xprof_wall_exponent"] = _fit([r["size_mib"] for r in measured], [r["xprof"]["wall_s"] for r in measured])
    growth["xprof_rss_exponent"] = _fit([r["size_mib"] for r in measured], [r["xprof"]["peak_rss_mib"] for r in measured])
    report = {"machine": machine(), "repeats": args.repeats, "xprof_views": list(XPROF_VIEWS), "rows": rows, "growth": growth,
              "device_rows": device_rows, "base_rows": base_rows, "load_1min": round(os.getloadavg()[0], 1),
              "date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "results.md").write_text(render_markdown(report))
    print(render_markdown(report))


def render_markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Measured {report['date']} on {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}; "
        f"median of {report['repeats']} runs, each in a fresh process; XProf's workers' malloc: "
        f"{m.get('xprof_workers_malloc', 'system')}."
        + (f" Ended {report['time_utc']} UTC at a load average of {report['load_1min']}."
           if "time_utc" in report else "")
        + (" `(base)`: the `--base` checkout's package, its runs alternating with this one's and XProf's."
           if report.get("base_rows") else ""),
        "",
        "| profile | MiB | events | xdiag wall s | xdiag CPU s | xdiag peak RSS MiB | RSS/size | XProf wall s | XProf CPU s "
        "| XProf peak RSS MiB | wall xdiag/XProf | CPU xdiag/XProf | RSS xdiag/XProf | xdiag read / tools / investigate / render ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*report["rows"], *report.get("base_rows", [])]:
        x, p = r["xdiag"], r["xprof"]
        split = " / ".join(f"{x['split_ms'][k]:.0f}" for k in ("read", "tools", "investigate", "render"))
        if "wall_s" in p:
            xp = (f"{p['wall_s']} | {p['cpu_s']} | {p['peak_rss_mib']:.0f} | {r['ratio_wall_xdiag_over_xprof']} | "
                  f"{r.get('ratio_cpu_xdiag_over_xprof', '')} | {r['ratio_rss_xdiag_over_xprof']}")
        else:
            xp = f"not run ({p['not_run']}) | | | | | "
        lines.append(f"| {r['profile']} | {r['size_mib']} | {r['events']:,} | {x['wall_s']} | {x['cpu_s']} | "
                     f"{x['peak_rss_mib']:.0f} | {x['peak_rss_over_size']} | {xp} | {split} |")
    g = report["growth"]
    lines += ["", f"Growth with size (exponent of a power-law fit over the dispatch_bound sizes; 1 = linear): "
              f"xdiag wall {g['xdiag_wall_exponent']}, CPU {g.get('xdiag_cpu_exponent')}, memory {g['xdiag_rss_exponent']}; "
              f"XProf wall {g['xprof_wall_exponent']}, memory {g['xprof_rss_exponent']}.", ""]
    if report.get("device_rows"):
        lines += [
            "Device profiles: xdiag's own analysis (XProf's views off), the whole analysis as it runs by default "
            "(XProf's views in worker processes from 16 MiB, in-process below) and one after another in-process, and XProf's converters alone. CPU counts "
            "every process of the run; peak RSS is the main process's.",
            "",
            "| profile | MiB | events | own wall s | own CPU s | whole wall s | whole CPU s | whole RSS MiB "
            "| sequential wall s | sequential CPU s | XProf alone wall s | XProf alone CPU s | whole/own | sequential/own |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["device_rows"]:
            o, w, q, p = r["own"], r["whole_concurrent"], r["whole_sequential"], r["xprof"]
            lines.append(f"| {r['profile']} | {r['size_mib']} | {r['events']:,} | {o['wall_s']} | {o['cpu_s']} | "
                         f"{w['wall_s']} | {w['cpu_s']} | {w['peak_rss_mib']:.0f} | {q['wall_s']} | {q['cpu_s']} | "
                         f"{p['wall_s']} | {p['cpu_s']} | {r['ratio_whole_over_own']} | {r['ratio_sequential_over_own']} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
