"""Fix-trial driver: build each (program, variant), time its steps, capture a short trace.

Runs every requested capture in ONE Python process (one chip open), sequentially. Needs only jax (and flax / optax /
keras for the programs that use them). For each capture it writes, under OUT/<program>/<label>/:
  <program>.xplane.pb   the trace (jax.profiler.trace, default options: the Python tracer on)
  steps.json            the program's own step times: host wall clock per step, untraced and traced

Timing protocol (per capture, after 2 warm-up steps that compile):
  pipelined  10 steps run as the program's own loop runs them (no block between steps, one block at the end);
             mean = total / 10. This is the program's step time: a per-step sync the program makes (float(loss))
             is in it, a sync the driver would add is not.
  blocked    10 steps, each blocked on (host wall clock per step, device work included).
  traced     TRACE_STEPS steps inside the trace, run as the program runs them, blocked once at the end.

Usage: python driver.py --out DIR --plan PLAN   where PLAN is 'prog:variant[*n],variant,...;prog2:...'
  *n captures the same variant n times (two captures of an unchanged program: the closed-loop pairs).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")
HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
sys.path.insert(0, PROGRAMS)

import jax  # noqa: E402

WARMUP, PIPELINED, BLOCKED = 2, 10, 10


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(PROGRAMS, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(step, carry, n, block_each):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        carry = step(carry)
        if block_each:
            jax.block_until_ready(carry)
        times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    jax.block_until_ready(carry)
    tail = (time.perf_counter() - t0) * 1e3
    return carry, times, tail


def _summary(times, tail):
    total = sum(times) + tail
    return {"per_step_ms": [round(t, 4) for t in times], "final_block_ms": round(tail, 4),
            "total_ms": round(total, 4), "mean_ms": round(total / len(times), 4),
            "median_ms": round(statistics.median(times), 4)}


def _has_device_plane(xplane_path):
    """Whether the capture holds the accelerator's plane. On a TPU v5e (JAX 0.10.2) one capture of ~1,000 loop trips
    (a 20 MB trace) left every later capture of the same process with host planes only: the step times stay valid,
    the captures do not, so each is checked and a missing plane is printed."""
    if jax.devices()[0].platform == "cpu":
        return True
    with open(xplane_path, "rb") as f:
        return f"/device:{jax.devices()[0].platform.upper()}:".encode() in f.read()


def capture(prog, variant, dest, trace_steps, repeat):
    mod = load(prog)
    t0 = time.perf_counter()
    step, carry, meta = mod.build(variant)
    carry, _, _ = _run(step, carry, WARMUP, True)
    compile_s = time.perf_counter() - t0
    record = {"program": prog, "variant": variant, "framework": getattr(mod, "FRAMEWORK", ""),
              "phase": getattr(mod, "PHASE", ""), "units": meta.get("units"), "unit": meta.get("unit"),
              "jax": jax.__version__, "device": str(jax.devices()[0].device_kind),
              "warmup_s": round(compile_s, 3), "captures": []}
    for r in range(repeat):
        d = dest if repeat == 1 else f"{dest}-{'ab'[r] if repeat == 2 else r}"
        os.makedirs(d, exist_ok=True)
        carry, pt, ptail = _run(step, carry, PIPELINED, False)
        carry, bt, btail = _run(step, carry, BLOCKED, True)
        logdir = os.path.join(d, "trace")
        with jax.profiler.trace(logdir):
            carry, tt, ttail = _run(step, carry, trace_steps, False)
        pbs = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        xp = os.path.join(d, f"{prog}.xplane.pb")
        if pbs:
            shutil.move(pbs[0], xp)
        shutil.rmtree(logdir, ignore_errors=True)
        rec = dict(record, label=os.path.basename(d),
                   pipelined=_summary(pt, ptail), blocked=_summary(bt, btail), traced=_summary(tt, ttail),
                   trace_steps=trace_steps, xplane_bytes=os.path.getsize(xp) if pbs else 0,
                   device_plane=_has_device_plane(xp) if pbs else False)
        rec.pop("captures")
        with open(os.path.join(d, "steps.json"), "w") as f:
            json.dump(rec, f, indent=1)
        print(f"[{time.strftime('%H:%M:%S')}] {prog}:{variant} {os.path.basename(d)} pipelined "
              f"{rec['pipelined']['mean_ms']:.3f} ms blocked {rec['blocked']['median_ms']:.3f} ms "
              f"warm {compile_s:.1f}s xplane {rec['xplane_bytes']/1e6:.1f} MB"
              f"{'' if rec['device_plane'] else ' NO DEVICE PLANE'}", flush=True)
    del carry, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--trace-steps", type=int, default=4)
    ap.add_argument("--interpret", action="store_true", help="Pallas TPU kernels in interpret mode (CPU tests)")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="skip what starts after this many seconds")
    a = ap.parse_args()
    if a.interpret:
        from jax.experimental.pallas import tpu as pltpu
        with pltpu.force_tpu_interpret_mode():
            return run(a)
    return run(a)


def run(a):
    start = time.perf_counter()
    print("devices", jax.devices(), flush=True)
    for group in filter(None, a.plan.split(";")):
        prog, variants = group.split(":")
        for v in variants.split(","):
            repeat = 1
            if "*" in v:
                v, n = v.split("*")
                repeat = int(n)
            if time.perf_counter() - start > a.deadline_s:
                print(f"SKIP {prog}:{v} (deadline)", flush=True)
                continue
            ts = getattr(load(prog), "TRACE_STEPS", a.trace_steps)
            dest = os.path.join(a.out, prog, v)
            try:
                jax.config.update("jax_default_matmul_precision", None)  # a program may set it globally
                jax.config.update("jax_enable_x64", False)  # ... and 64-bit types, as one with float64 data does
                capture(prog, v, dest, ts, repeat)
            except Exception as e:  # one failed variant must not stop the others
                os.makedirs(dest, exist_ok=True)
                with open(os.path.join(dest, "error.txt"), "w") as f:
                    f.write(traceback.format_exc())
                print(f"FAIL {prog}:{v}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            jax.clear_caches()
    print(f"done in {time.perf_counter() - start:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
