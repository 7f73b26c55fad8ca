"""Time for the viewer to show a large session: `xdiag view` against XProf's own server alone, on the same file.

    python bench/view_bench.py [--size-mib 200] [--tool overview_page] [--out bench/results]

The profile is built like run_bench.py's large ones (a real `dispatch_bound` capture, its lines replicated in time by
make_large_profile.py). Each side starts cold, in a fresh process, on its own folder (XProf writes its caches beside
the file): the clock runs from the command's start to the moment the server has answered the session's `--tool`
page data (what the browser fetches when the session opens), and the server's peak RSS is read from /proc.

- XProf alone: `python -m xprof.server --logdir DIR` over `DIR/big/plugins/profile/s/<host>.xplane.pb`;
- xdiag view: `xdiag view --store STORE --no-bucket` over an analysis of the same file (the store links the file
  into xdiag's own tree; nothing is copied).

Results go to `<out>/view.json` and `<out>/view.md`. Never run as a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared")]

from run_bench import machine, make_profiles  # noqa: E402
from xdiag.viewer.server import free_port  # noqa: E402

RUN, SESSION, HOST = "big", "s", "host0"


def _peak_rss_mib(pid: int) -> float:
    """The largest VmHWM of the process and its descendants (`xdiag view` runs XProf's server as a child)."""
    parents, peaks = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            parents[int(entry.name)] = int(fields["PPid"])
            peaks[int(entry.name)] = int(fields.get("VmHWM", "0 kB").split()[0]) / 1024
    family, grown = {pid}, True
    while grown:
        more = {child for child, parent in parents.items() if parent in family} - family
        family |= more
        grown = bool(more)
    return max((peaks.get(p, 0.0) for p in family), default=0.0)


def _shown(argv: list[str], url_of, tool: str, env: dict[str, str], log: Path) -> dict:
    started = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=out, env=env, start_new_session=True)
    try:
        base = url_of(process)
        up = time.perf_counter() - started
        query = f"run={RUN}/{SESSION}&tag={tool}&host={HOST}"
        with urllib.request.urlopen(f"{base}/data/plugin/profile/data?{query}", timeout=3600) as answer:
            assert answer.status == 200, answer.status
            size = len(answer.read())
        shown = time.perf_counter() - started
        return {"serving_s": round(up, 2), "shown_s": round(shown, 2), "answer_bytes": size,
                "peak_rss_mib": round(_peak_rss_mib(process.pid), 1)}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def _xprof_url(port: int):
    def wait(process) -> str:
        base = f"http://127.0.0.1:{port}"
        while True:
            assert process.poll() is None, "XProf's server exited"
            try:
                urllib.request.urlopen(base + "/data/plugin/profile/runs", timeout=5).read()
                return base
            except OSError:
                time.sleep(0.1)
    return wait


def _xdiag_url(process) -> str:
    return process.stdout.readline().decode().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=200)
    parser.add_argument("--tool", default="overview_page")
    parser.add_argument("--profile", type=Path, help="use this profile instead of building one")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="xdiag-view-bench-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "shared"), str(REPO)])}
    try:
        profile = args.profile or make_profiles([args.size_mib], work)[0]
        sides = {}
        for side in ("xdiag view", "XProf alone"):
            folder = work / side.replace(" ", "-") / RUN / "plugins" / "profile" / SESSION
            folder.mkdir(parents=True)
            os.link(profile, folder / f"{HOST}.xplane.pb")
            if side == "XProf alone":
                port = free_port()
                argv = [sys.executable, "-m", "xprof.server", f"--logdir={folder.parents[3]}", f"--port={port}",
                        f"--grpc_port={free_port()}"]
                sides[side] = _shown(argv, _xprof_url(port), args.tool, env, work / "xprof.log")
            else:
                store = work / "store"
                subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(folder), "--out",
                                str(store / SESSION), "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
                argv = [sys.executable, "-m", "xdiag.cli", "view", "--store", str(store), "--no-bucket", "--port", "0",
                        "--view-dir", str(work / "view")]
                sides[side] = _shown(argv, _xdiag_url, args.tool, env, work / "view.log")
            print(side, sides[side], flush=True)
        report = {"profile_mib": round(profile.stat().st_size / 2**20, 1), "tool": args.tool, "sides": sides,
                  "machine": machine()}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "view.json").write_text(json.dumps(report, indent=2))
        lines = [f"# Viewer: a {report['profile_mib']} MiB session's {args.tool}, cold", "",
                 "| | serving s | shown s | peak RSS MiB |", "|---|---|---|---|"]
        lines += [f"| {side} | {r['serving_s']} | {r['shown_s']} | {r['peak_rss_mib']} |" for side, r in sides.items()]
        (args.out / "view.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
