"""Untraced A/B on lstm_scan, 2026-12-07 on one TPU v5e chip: the per-step blocking wait against unrolling the scan,
each side the workload's own setup/step timed with host timers and no profiler (2 warm-up steps, N timed, R repeats
alternating, median kept). Run as `PYTHONPATH=$PYTHONPATH:$PWD/shared python3 tests/capture/untraced_ab_lstm.py`;
its output is the lstm_scan entry of tests/profiles/tpu_v5e/untraced_ab.json. The code is the one that ran."""
# ruff: noqa
import functools, importlib, json, statistics as S, sys, time
import jax
N, R = 30, 3
def t(m, block_each):
    s = m.setup()
    for i in range(2):
        s = jax.block_until_ready(m.step(s, i))
    a = time.perf_counter()
    for i in range(N):
        s = m.step(s, 2 + i)
        if block_each:
            jax.block_until_ready(s)
    jax.block_until_ready(s)
    return (time.perf_counter() - a) * 1e3 / N
SCAN = jax.lax.scan
def load():
    for name in [k for k in sys.modules if k.startswith("xdiag.examples.lstm_scan")]:
        del sys.modules[name]
    return importlib.import_module("xdiag.examples.lstm_scan")
out = {"jax": jax.__version__, "device_kind": jax.devices()[0].device_kind, "steps": N, "repeats": R}
sides = {"A_block_every_step": (None, True), "B_block_after_last_step": (None, False),
         "C_unroll_8_block_every_step": (8, True), "D_unroll_8_block_after_last": (8, False)}
r = {k: [] for k in sides}
for _ in range(R):
    for k, (u, b) in sides.items():
        jax.lax.scan = functools.partial(SCAN, unroll=u) if u else SCAN  # traced on the first call, inside t
        try:
            r[k].append(round(t(load(), b), 4))
        finally:
            jax.lax.scan = SCAN
out["lstm_scan"] = {k: {"per_step_ms_median": S.median(v), "per_step_ms": v} for k, v in r.items()}
print(json.dumps(out))
