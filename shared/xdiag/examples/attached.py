"""A long-running JAX training loop attached to xdiag: the workload the capture tests (and a person trying
`xdiag capture` on the local stack) profile.

    python -m xdiag.examples.attached --port 9999 --control-plane URL --run RUN [--sdk] [--report-steps]
        [--slowdown-file PATH] [--seconds N] [--steps-log PATH]

It starts the JAX profiler server and registers with the control plane through `xdiag.sdk.workload.attach`
(after `machinelearning_run(..., base_url=URL)` with `--sdk`, as a user of the ML Diagnostics SDK would), then
runs jitted MLP steps (a few milliseconds of compute at the default `--batch` and `--hidden`, and a short host-side
pause each) until `--seconds` pass or it is terminated. While `--slowdown-file` exists each step takes `--slowdown-ms` longer: a degradation for the
monitor to find. `--steps-log` appends `{"step", "start", "ms"}` lines (for measuring a capture's overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xdiag.examples.attached")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control-plane", default=os.environ.get("XDIAG_CONTROL_PLANE_URL"))
    parser.add_argument("--run", default=None)
    parser.add_argument("--name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--sdk", action="store_true", help="create the run with the ML Diagnostics SDK first")
    parser.add_argument("--gcs-path", default=None, help="the SDK's gcs_path")
    parser.add_argument("--report-steps", action="store_true")
    parser.add_argument("--report-interval", type=float, default=0.5)
    parser.add_argument("--slowdown-file", default=None)
    parser.add_argument("--slowdown-ms", type=float, default=30.0)
    parser.add_argument("--pause-ms", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--steps-log", default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    import jax
    import jax.numpy as jnp

    import xdiag.sdk.workload

    if args.sdk:
        from google_cloud_mldiagnostics import machinelearning_run

        machinelearning_run(name=args.run or "attached", gcs_path=args.gcs_path, base_url=args.control_plane,
                            on_demand_xprof=False, metrics_record_interval_sec=0)
    attached = xdiag.sdk.workload.attach(
        control_plane=args.control_plane, port=args.port, run=None if args.sdk else args.run, name=args.name,
        host=args.host, report_steps=args.report_steps, report_interval_s=args.report_interval,
    )
    key = jax.random.PRNGKey(0)
    w1, w2 = jax.random.normal(key, (256, args.hidden)) * 0.05, jax.random.normal(key, (args.hidden, 64)) * 0.05
    x, y = jax.random.normal(key, (args.batch, 256)), jnp.zeros((args.batch, 64))

    @jax.jit
    def train_step(w1, w2, x, y):
        def loss(w1, w2):
            return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)

        l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 1e-3 * g1, w2 - 1e-3 * g2, l

    log = open(args.steps_log, "a") if args.steps_log else None
    print(f"READY run={attached.run} target={attached.name} port={args.port}", flush=True)
    deadline, step = time.monotonic() + args.seconds, 0
    while time.monotonic() < deadline:
        started, began = time.perf_counter(), time.time()
        with jax.profiler.StepTraceAnnotation("train", step_num=step), attached.step():
            w1, w2, loss = train_step(w1, w2, x, y)
            loss.block_until_ready()
            time.sleep(args.pause_ms / 1000)  # the host's share of a step (data loading, logging)
            if args.slowdown_file and os.path.exists(args.slowdown_file):
                time.sleep(args.slowdown_ms / 1000)
        if log:
            log.write(json.dumps({"step": step, "start": began, "ms": (time.perf_counter() - started) * 1000}) + "\n")
            log.flush()
        step += 1
    attached.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
