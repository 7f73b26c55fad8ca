"""What does this runtime call its host events? The names of the host side's compiles, blocking syncs, host
callbacks, transfers and launches, in XLA's words (JAX, PjRt, TensorFlow) and in PyTorch's (Kineto traces)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from xdiag.profile.trace_json import BLOCKING_COPY_STAT, FIRST_LAUNCH_STAT

COMPILE_EVENT = re.compile(
    r"backend_compile|lower_sharding_computation|lower_jaxpr_to_stablehlo|jit_compile|_cached_compilation|"
    r"XlaCompile|compile_or_get_cached|PjitFunction::Compile|PjRtClient::Compile|Compile\b"
)
SYNC_EVENT = re.compile(
    r"np\.asarray|device_get|block_until_ready|__array__|\b_value\b|copy_to_host|TransferFromDevice|"
    r"CopyToHost|BlockHostUntilReady|PjRtBuffer::ToLiteral|ToLiteralSync|\.item\b|__float__|__int__"
)
CALLBACK_EVENT = re.compile(
    r"pure_callback|io_callback|debug_callback|_wrapped_callback|\bhost_callback\b|xla_python_\w*callback|PyCallback"
)
"""Python running as a host callback from compiled code (not e.g. the runtime's 'rendezvous callback', nor a Python
tracer event of a file whose name contains one of these words, e.g. `$host_callback_step.py:46 step`)."""
HOST_TRANSFER_EVENT = re.compile(
    r"\bdevice_put\b|DevicePut|BufferFromHostBuffer|Linearize|H2D Dispatch|D2H Dispatch|TransferToDevice|"
    r"TransferFromDevice|TransferToInfeed|TransferFromOutfeed|DmaBuffer"
)
"""The host's side of host<->device copies (jax.device_put, the TPU runtime re-tiling a buffer for the link,
Linearize / Delinearize and their transposes, the DMAs it issues, and mapping host buffers for DMA, e.g. pinned
host memory an offloading program reads): a plain transfer leaves nothing on the device's op lines."""
DEVICE_TO_HOST_COPY_EVENT = re.compile(
    r"TransferFromDevice|D2H Dispatch|Delinearize|TransferFromOutfeed|CopyToHost|MemcpyDtoH|\bDtoH\b"
)
"""The host's side of device->host copies only (a read of a result: its DMA, and the TPU runtime's re-tiling of it
for the host)."""
COMPLETION_SUFFIX = "=>Done"
"""The TPU runtime marks the completion of what it issued (`X=>IssueEvent`) with a short `X=>IssueEvent=>Done`
event: the DMA itself runs between the two, with no event of its own."""
DISPATCH_EVENT = re.compile(r"^PjitFunction\(|^PmapFunction\(|ExecuteHelper|LoadedExecutable::Execute\b|^ExecutorState::Process$")
"""Launching work: a jitted call or program execution (JAX, PjRt), or TensorFlow's executor running a graph's ops
one by one (each op launches its own kernel)."""
EXECUTE_EVENT = re.compile(r"LoadedExecutable::Execute(Helper\w*|Sharded\w*)?$|LoadedExecutable::Execute \(")
"""One event per compiled program launched: counts dispatches without the nesting of PjitFunction events."""
JITTED_CALL_EVENT = re.compile(r"^PjitFunction\(|^PmapFunction\(")
"""One Python call of a jitted function, named after it: its first call is where warm-up shows."""


@dataclass(frozen=True)
class HostVocabulary:
    """What a host's events are called in one runtime's words: a blocking sync, a launch (its time), a launch (one
    counted per program or kernel)."""

    sync: re.Pattern
    dispatch: re.Pattern
    execute: re.Pattern
    sync_stat: str | None = None
    """A stat that marks further events as blocking syncs, whatever their name (PyTorch: async copies that block)."""
    one_launch_on_several_threads: bool = True
    """An SPMD launch shows on the calling thread and again on each device's thread (PjRt); PyTorch's autograd
    thread launches its own kernels, each once."""
    runtime_call: re.Pattern | None = None
    """The GPU runtime's API calls (CUDA/HIP: launches, allocations, stream and event calls), each as quick as the
    last at steady state: one far longer than its call's median is a one-time cost (loading a kernel's module on
    first use, creating the context, a stream or a library handle, growing the allocator), not per-call overhead.
    Its syncs and copies are left out: how long they wait is the device's work, not the call's."""
    first_launch_stat: str | None = None
    """A stat on the launch that ran its kernel's first run: only there can a slow launch be loading the module."""


XLA_HOST = HostVocabulary(SYNC_EVENT, DISPATCH_EVENT, EXECUTE_EVENT)
_CUDA_LAUNCH = re.compile(
    r"^(cuda|hip|cu)(Ext)?(Module)?LaunchKernel(ExC)?(_v2|_ptsz)?$|^(cuda|hip)LaunchCooperativeKernel\w*$|"
    r"^(cuda|hip|cu)GraphLaunch$"
)
PYTORCH_HOST = HostVocabulary(
    # .item()/.cpu()/print of a tensor wait in aten::_local_scalar_dense or a blocking copy; explicit waits are
    # the runtime's synchronize calls. cudaMemcpyAsync is left out: it blocks only on pageable memory.
    sync=re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^(cuda|hip)Memcpy$|^hipMemcpyWithStream$|"
                    r"^aten::_local_scalar_dense$"),
    dispatch=_CUDA_LAUNCH,
    execute=_CUDA_LAUNCH,
    sync_stat=BLOCKING_COPY_STAT,
    one_launch_on_several_threads=False,
    runtime_call=re.compile(r"^(cuda|hip|cu)[A-Z]\w*$"),
    first_launch_stat=FIRST_LAUNCH_STAT,
)
"""PyTorch eager on CUDA/ROCm (Kineto traces): every kernel is its own launch, every sync a runtime call."""
