"""Which host-plane events XProf's converters can use, for the private copy they read (`xdiag.profile.slim`).

XProf's converters read a host event through its stats (step ids, context ids that link threads, correlation ids of
kernel launches, memory allocation sizes, tf_op, tf_function_call …) or through its name, and nothing else:
- an exact name its event-type table knows (`TraceContext`, `SessionRun`, `EagerExecute`, `MemoryAllocation`, the
  tf.data, batching, TFRT and TPU runtime names: `HOST_EVENT_TYPE_NAMES`);
- a framework op's full name, `name:Type` (TensorFlow), `Iterator::…` (tf.data), a JAX op path: always with `:` or
  `/`; the `Memcpy…` names of GPU copies; the `train…`/`test…` host step markers.
XProf's event grouping then takes each event's parent to be the innermost earlier event on its line that includes it,
and passes step groups from parents to children. On a line whose events are nested or disjoint, an event left out
changes no other event's ancestors but by itself; so where it carries no stats and its name is none of those, the
groups, the ops and the steps come out the same without it.

Half the host events of a JAX profile on a GPU that are not the Python tracer's are of that kind: XLA's compiler
passes, the runtime's buffer bookkeeping, the PjRt and Python binding calls (437,000 of the 856,000 of the 85 MiB
bench profile; its op_stats and memory_profile conversions take 20-25% less CPU without them).
tests/test_xprof_views.py compares every view, with and without them, on every real device profile here;
tests/test_slim.py checks the copy against protobuf and a plain simulation of XProf's nesting.

The table is xprof 2.24.2's (its bundled TSL's `xplane_schema.cc`; every name is in the wheel's
`profiler_plugin_c_api.so`). Another xprof version may know names this one does not, so there the copy leaves out
the Python tracer's events alone (`unread_name_filter`).
"""

from __future__ import annotations

from collections.abc import Callable

AUDITED_VERSION = "2.24.2"

HOST_EVENT_TYPE_NAMES = frozenset({
    "UnknownHostEventType", "TraceContext", "SessionRun", "FunctionRun", "RunGraph", "RunGraphDone", "TfOpRun",
    "EagerExecute", "ExecutorState::Process", "ExecutorDoneCallback", "MemoryAllocation", "MemoryDeallocation",
    "RemotePerfCounter", "InstantiatedCapturedFunction::Run", "InstantiatedCapturedFunction::RunWithBorrowedArgs",
    "InstantiatedCapturedFunction::RunInstantiated", "InstantiatedCapturedFunction::RunAsync", "ParallelForOp",
    "ForeverOp", "WhileOp-EvalCond", "WhileOp-StartBody", "ForOp", "IteratorGetNextOp::DoCompute",
    "IteratorGetNextAsOptionalOp::DoCompute", "Iterator", "Iterator::Prefetch::Generator", "PrefetchProduce",
    "PrefetchConsume", "ParallelInterleaveProduce", "ParallelInterleaveConsume", "ParallelInterleaveInitializeInput",
    "ParallelMapProduce", "ParallelMapConsume", "MapAndBatchProduce", "MapAndBatchConsume", "ParseExampleProduce",
    "ParseExampleConsume", "ParallelBatchProduce", "ParallelBatchConsume", "BatchingSessionRun", "ProcessBatch",
    "BrainSessionRun", "ConcatInputTensors", "MergeInputTensors", "ScheduleWithoutSplit", "ScheduleWithSplit",
    "ScheduleWithEagerSplit", "ASBSQueue::Schedule", "TfrtModelRun", "ServingModelRun", "KernelLaunch",
    "KernelExecute", "EnqueueRequestLocked", "RunProgramRequest", "HostCallbackRequest", "TransferH2DRequest",
    "TransferPreprocessedH2DRequest", "TransferD2HRequest", "OnDeviceSendRequest", "OnDeviceRecvRequest",
    "OnDeviceSendRecvLocalRequest", "CustomWait", "OnDeviceSendRequestMulti", "OnDeviceRecvRequestMulti",
    "PjrtAsyncWait", "DoEnqueueProgram", "DoEnqueueContinuationProgram", "WriteHbm", "ReadHbm", "TpuExecuteOp",
    "CompleteCallbacks", "TPUPartitionedCallOp-InitializeVarOnTPU", "TPUPartitionedCallOp-ExecuteRemote",
    "TPUPartitionedCallOp-ExecuteLocal", "Linearize", "Delinearize", "TransferBufferFromDevice-FastPath",
    "tpu::System::TransferToDevice=>IssueEvent", "tpu::System::TransferToDevice=>IssueEvent=>Done",
    "tpu::System::TransferFromDevice=>IssueEvent", "tpu::System::TransferFromDevice=>IssueEvent=>Done",
    "tpu::System::Execute",
})
"""The names XProf's host event types are looked up by (TSL's HostEventType table, as bundled in xprof 2.24.2)."""

_NAMED_PREFIXES = ("memcpy", "train", "test")
"""Name prefixes XProf reads, compared without case: GPU copies (ParseTfOpFullname's Memcpy categories) and the host
step markers (IsExplicitHostStepMarker)."""


def xprof_ignores(name: str) -> bool:
    """Whether xprof 2.24.2's converters give an event of this name no meaning of its own (see the module's
    docstring); an empty name is kept too."""
    return bool(name) and not (
        name in HOST_EVENT_TYPE_NAMES or ":" in name or "/" in name or name.lower().startswith(_NAMED_PREFIXES)
    )


def unread_name_filter(xprof_version: str | None) -> Callable[[str], bool] | None:
    """`xprof_ignores` for the audited xprof version, else None: the copy then keeps every event but the Python
    tracer's."""
    return xprof_ignores if xprof_version == AUDITED_VERSION else None
