"""Memory and time of `xdiag analyze` on the largest traces the reader takes, and on what it refuses.

Each trace is written here (gzip) and analysed by `python -m xdiag.cli analyze` in a fresh process; its peak RSS
comes from `wait4`, beside the peak RSS of the same command on a one-event trace (the baseline: the imports).

Shapes at TRACE_MAX_EVENTS (the reader's event limit):
- `kernels`: GPU kernels and the runtime calls that launched them (half each), no CPU ops;
- `costed_ops`: aten::mm CPU ops with input shapes, each with its launch and kernel (a third each): every op is
  costed and linked to its kernel, the most memory an event can take;
- `xprof`: XProf's own Chrome trace form, eight threads, three numeric stats on every event;
and the refused ones: `inflated` (gzip inflating past TRACE_MAX_DECODED_BYTES), `too_many` (one event more).

    python bench/hostile_traces.py [--workdir .bench-work/traces] [--shapes kernels,costed_ops,...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from xdiag.profile.trace_json import TRACE_MAX_DECODED_BYTES, TRACE_MAX_EVENTS  # noqa: E402


def _events(shape: str, count: int):
    if shape == "kernels":
        for i in range(count // 2):
            yield (b'{"ph":"X","cat":"kernel","name":"k%d","ts":%d,"dur":3,"pid":0,"tid":7,"args":{"device":0,'
                   b'"stream":7,"correlation":%d}}' % (i % 1000, 1000 + i * 5, i))
            yield (b'{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","ts":%d,"dur":2,"pid":1,"tid":1,'
                   b'"args":{"correlation":%d}}' % (999 + i * 5, i))
    elif shape == "costed_ops":
        for i in range(count // 3):
            yield (b'{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":%d,"dur":4,"pid":1,"tid":1,"args":{"External id":'
                   b'%d,"Input Dims":[[%d,64],[64,%d]],"Input type":["float","float"]}}'
                   % (1000 + i * 10, i, i % 97 + 1, i % 89 + 1))
            yield (b'{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","ts":%d,"dur":2,"pid":1,"tid":1,'
                   b'"args":{"correlation":%d}}' % (1001 + i * 10, i))
            yield (b'{"ph":"X","cat":"kernel","name":"gemm","ts":%d,"dur":3,"pid":0,"tid":7,"args":{"device":0,'
                   b'"stream":7,"correlation":%d}}' % (1004 + i * 10, i))
    else:  # xprof
        for i in range(count):
            yield (b'{"ph":"X","name":"op%d","ts":%d,"dur":3,"pid":1,"tid":%d,"args":{"step_num":%d,"flops":10,'
                   b'"bytes_accessed":5}}' % (i % 1000, 1000 + i * 5, i % 8, i))


def write_trace(path: Path, shape: str, count: int) -> None:
    with gzip.open(path, "wb", compresslevel=1) as out:
        if shape == "inflated":  # whitespace past the inflated-size limit, then one event
            out.write(b'{"traceEvents": [')
            blank = b" " * 2**24
            for _ in range(TRACE_MAX_DECODED_BYTES // len(blank) + 1):
                out.write(blank)
            out.write(next(_events("xprof", 1)) + b"]}")
            return
        out.write(b'{"traceEvents": [')
        batch = []
        for n, event in enumerate(_events("xprof" if shape == "too_many" else shape, count)):
            batch.append(event)
            if len(batch) == 10_000:
                out.write((b"," if n >= 10_000 else b"") + b",".join(batch))
                batch = []
        if batch:
            out.write((b"," if count > len(batch) else b"") + b",".join(batch))
        out.write(b"]}")


def analyse(path: Path, out: Path) -> dict:
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "analyze", str(path), "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=path.parent,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "shared")})
    _, status, usage = os.wait4(process.pid, 0)
    stderr = process.stderr.read().decode(errors="replace")
    return {"wall_s": round(time.perf_counter() - started, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024),
            "exit": os.waitstatus_to_exitcode(status), "said": stderr.strip().splitlines()[-1][:200] if stderr else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=ROOT / ".bench-work" / "traces")
    parser.add_argument("--shapes", default="kernels,costed_ops,xprof,inflated,too_many")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    baseline_trace = args.workdir / "baseline.pt.trace.json.gz"
    write_trace(baseline_trace, "xprof", 1)
    results = {"baseline": analyse(baseline_trace, args.workdir / "out-baseline")}
    for shape in args.shapes.split(","):
        count = TRACE_MAX_EVENTS + 1 if shape == "too_many" else TRACE_MAX_EVENTS
        path = args.workdir / f"{shape}.pt.trace.json.gz"
        if not path.exists():
            write_trace(path, shape, count)
        results[shape] = {**analyse(path, args.workdir / f"out-{shape}"), "events": count,
                          "gzip_mib": round(path.stat().st_size / 2**20, 1)}
        results[shape]["above_baseline_mib"] = results[shape]["peak_rss_mib"] - results["baseline"]["peak_rss_mib"]
        print(shape, json.dumps(results[shape]), flush=True)
    (args.workdir / "hostile_traces.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
