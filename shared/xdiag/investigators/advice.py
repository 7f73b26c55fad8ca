"""Fix advice that fits the platform (TPU, CUDA, ROCm, CPU) and framework (JAX, TensorFlow, PyTorch/XLA) the
profile came from, read from get_device_information, so a TensorFlow user is not told to use jax.jit and a
ROCm user is not sent to cuDNN."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Context:
    platform: str  # TPU | GPU | CPU
    vendor: str | None  # Google | NVIDIA | AMD
    framework: str | None  # JAX | TensorFlow | PyTorch/XLA

    @property
    def rocm(self) -> bool:
        return self.platform == "GPU" and self.vendor == "AMD"

    @property
    def cuda(self) -> bool:
        return self.platform == "GPU" and self.vendor != "AMD"


def context(device_information: dict[str, Any]) -> Context:
    return Context(
        platform=str(device_information.get("platform") or "CPU"),
        vendor=device_information.get("vendor"),
        framework=device_information.get("framework"),
    )


def compile_whole_step(ctx: Context) -> str:
    """How to get the step compiled and fused as one program, in the user's framework."""
    if ctx.framework == "TensorFlow":
        return ("compile the step with XLA: @tf.function(jit_compile=True) on the train step (or "
                "TF_XLA_FLAGS=--tf_xla_auto_jit=2 for auto-clustering), so the elementwise chains fuse into one kernel")
    if ctx.framework == "PyTorch/XLA":
        return "keep the step inside one traced graph (no .item()/prints between ops; torch_xla.compile around the step)"
    return ("put the whole step under one jax.jit so it is one compiled program that XLA fuses into a few kernels; "
            "avoid eager jnp calls in the loop; hoist Python-side loops into lax.scan/fori_loop")


def fuse_passes(ctx: Context) -> str:
    """How to move fewer bytes when a program makes several passes over the same data."""
    base = ("move fewer bytes: let one kernel do what several passes do (compute the reductions that read the same "
            "array together, avoid materialising intermediates, recompute cheap values instead of storing them)")
    if ctx.platform == "TPU":
        return base + "; where XLA will not fuse them, a Pallas kernel can read the array once from HBM"
    if ctx.platform == "GPU":
        return base + ("; where XLA will not fuse them, a Pallas/Triton kernel can read the array once"
                       + ("; on ROCm check that XLA's multi-output fusion is on (it is by default)" if ctx.rocm else ""))
    return base


def layout_fix(ctx: Context, next_to_convolution: bool) -> str:
    """Advice for layout-changing transposes/copies."""
    if next_to_convolution:
        if ctx.rocm:
            return ("the transposes convert the convolution's operands to and from the layout MIOpen runs in: keep "
                    "activations channels-last (NHWC / NDHWC) end to end (lax.conv_general_dilated with "
                    "dimension_numbers=('NHWC','HWIO','NHWC'), or the channels-last variant of your layer), and check "
                    "XLA's conv layout choice on ROCm (XLA_FLAGS=--xla_gpu_force_conv_nhwc); MIOpen's NHWC kernels "
                    "then read the data as it is")
        if ctx.cuda:
            return ("the transposes convert the convolution's operands to and from the layout cuDNN runs in: keep "
                    "activations channels-last (NHWC) in bf16/fp16 so cuDNN's Tensor Core kernels take them as they "
                    "are (XLA_FLAGS=--xla_gpu_force_conv_nhwc), and let XLA choose conv layouts")
        if ctx.platform == "TPU":
            return ("the transposes feed or follow a convolution: keep the feature dimension last (NHWC) so XLA:TPU "
                    "maps it onto the MXU without relayout, and batch/feature sizes multiples of 128")
        return "the transposes feed or follow a convolution: keep one layout (channels-last) on both sides of it"
    if ctx.framework == "TensorFlow":
        return ("keep one layout end to end: avoid tf.transpose between matmuls (use tf.einsum with the output order "
                "you consume, or transpose_a/transpose_b in tf.linalg.matmul) and compile with jit_compile=True")
    if ctx.framework == "PyTorch/XLA":
        return ("keep one layout end to end: avoid .permute()/.t()/.contiguous() between matmuls, use torch.einsum "
                "with the output order you consume")
    return ("keep one layout end to end: write einsum/dot dimension orders so no explicit transpose is needed "
            "(jnp.einsum with the output order you consume), avoid .T/jnp.transpose/swapaxes between matmuls, and let "
            "XLA pick layouts (no manual layout constraints)")


