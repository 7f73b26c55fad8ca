"""What kind of work is this op? The category of an XLA op from its HLO instruction, or of a kernel from its name
(matmul, convolution, collective, async copy, prefetch, data movement, …), and the opcode sets those are read from."""

from __future__ import annotations

from xdiag.analysis.hlo_cost import is_gemm_call
from xdiag.profile.space import HloInstruction, HloModule

COLLECTIVE_OPCODES = {
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
    "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done", "collective-permute-start",
    "collective-permute-done", "send", "recv", "send-done", "recv-done", "ragged-all-to-all",
}
DATA_MOVEMENT_OPCODES = {
    "copy", "transpose", "reshape", "broadcast", "slice", "concatenate", "pad", "dynamic-slice",
    "dynamic-update-slice", "gather", "scatter", "copy-start", "copy-done", "reverse", "iota",
}
ASYNC_COPY_OPCODES = {"copy-start", "copy-done"}
"""Copies between memory spaces: to or from the host (offload) a transfer, to or from on-chip memory a prefetch."""
TRANSFER_OP_CATEGORIES = ("async_copy", "memcpy")
"""Op categories that only move data between memory spaces (host offload, H2D/D2H copies)."""
COPY_OP_CATEGORIES = (*TRANSFER_OP_CATEGORIES, "prefetch")
"""Op categories whose events are a copy's issue or its wait, not the copy: no rate or cost of their own."""
STRUCTURAL_OPCODES = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


HOST_MEMORY_SPACE = 5
"""XLA's memory space of host memory (`S(5)` in a layout: pinned host buffers, host offload)."""


def _copy_spaces(instruction: HloInstruction, module: HloModule | None) -> set[int]:
    """The memory spaces an async copy reads and writes: a copy-start's result holds (destination, source, context);
    a copy-done's are its copy-start's."""
    if instruction.opcode == "copy-done" and module is not None and instruction.operands:
        found = module.find(instruction.operands[0])
        if found is not None and found[1].opcode == "copy-start":
            instruction = found[1]
    return set(instruction.tuple_memory_spaces[:2])


def _async_copy_category(instruction: HloInstruction, module: HloModule | None) -> str:
    """A copy to or from host memory moves data over the host link (async_copy, a transfer); one between device
    memory and the on-chip memory (e.g. TPU `S(1)`) is the compiler's prefetch, overlapped with compute; one inside
    device memory is data movement. Without memory spaces (files written before they were kept): async_copy."""
    spaces = _copy_spaces(instruction, module)
    if not spaces or HOST_MEMORY_SPACE in spaces:
        return "async_copy"
    return "prefetch" if spaces - {0} else "data_movement"


def categorize(instruction: HloInstruction | None, module: HloModule | None, name: str) -> str:
    """The op's category: matmul, convolution, collective, async_copy (to or from host memory), prefetch (to or
    from on-chip memory), reduction, convert, data_movement, elementwise, custom_call, host_callback (Python
    callbacks and host send/recv), control_flow, memcpy or other."""
    if instruction is None:
        return _category_from_name(name)
    opcode = instruction.opcode
    if instruction.is_host_transfer:
        # send/recv with the host (how a TPU runs a host callback): the device waits for the host, not a peer.
        return "host_callback"
    if opcode in COLLECTIVE_OPCODES:
        return "collective"
    if opcode in ASYNC_COPY_OPCODES:
        return _async_copy_category(instruction, module)
    if opcode == "custom-call":
        target = instruction.custom_call_target.lower()
        if "callback" in target or "callback" in name.lower():
            return "host_callback"
        if is_gemm_call(instruction):
            return "matmul"
        if "conv" in target:
            return "convolution"
        return "custom_call"
    if opcode == "fusion" and module is not None:
        fused = set(module.fused_opcodes.get(instruction.name, [])) - STRUCTURAL_OPCODES
        if fused & COLLECTIVE_OPCODES:
            return "collective"
        if "dot" in fused:
            return "matmul"
        if "convolution" in fused:
            called = module.computations.get(instruction.called[0]) if instruction.called else None
            convolutions = [i for i in called.instructions if i.opcode == "convolution"] if called else []
            # XLA:TPU fuses matrix products as convolutions whose windows never slide: a matmul to the reader.
            return ("matmul" if convolutions and all(c.conv_is_matrix_product for c in convolutions)
                    else "convolution")
        if fused & {"reduce", "reduce-window"}:
            return "reduction"
        if fused and fused <= {"convert"}:
            return "convert"
        if fused and fused <= DATA_MOVEMENT_OPCODES:
            return "data_movement"
        if "custom-call" in fused:
            return "custom_call"
        return "elementwise"
    if opcode == "dot":
        return "matmul"
    if opcode == "convolution":
        return "matmul" if instruction.conv_is_matrix_product else "convolution"
    if opcode in ("reduce", "reduce-window", "sort"):
        return "reduction"
    if opcode == "convert":
        return "convert"
    if opcode in DATA_MOVEMENT_OPCODES:
        return "data_movement"
    if opcode in ("while", "conditional", "call"):
        return "control_flow"
    if opcode in STRUCTURAL_OPCODES:
        return "other"
    return "elementwise"


