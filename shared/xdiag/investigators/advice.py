"""Fix advice that fits the platform (TPU, CUDA, ROCm, CPU) and framework (JAX, TensorFlow, PyTorch/XLA) the
profile came from, read from get_device_information, so a TensorFlow user is not told to use jax.jit and a
ROCm user is not sent to cuDNN."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Context:
    platform: str  # TPU | GPU | CPU
    vendor: str | None  # Google | NVIDIA | AMD
    framework: str | None  # JAX | TensorFlow | PyTorch/XLA | PyTorch (eager, from a Kineto trace)

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
    if ctx.framework == "PyTorch":
        return ("torch.compile the model (or the whole train step) so its elementwise chains fuse into few kernels, and "
                "capture the step in a CUDA graph (torch.compile(mode=\"reduce-overhead\"), or torch.cuda.graphs) so it "
                "launches once instead of once per kernel")
    return ("put the whole step under one jax.jit so it is one compiled program that XLA fuses into a few kernels; "
            "avoid eager jnp calls in the loop; hoist Python-side loops into lax.scan/fori_loop")


def fuse_passes(ctx: Context, product_result: bool = False) -> str:
    """How to move fewer bytes when a program makes several passes over the same data; product_result: the array
    written and read back is a matrix product's result (attention scores)."""
    base = ("move fewer bytes: let one kernel do what several passes do (compute the reductions that read the same "
            "array together, avoid materialising intermediates, recompute cheap values instead of storing them)")
    if product_result:
        base += ("; a matrix product's result that the next op reads once (attention scores before their softmax) "
                 "need never reach memory: a fused kernel computes both, block by block (jax.nn.dot_product_attention, "
                 "a flash-attention kernel)")
    if ctx.platform == "TPU":
        return base + "; where XLA will not fuse them, a Pallas kernel can read the array once from HBM"
    if ctx.platform == "GPU":
        return base + ("; where XLA will not fuse them, a Pallas/Triton kernel can read the array once"
                       + ("; on ROCm check that XLA's multi-output fusion is on (it is by default)" if ctx.rocm else ""))
    return base


def more_work_per_byte(ctx: Context, bandwidth_percent: float | None = None) -> str:
    """What helps memory-bound work that re-reads its data: more arithmetic per byte read, or fewer bytes; and where
    it is not at the roof (bandwidth_percent: its share of the peak, below AT_ROOF_MIN_PERCENT), a faster kernel too."""
    text = ("do more work per byte read: serve more rows per weight read (a larger batch, continuous batching of "
            "requests in decoding), verify several tokens per weight read (speculative decoding), or read fewer bytes "
            "(int8/fp8 weights and KV cache)")
    bus = "the HBM bus" if ctx.platform == "TPU" else "the memory bus"
    if bandwidth_percent is not None:
        return text + (f"; at {bandwidth_percent:g}% of the bandwidth a faster kernel can gain too: larger blocks per "
                       f"copy and a deeper pipeline, so {bus} stays busy")
    return text + f"; at the roof faster kernels cannot help: {bus} is already near full"


def below_roof_fix(ctx: Context, ops: list[dict], top: dict) -> str:
    """What helps memory-bound ops that leave most of the bandwidth unused, from what those ops are (`ops`: the
    memory-bound rows; `top`: the one far below the roof that holds the most time): the library kernel's own
    parameters where one of JAX's Pallas kernels holds the time, a scan's lowering only where a cumulative sum or
    reduce-window is among them, else the kernel or the algorithm."""
    kernel = library_kernel_fix(top)
    if kernel:
        return kernel
    other = []
    if any(_is_windowed_scan(o) for o in ops):
        other.append("a cumulative sum or scan that XLA lowers to a sliding-window reduce-window: "
                     "jax.lax.associative_scan or a blocked scan")
    if any(o.get("category") == "reduction" for o in ops):
        other.append("a reduction along the minor axis instead of the major one")
    text = ("the kernel, not the bytes, sets the time: use another algorithm or kernel for these ops"
            + (f" ({'; '.join(other)})" if other else ""))
    if ctx.platform in ("TPU", "GPU"):
        return text + "; where XLA has no better lowering, a Pallas kernel that streams the array once"
    return text


