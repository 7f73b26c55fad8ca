"""Untraced A/B runs of the workloads whose TPU answer differs from their design (`expected_by_platform` in
shared/xdiag/examples/__init__.py): the independent measurement each of those answers names, taken with host
timers (time.perf_counter) and no profiler running. Its output is tests/profiles/tpu_v5e/untraced_ab.json, run
2026-12-06 on one TPU v5e chip (the device tool's machine; JAX as recorded in the file) by

    export PYTHONPATH=$PYTHONPATH:$PWD/shared; python3 tests/capture/untraced_ab.py > untraced_ab.json

Each side runs the workload's own setup/step (2 warm-up steps, then N timed), R times alternating, median kept:
- widening_convert, ragged_attention_serve: A blocks on every step's result (as the traced capture did), B once
  after the last step; A - B is what the per-step blocking wait costs.
- padded_heads: head_dim 72 (padded to 128 on the MXU) against 64 and 128.
- megablox_small_tiles: gmm tiling (128, 128, 128) against (512, 512, 512).
- lstm_scan: measured later by tests/capture/untraced_ab_lstm.py (the wait against jax.lax.scan(..., unroll=8)).
The code is the one that ran, as it ran (compact: it was sent inline).
"""
# ruff: noqa
import importlib,json,statistics as S,time,jax,sys
N,R=30,3
def t(m,b):
 s=m.setup()
 for i in range(2):s=jax.block_until_ready(m.step(s,i))
 a=time.perf_counter()
 for i in range(N):
  s=m.step(s,2+i)
  if b:jax.block_until_ready(s)
 jax.block_until_ready(s);return (time.perf_counter()-a)*1e3/N
def sides(d):
 r={k:[] for k in d}
 for _ in range(R):
  for k,f in d.items():r[k].append(round(f(),4))
 return {k:{"per_step_ms_median":S.median(v),"per_step_ms":v} for k,v in r.items()}
M=lambda n:importlib.import_module("xdiag.examples."+n)
def blk(n):
 m=M(n);return sides({"A_block_every_step":lambda:t(m,1),"B_block_after_last_step":lambda:t(m,0)})
def ph():
 m=M("padded_heads")
 def w(d):
  def f():m.HEAD_DIM=d;return t(m,1)
  return f
 o=sides({"A_head_dim_72":w(72),"B_head_dim_64":w(64),"C_head_dim_128":w(128)});m.HEAD_DIM=72;return o
def mb():
 from jax.experimental.pallas.ops.tpu import megablox as g
 m=M("megablox_small_tiles");o0=g.gmm
 def w(ti):
  def f():
   g.gmm=lambda *a,**k:o0(*a,**{**k,"tiling":ti})
   try:return t(m,1)
   finally:g.gmm=o0
  return f
 return sides({"A_tiling_128":w((128,128,128)),"B_tiling_512":w((512,512,512))})
o={"jax":jax.__version__,"device_kind":jax.devices()[0].device_kind,"steps":N,"repeats":R,"method":"untraced, time.perf_counter, 2 warm-up steps, median of repeats"}
for n,f in (("widening_convert",lambda:blk("widening_convert")),("ragged_attention_serve",lambda:blk("ragged_attention_serve")),("padded_heads",ph),("megablox_small_tiles",mb)):
 try:o[n]=f()
 except Exception as e:o[n]={"not_measured":f"{type(e).__name__}: {e}"[:300]}
 print(n,o[n],file=sys.stderr,flush=True)
print(json.dumps(o,indent=1))