def transfer_fix(ctx: Context, peak_memory_gib: float | None, capacity_gib: float | None) -> str:
    """Levers for time spent moving data between memories."""
    fits = ""
    if peak_memory_gib is not None and capacity_gib:
        # TPU host offload parks device buffers in host memory; on a GPU the copies are the program's own inputs/outputs.
        fits = (f" (peak device memory is {peak_memory_gib:g} of {capacity_gib:g} GiB, so check whether the "
                + ("offloaded buffers fit once the others are freed)" if ctx.platform == "TPU" else
                   "copied arrays can stay on the device instead)"))
    if ctx.platform == "TPU":
        return ("move fewer bytes over the host link: keep the buffers that are offloaded on the device if they fit"
                + fits + ", offload fewer or smaller arrays (bf16, only what does not fit), offload less often, and "
                "give each offload a longer compute phase to overlap with (more work per transferred byte); in JAX "
                "the offload is chosen by memory kinds (pinned_host) and jax.checkpoint offload policies")
    if ctx.platform == "GPU":
        return ("move fewer bytes between host and device: keep tensors resident" + fits + ", use pinned host "
                "memory and asynchronous copies on a separate stream so they overlap compute, and batch small "
                "copies into few large ones")
    return "move fewer bytes between memories and keep hot arrays where they are used"


def kernel_efficiency_fix(ctx: Context, bound: str) -> str:
    """What to check when the dominant kernels run far below their roof."""
    if bound == "compute":
        if ctx.platform == "TPU":
            return ("make the matmuls fill the MXU: bf16 operands, dimensions multiples of 128 (256 on v6e/7x), larger "
                    "batch per core; for Pallas kernels, larger blocks and a deeper input pipeline so the MXU is not "
                    "waiting on DMAs")
        if ctx.rocm:
            return ("make the GEMMs/convolutions use the matrix cores: bf16/fp16 operands, dimensions multiples of 16-64, "
                    "and hipBLASLt tuning (HIPBLASLT_TUNING / XLA's autotuner at --xla_gpu_autotune_level=4)")
        if ctx.cuda:
            return ("make the GEMMs/convolutions use Tensor Cores: bf16/fp16 operands, dimensions multiples of 8-64, "
                    "cuBLAS/cuDNN autotuning (--xla_gpu_autotune_level=4), larger batch per GPU")
    if ctx.platform == "TPU":
        return ("raise achieved bandwidth: larger, lane-aligned arrays (last dim multiple of 128), and for Pallas "
                "kernels bigger blocks and deeper pipelining (pltpu.emit_pipeline / more buffers) so copies overlap")
    return "raise achieved bandwidth: larger contiguous arrays per kernel, fewer tiny kernels, aligned last dimensions"


def sync_fix(ctx: Context, wait_event: str | None, callbacks: bool) -> str:
    """How to stop the host blocking on the device, from the wait the profile shows."""
    parts = []
    if wait_event and "block_until_ready" in wait_event:
        parts.append("the host blocks on every call's result (block_until_ready): block once after the loop (or "
                     "every N steps) so the host queues the next call while the device runs; where the wait lasts "
                     "longer than the device work it waits for, the time goes to the runtime's completion path, "
                     "not the device")
    else:
        fetch = {"TensorFlow": ".numpy()/float() on tensors", "PyTorch/XLA": ".item()/.cpu()/print on tensors"}.get(
            ctx.framework or "", ".item()/float()/np.asarray()/jax.device_get on device arrays")
        parts.append(f"remove per-step {fetch}; accumulate metrics on the device and fetch them every N steps "
                     "(or asynchronously)")
    if callbacks:
        parts.append("replace jax.pure_callback / debug.callback in the hot path with jnp code")
    return "; ".join(parts)


def warm_up_fix(ctx: Context) -> str:
    """How to keep a one-time first-call cost out of the measured steps."""
    if ctx.framework == "TensorFlow":
        return ("run one warm-up step before the measured loop (and before starting the profiler), so tf.function "
                "tracing, autotuning and allocation are paid outside it")
    return ("run one warm-up call before the measured loop (and before starting the profiler), or compile ahead of "
            "time (jax.jit(f).lower(*args).compile()); a persistent compilation cache "
            "(jax_compilation_cache_dir) keeps compilation out of later runs")
