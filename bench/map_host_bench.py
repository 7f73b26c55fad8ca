"""One map invocation per host size: what the map stage costs a host file, and what it leaves for the reduce.

    python bench/map_host_bench.py [--sizes 20,200,2048] [--repeats 1] [--workdir .bench-work] [--out bench/results]
                                   [--device-profile tests/profiles/tpu_v5e/gru_scan_train.xplane.pb]

For each size, run_bench.py's real `dispatch_bound` capture (20 MiB) or its real lines replicated in time
(`make_large_profile.py`, 200 MiB and 2 GiB), or with --device-profile that device profile and its real lines
replicated to each size above its own (its rows in `<out>/map-host-<name>.{json,md}`), mapped as `map_host` maps a host file
(`xdiag.tools.host_summary.map_and_summarize`: decode, write the prepared columns, build and write the summary) in a
fresh process: wall time, CPU time and peak RSS (wait4), the prepared columns' and the summary's bytes. Then, from
the 2 GiB row, a 64-host session of such hosts against the deployed functions' limits (infra/functions.tf): each
`map_host` instance (16 GiB, 540 s) maps one host; `collect` and each `run_tool` instance hold the 64 summaries;
`investigate` maps the columns of the hosts that matter (at most 3) whose files fit the session limit (2 GiB)
together. Results in `<out>/map-host.{json,md}`. Never run as a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "shared")]

from run_bench import _replicate, _run, machine, make_profiles  # noqa: E402

MAP_ONE = ("import json, sys; from pathlib import Path; from xdiag.tools.host_summary import map_and_summarize; "
           "columns, summary = map_and_summarize(Path(sys.argv[1]), Path(sys.argv[2]), threads=2); "
           "print(json.dumps({'columns_bytes': columns, 'summary_bytes': summary}))")
HOSTS = 64
MAP_HOST_MEMORY_GIB, MAP_HOST_TIMEOUT_S, INVESTIGATE_MEMORY_GIB, SESSION_LIMIT_GIB = 16, 540, 8, 2


def bench(profiles: list[Path], repeats: int, workdir: Path) -> list[dict]:
    rows = []
    for profile in profiles:
        runs = []
        for _ in range(repeats):
            out = Path(tempfile.mkdtemp(dir=workdir)) / "host.xdiag"
            result = _run([sys.executable, "-c", MAP_ONE, str(profile), str(out)])
            runs.append({**result, **json.loads(result.pop("stdout"))})
            for path in out.parent.iterdir():
                path.unlink()
            out.parent.rmdir()
        row = {"file_mib": round(profile.stat().st_size / 2**20, 1)}
        for key in ("wall_s", "cpu_s", "peak_rss_mib", "columns_bytes", "summary_bytes"):
            row[key] = round(statistics.median(r[key] for r in runs), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def projection(row: dict) -> dict:
    """A session of HOSTS hosts of the row's size against the deployed functions' limits."""
    hosts = max(1, min(3, int(SESSION_LIMIT_GIB * 1024 // row["file_mib"])))  # investigate's, within the limit
    return {
        "hosts": HOSTS, "host_file_gib": round(row["file_mib"] / 1024, 2),
        "map_s_per_host": row["wall_s"], "map_fits_timeout": row["wall_s"] < MAP_HOST_TIMEOUT_S,
        # map_host's /tmp is memory: the downloaded file and its prepared columns, beside the decode's peak
        "map_instance_gib": round((row["peak_rss_mib"] * 2**20 + row["file_mib"] * 2**20 + row["columns_bytes"])
                                  / 2**30, 2),
        "map_instance_limit_gib": MAP_HOST_MEMORY_GIB,
        "summaries_mib_for_the_reduce": round(HOSTS * row["summary_bytes"] / 2**20, 2),
        "investigate_hosts": hosts,
        "investigate_columns_gib": round(hosts * row["columns_bytes"] / 2**30, 2),
        "investigate_limit_gib": INVESTIGATE_MEMORY_GIB,
    }


def render(report: dict) -> str:
    lines = [
        f"# One map invocation per host size ({report['date']}, {report['machine']['cores']} cores): "
        f"{report['profile']}", "",
        "| host file MiB | wall s | CPU s | peak RSS MiB | prepared columns MiB | summary KiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(f"| {r['file_mib']} | {r['wall_s']} | {r['cpu_s']} | {round(r['peak_rss_mib'])} | "
                     f"{r['columns_bytes'] / 2**20:.1f} | {r['summary_bytes'] / 1024:.1f} |")
    p = report.get("projection")
    if p:
        lines += ["", f"{p['hosts']} hosts of {p['host_file_gib']} GiB: map {p['map_s_per_host']} s per host "
                      f"(timeout {MAP_HOST_TIMEOUT_S} s), a map instance ~{p['map_instance_gib']} GiB of "
                      f"{p['map_instance_limit_gib']} GiB, summaries {p['summaries_mib_for_the_reduce']} MiB for the "
                      f"reduce and each tool instance, the columns of investigate's {p['investigate_hosts']} host(s) "
                      f"{p['investigate_columns_gib']} "
                      f"GiB of {p['investigate_limit_gib']} GiB."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20,200,2048")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench-work")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--device-profile", type=Path, default=None,
                        help="a real device profile to map, and its lines replicated to each larger size")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    sizes = [float(s) for s in args.sizes.split(",")]
    if args.device_profile:
        profiles = [args.device_profile]
        name = args.device_profile.name.removesuffix(".xplane.pb")
        for size in sizes:
            if size * 2**20 > args.device_profile.stat().st_size:
                profiles.append(args.workdir / f"{name}-x{size:g}mib.xplane.pb")
                _replicate(args.device_profile, profiles[-1], size)
    else:
        profiles = make_profiles(sizes, [], args.workdir)
    rows = bench(profiles, args.repeats, args.workdir)
    largest = max(rows, key=lambda r: r["file_mib"])
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "rows": rows,
              "projection": projection(largest),
              "profile": args.device_profile.name if args.device_profile else "the dispatch_bound capture"}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"map-host-{name}" if args.device_profile else "map-host"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