_ELEMENTWISE_KERNELS = ("eigenmetakernel", "tensorflow::functor::", "elementwise_kernel", "vectorized_elementwise")
"""Kernels a framework launches one op at a time without a compiler (TensorFlow's Eigen kernels, PyTorch eager)."""


_CONVOLUTION_KERNELS = ("cudnn::detail::dgrad", "cudnn::detail::wgrad", "implicit_convolve", "conv2d_grouped_direct",
                        "convolve_sgemm", "_fprop_", "_dgrad_", "_wgrad_", "miopensp3asmconv", "naive_conv")
"""cuDNN/MIOpen convolution kernels (forward, data and weight gradients) as eager frameworks launch them."""
_KERNEL_NAME_CATEGORIES = (
    ("collective", ("all_reduce", "all_gather", "allgather", "reduce_scatter", "alltoall", "all_to_all")),
    ("convolution", _CONVOLUTION_KERNELS + ("scudnn", "winograd", "_alg0_engine", "_alg1_engine")),
    ("reduction", ("reduce_kernel", "bn_fw_", "bn_bw_", "batch_norm", "layer_norm", "rms_norm", "rmsnorm", "softmax",
                   "welford", "triton_red_", "triton_per_")),
    ("data_movement", ("catarraybatchedcopy", "batched_transpose", "nchwtonhwc", "nhwctonchw", "indexselect",
                       "index_select", "gather_kernel", "scatter_kernel")),
    ("elementwise", ("multi_tensor_apply", "triton_poi_")),
    ("matmul", ("nvjet", "fmha", "flash_fwd", "flash_bwd", "flash_attn", "triton_tem_")),
)
"""Kernels an eager framework (PyTorch, its libraries and Inductor's Triton kernels) launches, by what their names
say they do; checked in this order, before the generic rules (a split-K GEMM's reduce is a reduction)."""


def _category_from_name(name: str) -> str:
    base = name.lower().lstrip("%")
    if base.startswith(("memcpy", "memset")):
        return "memcpy"
    if base in ("data formatting", "data movement"):
        return "data_movement"
    if base.startswith(tuple(ASYNC_COPY_OPCODES)):
        return "async_copy"
    if any(base.startswith(op) for op in COLLECTIVE_OPCODES) or "all-reduce" in base or "allreduce" in base or \
            base.startswith(("nccl", "rccl")):  # NCCL/RCCL kernels: ncclDevKernel_AllGather_RING_LL, ncclKernel_…
        return "collective"
    if "callback" in base:
        return "host_callback"
    for category, parts in _KERNEL_NAME_CATEGORIES:
        if any(part in base for part in parts):
            return category
    if base.startswith(("dot", "gemm", "cublas", "cijk_", "bmm_")) or any(k in base for k in ("matmul", "gemm", "xmma", "cutlass", "wgmma")):
        return "matmul"  # cijk_: Tensile/hipBLASLt GEMMs (ROCm); bmm_: cuBLASLt batched GEMMs
    if base.startswith(("convolution", "conv")):
        return "convolution"
    if base.startswith(("reduce", "reduction")):
        return "reduction"
    if base.startswith("convert"):
        return "convert"
    if base.startswith(tuple(DATA_MOVEMENT_OPCODES)):
        return "data_movement"
    if base.startswith("custom-call"):
        return "custom_call"
    if "fusion" in base or any(k in base for k in _ELEMENTWISE_KERNELS):
        return "elementwise"
    return "other"
