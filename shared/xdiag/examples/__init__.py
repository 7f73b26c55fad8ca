"""Example JAX programs with known problems, for testing xdiag's profile analysis and for `xdiag demo`.

They are examples, not part of the service: the Cloud Functions' source leaves them out (infra/functions.tf), and
they reach xdiag only through the in-job SDK (xdiag.sdk), as a user's job would.

Each workload is a small, real JAX program with ONE clear, known performance
problem (plus one healthy control). They are profiled with the real JAX
profiler by :mod:`xdiag.examples.capture` (``python -m xdiag.examples``) and
the resulting ``*.xplane.pb`` files are fed to the analyser, which must find
``Workload.expected_finding`` from the profile's own numbers.
``capture_workload(name, logdir, steps=None)`` (from
:mod:`xdiag.examples.capture`, re-exported here) returns the written
``.xplane.pb`` path.

Every workload module (``xdiag.examples.<name>``) exposes:

* ``DEFAULT_STEPS``: number of measured steps the capture runs by default;
* ``setup() -> state``: builds arrays and jitted functions (the step's own
  programs compile on the first ``step`` call, i.e. during warm-up);
* ``step(state, i) -> state``: one training step; ``i`` is a global step
  counter that keeps increasing across warm-up and measured steps;
* ``run(steps) -> None``: setup + ``steps`` steps, unprofiled.

The modules use only jax, numpy and the standard library and run on any JAX
backend (CPU, GPU, TPU). Importing this package does not import jax; the
workload modules are imported lazily.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType


@dataclass(frozen=True)
class Workload:
    """A registered workload.

    name: registry key, also the module name ``xdiag.examples.<name>``.
    problem: one-line description of the known performance problem.
    expected_finding: short stable key the analyser should report for it.
    needs_devices: devices the workload needs; on CPU the capture forces this
        many host devices via ``--xla_force_host_platform_device_count``.
    processes: processes the capture starts (``jax.distributed`` on 127.0.0.1 with gloo CPU collectives), each
        writing its own profile into one session folder.
    expected_by_platform: where a platform's compiler removes the problem, what
        the analyser should report there instead, why, and the independent measurement
        that supports it (platform -> (key, why, measured)): a hand count from the
        shapes, host timers, or an untraced A/B run (tests/capture/untraced_ab.py), never
        the analyser's own output.
    xla_flags: extra XLA flags for the capture.
    """

    name: str
    problem: str
    expected_finding: str
    needs_devices: int = 1
    processes: int = 1
    expected_by_platform: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    xla_flags: str = ""

    def expected_on(self, platform: str) -> str:
        """The finding expected on `platform` (CPU, GPU, TPU)."""
        return self.expected_by_platform.get(platform, (self.expected_finding, "", ""))[0]


class WorkloadSkipped(RuntimeError):
    """Raised when a workload cannot show its problem on this machine
    (e.g. the collective workload with a single accelerator)."""


_ALL = [
    Workload(
        "healthy",
        "compute-bound MLP training step (big matmuls, fwd+bwd+SGD in one jit, donated weights) run back to back",
        "optimal",
    ),
    Workload(
        "input_bound",
        "each step builds its batch on the host in Python/numpy, taking longer than the small jitted step",
        "input_bound",
    ),
    Workload(
        "dispatch_bound",
        "un-jitted op-by-op code: hundreds of tiny eager jnp ops per step, time is per-op dispatch overhead",
        "eager_ops",
    ),
    Workload(
        "recompilation",
        "jitted function called with a new batch size every step, so XLA recompiles every step",
        "recompile_per_shape",
    ),
    Workload(
        "host_sync",
        "step blocks on device->host transfers (float(loss), np.asarray) and a host callback inside the jit",
        "python_loop_of_calls",
        expected_by_platform={"CPU": (
            "callback_in_step", "on a CPU the callback runs as one of the device's ops, on the same cores: its NumPy "
            "work is most of the step's op time, more than the loop's dispatches and reads cost",
            "host timers on a 2-core CPU (2026-12-07): the callback's NumPy function alone takes 28 ms of the 67 ms "
            "untraced step (its 4 calls of 2^19 elements: 42%), while the device idles 12% of the step between the "
            "loop's calls and reads")},
    ),
    Workload(
        "memory_bound",
        "jitted step of elementwise ops and reductions over tens of MB (no matmul): low arithmetic intensity",
        "memory_bound",
    ),
    Workload(
        "layout_transpose",
        "jitted step dominated by materialised transposes/copies of large 4-D tensors that only change layout",
        "transposed_outputs",
    ),
    Workload(
        "widening_convert",
        "bf16 data widened to f32 around large reductions, so convert and reduce ops dominate the step",
        "widening_converts",
        expected_by_platform={
            "GPU": ("memory_bound", "XLA:GPU fuses each bf16->f32 convert into the reduction reading it, so no widened "
                    "copy is written; what remains is four kernels each reading the same bf16 array",
                    "hand count: bf16[16384,8192] is 268.4 MB; each of the H200 capture's three large reduction "
                    "fusions moves 268.5-272.6 MB, one bf16 read, not the 537 MB each would read from a written f32 "
                    "copy"),
            "TPU": ("host_sync", "XLA:TPU fuses the converts too (convert_reduce_fusion reads the bf16 array once for "
                    "every statistic; the normalisation fusion widens and narrows in registers): no f32 copy is "
                    "written, and the two passes over the bf16 array, both needed (the statistics cover the whole "
                    "array before any output is written), run at 80-92% of the HBM roof. What is left to gain is "
                    "the step's blocking wait: 29% of the 1.9 ms step with the device idle, against 21% at most "
                    "from a pass that cannot be removed",
                    "untraced A/B (tests/profiles/tpu_v5e/untraced_ab.json): 1.80 ms per step blocking on every "
                    "step against 1.20 ms blocking once after the last: the wait costs 0.60 ms, 33% of the step"),
        },
    ),
    Workload(
        "widened_statistics",
        "bf16 data widened once to f32, then read back by dependent memory-bound reduction passes",
        "widening_converts",
    ),
    Workload(
        "collective_bound",
        "sharded step over 4 devices with tiny compute and large all-reduce/all-gather each step",
        "collectives",
        needs_devices=4,
    ),
    Workload(
        "collective_dominated",
        "data-parallel step on 8 devices: a small gradient per device, all-reduced with a large buffer inside a scan",
        "collectives",
        needs_devices=8,
    ),
    Workload(
        "healthy_data_parallel",
        "data-parallel step on 2 devices: a large matmul pass per device, a small gradient all-reduce",
        "optimal",
        needs_devices=2,
        # One thread per device: on a small CPU host, devices sharing one thread pool would finish their matmuls
        # at different times and wait for each other in the all-reduce, which is contention, not the workload.
        xla_flags="--xla_cpu_multi_thread_eigen=false",
    ),
    Workload(
        "straggler_input",
        "2 processes in sync (jax.distributed): one prepares its input on the host, the other waits in every all-reduce",
        "straggler_host",
        processes=2,
    ),
    Workload(
        "straggler_compute",
        "2 processes in sync (jax.distributed): one computes ~6x more per step, the other waits in every all-reduce",
        "straggler_host",
        processes=2,
    ),
    Workload(
        "small_steps",
        "correct jitted step on tiny arrays: step time is fixed per-step overhead, device mostly idle",
        "python_loop_of_calls",
    ),
]

WORKLOADS: dict[str, Workload] = {w.name: w for w in _ALL}

# Programs whose problem only an accelerator shows (host callbacks as send/recv, memory spaces, the MXU) and small
# real models. They run on a CPU too (scaled down, for the driver's own test), but the suite captures only WORKLOADS
# there; their TPU captures are committed under tests/profiles/tpu_v5e/ (see its README).
_ACCELERATOR = [
    Workload("host_callback_step", "a pure_callback inside the jitted step (TPU: send/recv to the host)", "callback_in_step"),
    Workload("host_transfers", "device_put of a 64 MiB numpy batch and np.asarray of the result every step",
             "memory_transfers"),
    Workload("host_offload", "three 64 MiB buffers in pinned_host memory copied to HBM and back inside each step",
             "memory_transfers"),
    Workload("pallas_small_blocks", "a Pallas f32 matmul with 128x128 blocks and a 128-wide contraction chunk",
             "low_kernel_efficiency"),
    Workload("f32_highest_matmul", "f32 MLP training step with matmuls at precision=HIGHEST (multi-pass on the MXU)",
             "low_kernel_efficiency",
             expected_by_platform={"TPU": (
                 "precision_highest_matmul", "the idiom catalogue names the cause of the low efficiency: float32 "
                 "matmuls at precision HIGHEST, which XLA:TPU runs as 6 bf16 passes; its finding leads with dropping "
                 "HIGHEST (the matmul_precision lever) and stands for the efficiency finding it explains",
                 "hand count: 1.10 TFLOP of matmuls per step (3 layers of 4096x4096 at batch 4096, forward and "
                 "backward) take 5.6 ms in one bf16 pass at the v5e's 197 TFLOP/s, 33.5 ms in the 6 passes HIGHEST "
                 "runs; the step takes 37.5 ms (10 steps in 0.3749 s, tests/profiles/tpu_v5e/manifest.json)")}),
    Workload("padded_heads", "attention with head_dim 72: every product's head dimension padded to 128",
             "low_kernel_efficiency",
             expected_by_platform={"TPU": (
                 "materialised_attention", "the attention is unfused: the Q·Kᵀ fusion writes the bf16[64,2048,2048] "
                 "scores (537 MB per call) for the softmax to read back once, 88% of op time at 69-79% of the HBM roof; at "
                 "72 FLOP/byte, under the v5e's ridge of 240, the padding to 128 costs nothing the score bytes do "
                 "not already set (it shows only as 4% of relayout copies): a fused attention kernel comes first, and "
                 "the finding names that attention (issue 61), not memory-bound ops in general",
                 "untraced A/B (tests/profiles/tpu_v5e/untraced_ab.json): head_dim 72 8.20 ms per step, 64 8.14 ms, "
                 "128 8.30 ms: 78% more head FLOPs cost 1.3%; hand count: the scores, bf16[64,2048,2048], are 537 MB "
                 "written and read back per call, 1.31 ms at 819 GB/s, against 0.35 ms for the Q·Kᵀ FLOPs at 128 "
                 "at 197 TFLOP/s")}),
    Workload("gpt_train", "GPT-style decoder training step (bf16, 4 layers, d_model 1024, seq 1024) in one jit, its "
             "attention written as einsum + softmax + einsum: the bf16[16,8,1024,1024] scores of each layer go to HBM "
             "and back in the forward and backward passes (34% of op time on a v5e)",
             "materialised_attention"),
    Workload("kv_decode", "batch-1 KV-cache decoding of 32 tokens under fori_loop: weights streamed once per token",
             "memory_bound"),
    Workload("kv_decode_b64", "kv_decode at batch 64: the same weight reads serve 64 sequences", "memory_bound"),
    Workload("conv_net_train", "ResNet-style conv net training step (bf16, NHWC, batch norm) in one jit", "optimal"),
    Workload("lstm_scan", "LSTM over 4,096 dependent time steps under lax.scan (batch 8, hidden 256)",
             "latency_bound",
             expected_by_platform={"TPU": (
                 "host_sync", "the loop of dependent steps is latency-bound (12% of its roofline), but the 2.7 ms "
                 "step blocks on its result every time, and that wait costs more than unrolling the loop recovers",
                 "untraced A/B (tests/profiles/tpu_v5e/untraced_ab.json): 2.65 ms per step blocking on every step "
                 "against 1.85 ms blocking once after the last (30%); jax.lax.scan(..., unroll=8) 2.63 ms (1%)")}),
    Workload("running_sum", "cumsum over 16,384-element rows: a sliding-window reduction far below the HBM roof",
             "memory_bound"),
    Workload("host_augment_loop", "unannotated loop: numpy augmentation, jnp.asarray and small programs per iteration",
             "host_preprocessing"),
    Workload("decode_streamed", "batch-1 decoding, layers under lax.scan: each layer's weights streamed into VMEM "
             "by async copies", "memory_bound"),
    Workload("decode_streamed_b64", "decode_streamed at batch 64: the same streamed weights serve 64 sequences",
             "memory_bound",
             expected_by_platform={"TPU": (
                 "unfused_data_movement", "the layer scan takes the 3.2 GB KV cache as its input and returns the "
                 "updated one as its output, so XLA copies the whole cache once per token (copy.38, 9.8 ms at 80% of "
                 "the HBM roof) and slices and re-inserts each layer's part around it: 84% of op time moves the "
                 "cache instead of reading it; carrying the cache in the scan's carry (updated in place) removes it",
                 "hand count: the cache is bf16[24,2,64,512,8,128], 3.22 GB; a copy per token moves 6.44 GB, 7.9 ms "
                 "at 819 GB/s, against the 0.60 GB of weights (24 layers of 12·1024² bf16) a token must read")}),
    Workload("gru_scan_train", "two-layer GRU trained over 1,024 dependent steps under lax.scan, weights in VMEM",
             "latency_bound"),
    Workload("flash_attention_train", "causal attention training step on JAX's Pallas flash-attention kernels",
             "optimal"),
    Workload("paged_attention_decode", "decode attention on JAX's Pallas paged-attention kernel over a paged KV cache",
             "memory_bound"),
    Workload("ragged_attention_serve", "mixed prefill and decode on JAX's Pallas ragged paged-attention kernel",
             "memory_bound",
             expected_by_platform={"TPU": (
                 "host_sync", "the four kernel calls reach at most 59% of the HBM roof (0.28 ms each; an upper bound: their "
                 "cost assumes the 134 MB of K and V pages full), but the 1.9 ms serving step blocks on its result every time and the device idles "
                 "40% of it between steps: the wait, not the kernel, is the larger loss",
                 "untraced A/B (tests/profiles/tpu_v5e/untraced_ab.json): 1.81 ms per step blocking on every step "
                 "against 1.16 ms blocking once after the last: the wait costs 0.65 ms, 36% of the step")}),
    Workload("megablox_moe", "MoE feed-forward layer on megablox grouped matmuls (Pallas), forward and backward",
             "optimal"),
    Workload("int8_matmul", "chained int8 x int8 -> int32 matrix products near the int8 MXU peak", "optimal"),
    Workload("pallas_rmsnorm", "a hand-written Pallas RMSNorm kernel without a cost estimate holds the step",
             "opaque_kernel"),
    Workload("decode_prefetched", "batch-1 decoding of a 200 MB model: weight tiles prefetched into VMEM by async "
             "copies", "memory_bound"),
    Workload("flash_attention_full", "non-causal attention training step on JAX's Pallas flash kernels, 256-wide "
             "blocks", "optimal"),
    Workload("lstm_batch64", "LSTM (hidden 1,024, batch 64) under lax.scan re-reading its 16 MB of weights from HBM "
             "every time step", "memory_bound"),
    Workload("megablox_small_tiles", "megablox grouped matmul with 128-wide tiles: far below the HBM roof, one "
             "short call per step", "memory_bound",
             expected_by_platform={"TPU": (
                 "memory_bound", "the kernel holds 99% of op time at 28% of the HBM roof: at the roof the same bytes "
                 "take 28% of its time, ~1.1 ms of the 2.25 ms step, more than the host's 25% wait between calls "
                 "(the second finding); its lever is gmm's tiling",
                 "untraced A/B (tests/profiles/tpu_v5e/untraced_ab.json): tiling (128, 128, 128) 2.18 ms per step, "
                 "(512, 512, 512) 0.88 ms: the tiling lever removes 60% of the step, more than the 25% wait")}),
    Workload("int8_weight_decode", "batch-1 decoding with int8 weights widened inside the products, prefetched "
             "into VMEM", "memory_bound"),
    Workload("near_hbm_limit", "compute-bound training step whose program holds ~86% of HBM (a resident table)",
             "memory_pressure"),
    Workload("remat_train", "MLP training step with jax.checkpoint on every block while its peak is a small part "
             "of memory: the backward pass recomputes what would fit", "needless_remat"),
]

ACCELERATOR_WORKLOADS: dict[str, Workload] = {w.name: w for w in _ACCELERATOR}


def load_module(name: str) -> ModuleType:
    """Import and return the module implementing workload ``name`` (bundled or accelerator)."""
    if name not in WORKLOADS and name not in ACCELERATOR_WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join([*WORKLOADS, *ACCELERATOR_WORKLOADS])}")
    return importlib.import_module(f"{__name__}.{name}")


def run_workload(name: str, steps: int | None = None) -> None:
    """Run workload ``name`` in this process for ``steps`` steps, unprofiled.

    Uses the module's ``DEFAULT_STEPS`` when ``steps`` is None. A multi-device
    workload uses however many devices this process has (see capture for
    forcing host devices).
    """
    module = load_module(name)
    module.run(module.DEFAULT_STEPS if steps is None else steps)


def __getattr__(attr: str):
    # Lazy re-export (importing capture eagerly would make
    # ``python -m xdiag.examples.capture`` warn about a pre-imported module).
    if attr == "capture_workload":
        from xdiag.examples.capture import capture_workload

        return capture_workload
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["ACCELERATOR_WORKLOADS", "WORKLOADS", "Workload", "WorkloadSkipped", "capture_workload", "load_module", "run_workload"]