def below_roof_names_a_change(ops: list[dict], top: dict) -> bool:
    """Whether below_roof_fix names a change to make (a library kernel's parameters, a scan's other lowering) rather
    than only a kind of remedy (another algorithm or kernel)."""
    return bool(library_kernel_fix(top)) or any(_is_windowed_scan(o) for o in ops)


WINDOWED_SCAN_MARKS = ("reduce_window", "reduce-window", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
"""What names a cumulative op that XLA lowers to a sliding-window reduce-window (the framework op or the opcode)."""


def _is_windowed_scan(op: dict) -> bool:
    names = f"{op.get('opcode') or ''} {op.get('framework_op') or ''}".lower()
    return any(mark in names for mark in WINDOWED_SCAN_MARKS)


def library_kernel_fix(op: dict) -> str | None:
    """The tuning parameters of the JAX Pallas TPU kernel `op` (a row of get_hlo_op_profile) runs, by their names in
    jax.experimental.pallas.ops.tpu, with what the operands say of their current size; None for other ops."""
    names = f"{op.get('op') or ''} {op.get('framework_op') or ''}".lower()
    shapes = [str(s) for s in op.get("operand_shapes") or []]
    if "ragged_paged_attention" in names:
        return ("the kernel is JAX's ragged paged attention (jax.experimental.pallas.ops.tpu.ragged_paged_attention): "
                "each grid step copies num_kv_pages_per_block KV pages from HBM for num_queries_per_block query "
                "tokens; larger values of both (within vmem_limit_bytes) make each copy longer and the pipeline "
                "deeper, and larger KV-cache pages make each page's DMA larger")
    if "paged_attention" in names:
        page = _page_bytes(shapes)
        return ("the kernel is JAX's paged attention (jax.experimental.pallas.ops.tpu.paged_attention."
                "paged_attention): each grid step copies pages_per_compute_block KV pages from HBM"
                + (f", and each page is {page} per KV head" if page else "")
                + ": raise pages_per_compute_block (and the KV cache's page size) so each step moves more bytes "
                "per copy and the copies overlap the compute")
    if any(mark in names for mark in ("gmm", "tgmm")) and "pallas_call" in names:
        return ("the kernel is megablox's grouped matmul (jax.experimental.pallas.ops.tpu.megablox gmm / tgmm): its "
                "tiling=(tm, tk, tn) argument (default (128, 128, 128)) sets the block each grid step multiplies; "
                "larger tiles that divide the problem (tk and tn multiples of 128; tm of 8) re-read each operand "
                "fewer times and keep the MXU fed")
    if "flash_attention" in names or "flash_mha" in names:
        return ("the kernel is JAX's Pallas flash attention (jax.experimental.pallas.ops.tpu.flash_attention): its "
                "block_sizes=BlockSizes(block_q=..., block_k_major=..., block_k=..., block_b=...) set the tiles; "
                "larger block_q and block_k_major (the backward pass has its own *_dkv and *_dq sizes) re-read K and "
                "V fewer times")
    return None


def _page_bytes(shapes: list[str]) -> str:
    """The bytes one KV page holds per KV head, from the K/V pages operand [KV heads, pages, page size, head dim]:
    the kernel's largest 4-D operand (the query is [batch, heads, 1, head dim])."""
    sizes = {"bf16": 2, "f16": 2, "f32": 4, "s8": 1, "f8e4m3fn": 1, "f8e5m2": 1}
    pages = []
    for shape in shapes:
        match = re.match(r"(\w+)\[(\d+),(\d+),(\d+),(\d+)\]", shape.replace(" ", ""))
        if match and match.group(1) in sizes:
            dims = [int(match.group(i)) for i in range(2, 6)]
            pages.append((dims[0] * dims[1] * dims[2] * dims[3], match.group(1), dims[2], dims[3]))
    if not pages:
        return ""
    _, dtype, page, dim = max(pages)
    return f"{page} tokens x {dim} x {dtype} = {page * dim * sizes[dtype] / 1024:g} KiB"


def precision_fix(ctx: Context, precision: str) -> str:
    """Matmuls that ask for more than the default precision run several passes on 16-bit matrix units."""
    passes = {"HIGHEST": "6", "HIGH": "3"}.get(precision, "several")
    if ctx.platform == "TPU":
        where = f"f32 matmuls at precision={precision} run {passes} bf16 passes on the MXU"
    else:
        where = f"f32 matmuls at precision={precision} do not use the 16-bit tensor cores at full rate"
    return (where + ": use the default precision or bf16 operands where the accuracy allows (precision=DEFAULT, "
            "jax.default_matmul_precision('bfloat16')" + (", or HIGH for 3 passes" if ctx.platform == "TPU" else "")
            + "), keeping f32 accumulation")


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
    if ctx.framework == "PyTorch":
        return ("move fewer bytes between host and device: keep tensors resident on the GPU" + fits + "; where a batch "
                "must cross, use a DataLoader with pin_memory=True and tensor.to(device, non_blocking=True), so the "
                "copy runs from pinned memory and overlaps compute instead of blocking")
    if ctx.platform == "GPU":
        return ("move fewer bytes between host and device: keep tensors resident" + fits + ", use pinned host "
                "memory and asynchronous copies on a separate stream so they overlap compute, and batch small "
                "copies into few large ones")
    return "move fewer bytes between memories and keep hot arrays where they are used"


def host_transfer_fix(ctx: Context) -> str:
    """Levers for per-step copies between host and device memory (device_put, reading results back)."""
    if ctx.framework == "PyTorch/XLA":
        keep = "keep tensors on the XLA device between steps (no .cpu()/.numpy() per step)"
    elif ctx.framework == "TensorFlow":
        keep = "keep tensors on the device between steps and feed batches through tf.data with prefetch to the device"
    else:
        keep = ("keep arrays on the device between steps (jax.device_put once, not every step; no np.asarray of "
                "large results per step)")
    return (keep + "; overlap what must move with compute: put the next batch on the device while this step runs "
            "(double buffering, prefetch to device), read back only what is logged and in a small dtype, every N "
            "steps; a blocking read of a large array waits for the whole copy (and on a TPU for the host re-tiling it)")


def kernel_efficiency_fix(ctx: Context, bound: str, kinds: tuple[str, ...] = ("matmul",)) -> str:
    """What to check when the dominant kernels run far below their roof; `kinds`: their op categories (matmul,
    convolution, reduction, elementwise, ...), the matrix-unit levers only where a matmul or convolution is one."""
    if bound == "compute" and not {"matmul", "convolution"} & set(kinds):
        unit = {"TPU": "the vector units (VPU), not the MXU", "GPU": "the CUDA cores, not the Tensor Cores"}.get(
            ctx.platform, "the vector units")
        return (f"these ops are no matmuls ({', '.join(k.replace('_', ' ') for k in kinds) or 'other ops'}): they "
                f"run on {unit}, at a small fraction of the peak their roofline is drawn against, so the lever is "
                "less work per element: read what they compute at their source line and write it with fewer element "
                "operations (a lookup instead of a compare with every value, a sum over a window instead of a "
                "broadcast of all pairs), or as a matmul")
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
        return ("raise achieved bandwidth: larger, lane-aligned arrays (last dim multiple of 128); for Pallas "
                "kernels, bigger blocks and deeper pipelining (pltpu.emit_pipeline / more buffers) so copies overlap")
    return "raise achieved bandwidth: larger contiguous arrays per kernel, fewer tiny kernels, aligned last dimensions"


def sync_fix(ctx: Context, wait_event: str | None, callbacks: bool) -> str:
    """How to stop the host blocking on the device, from the wait the profile shows."""
    parts = []
    if wait_event and re.search(r"Memcpy\w*Async", wait_event):
        parts.append(f"the waits are copies from or to pageable host memory ({wait_event}), which the runtime performs "
                     "synchronously: copy through pinned buffers (tensor.pin_memory(), DataLoader(pin_memory=True)) "
                     "with non_blocking=True, and read results on the host only when they are needed")
    elif wait_event and "block_until_ready" in wait_event:
        parts.append("the host blocks on every call's result (block_until_ready): block once after the loop (or "
                     "every N steps) so the host queues the next call while the device runs; where the wait lasts "
                     "longer than the device work it waits for, the time goes to the runtime's completion path, "
                     "not the device")
    else:
        fetch = {"TensorFlow": ".numpy()/float() on tensors", "PyTorch/XLA": ".item()/.cpu()/print on tensors",
                 "PyTorch": ".item()/.cpu()/print on tensors and torch.cuda.synchronize() calls (with "
                            "torch.cuda.set_sync_debug_mode(\"warn\") naming each hidden one)"}.get(
            ctx.framework or "", ".item()/float()/np.asarray()/jax.device_get on device arrays")
        parts.append(f"remove per-step {fetch}; accumulate metrics on the device and fetch them every N steps "
                     "(or asynchronously)")
    if callbacks:
        parts.append("replace jax.pure_callback / debug.callback in the hot path with jnp code")
    return "; ".join(parts)


def warm_up_fix(ctx: Context) -> str:
    """How to keep a one-time first-call cost out of the measured steps."""
    if ctx.framework == "PyTorch":
        return ("run warm-up iterations before the measured ones (torch.profiler.schedule(wait=1, warmup=2, active=N)), "
                "so CUDA context creation, lazy module loading, cuDNN autotuning and allocator growth are paid "
                "outside them")
    if ctx.framework == "TensorFlow":
        return ("run one warm-up step before the measured loop (and before starting the profiler), so tf.function "
                "tracing, autotuning and allocation are paid outside it")
    return ("run one warm-up call before the measured loop (and before starting the profiler), or compile ahead of "
            "time (jax.jit(f).lower(*args).compile()); a persistent compilation cache "
            "(jax_compilation_cache_dir) keeps compilation out of later runs")


def more_work_per_step(ctx: Context) -> str:
    """When fixed per-step costs dominate a small step."""
    if ctx.framework == "PyTorch":
        return ("Give each step more work: a larger batch per step, or capture the step in a CUDA graph "
                "(torch.compile(mode=\"reduce-overhead\")) so its fixed launch cost is paid once; keep the data on the "
                "GPU between steps.")
    return ("Give each step more work: a larger batch per step, several micro-steps inside one jitted function "
            "(jax.lax.scan or fori_loop over steps), or fewer, larger devices; keep the data on the device between steps.")


def static_shapes(ctx: Context) -> str:
    """When programs are compiled again inside the measured steps."""
    if ctx.framework == "PyTorch":
        return ("Keep shapes static for torch.compile: pad or bucket variable-length batches to a few sizes, mark "
                "dimensions that do vary with torch._dynamo.mark_dynamic (or dynamic=True); TORCH_LOGS=recompiles "
                "says which guard failed.")
    return ("Keep shapes static: pad or bucket variable-length batches to a few sizes, mark true constants with "
            "static_argnums, avoid passing changing Python scalars; check with jax.log_compiles / "
            "jax.explain_cache_misses which argument triggers it.")


def feed_input(ctx: Context) -> str:
    """When the device waits for host work (input, Python) between its work."""
    if ctx.framework == "PyTorch":
        return ("Move input work off the critical path: DataLoader(num_workers=N, pin_memory=True, "
                "persistent_workers=True, prefetch_factor=2+), copies with non_blocking=True; where the host is "
                "busy launching eager ops, torch.compile the model and capture the step in a CUDA graph; "
                "optimizer.zero_grad(set_to_none=True) and fused optimizers (foreach/fused=True) cut per-parameter "
                "host work.")
    return ("Move input work off the critical path: prefetch and preprocess batches in background workers "
            "(tf.data / grain / a DataLoader with workers and prefetch), put batches on the device ahead of use "
            "(jax.device_put of the next batch while this one runs), and move per-step numpy work into the jitted step.")


def communicate_less(ctx: Context) -> str:
    """The general levers when collectives are not hidden behind compute."""
    if ctx.framework == "PyTorch":
        return (f"communicate less or overlap it: larger per-{'GPU' if ctx.platform == 'GPU' else 'rank'} batch "
                "(more compute per byte sent), DDP with "
                "gradient buckets sized to overlap the backward pass (bucket_cap_mb) and "
                "gradient_as_bucket_view=True, FSDP/ZeRO sharding instead of replication, bf16 gradient "
                "all-reduce (a DDP comm hook), and gradient accumulation with no_sync() between all-reduces")
    return ("communicate less or overlap it: larger per-device batch (more compute per byte sent), shard "
            "parameters/optimizer state (FSDP/ZeRO) instead of replicating, all-reduce gradients in bf16, and let "
            "XLA overlap collectives with compute (async collectives, latency-hiding scheduler)")


@dataclass(frozen=True)
class PeakHolders:
    """What holds a memory peak, as the profile says, so that only the levers that apply are advised."""

    values_first: bool  # values the step computes (activations, gradients) hold more than its arguments
    arguments_donated: bool | None  # every large argument is aliased to an output (donated); None: not recorded
    devices: int | None  # devices the job runs on; None: not recorded
    dot_outputs_hold_values: bool = False  # matmul outputs are most of the computed values at the peak
    largest_argument: str = ""  # "params['w'], 12.6 GiB": its path in the arguments' pytree
    largest_argument_dtype: str = ""  # its element type ('f32', 'bf16'), where the buffer's shape says it


NARROW_DTYPES = frozenset({"bf16", "f16", "s8", "u8", "s4", "u4", "f8e4m3fn", "f8e5m2", "pred"})
"""Element types a narrower dtype cannot shrink much further (16 bits or fewer)."""


def cut_peak_memory(ctx: Context, held: PeakHolders) -> str:
    """When peak memory is near capacity: the levers for what holds the peak, first the larger part, each only
    where the profile says it applies: donation where the HLO does not alias the arguments already, sharding where
    the job has more than one device, a rematerialisation policy that does not save the matmul outputs that hold
    the peak."""
    if ctx.framework == "PyTorch":
        values = ("checkpoint the activations (torch.utils.checkpoint on the blocks that produce them) or run smaller "
                  "micro-batches and accumulate their gradients")
        arguments = ("shard parameters and optimizer state (FSDP), and free gradients between steps "
                     "(optimizer.zero_grad(set_to_none=True))")
    else:
        if held.dot_outputs_hold_values:
            # A policy that saves dot outputs would keep the very buffers that hold this peak.
            remat = ("jax.checkpoint on the blocks that produce them, with a policy that saves no matmul outputs "
                     "(jax.checkpoint_policies.nothing_saveable): matmul outputs hold most of these values")
        else:
            remat = ("jax.checkpoint on the blocks that produce them, or a policy such as "
                     "jax.checkpoint_policies.dots_with_no_batch_dims_saveable")
        values = (f"rematerialise them ({remat}) or run smaller micro-batches and accumulate their gradients "
                  "(k micro-batches hold about k times fewer activation bytes)")
        levers = []
        if held.arguments_donated is not True:
            levers.append("donate the arguments the step replaces (jax.jit(..., donate_argnums=...)), so the updated "
                          "weights and optimizer state reuse their buffers")
        if held.devices is None or held.devices > 1:
            levers.append("shard them over the devices" + (f" (the job has {held.devices})" if held.devices else ""))
        largest = f" ({held.largest_argument})" if held.largest_argument else ""
        if held.largest_argument_dtype not in NARROW_DTYPES:
            levers.append(f"keep the largest argument{largest} in a narrower dtype where its precision allows")
        if ctx.platform == "TPU":
            levers.append("keep what the step reads rarely (optimizer state) in host memory (memory_kind='pinned_host')")
        excluded = ([("donating", "the arguments are already donated (the HLO aliases them to its outputs)")]
                    if held.arguments_donated else []) + (
                   [("sharding", "the job runs on one device")] if held.devices == 1 else [])
        arguments = ", ".join(levers[:-1]) + (f" or {levers[-1]}" if len(levers) > 1 else levers[-1])
        if excluded:
            arguments += (f"; {' and '.join(n for n, _ in excluded)} {'does' if len(excluded) == 1 else 'do'} not "
                          f"apply here: {' and '.join(w for _, w in excluded)}")
    first, then = (values, arguments) if held.values_first else (arguments, values)
    return f"Cut the peak where it is held: {first}; then {then}."
