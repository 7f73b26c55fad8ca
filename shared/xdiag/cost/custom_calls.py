"""FLOPs of the custom calls whose work the HLO names but does not show: GEMM calls (cuBLAS, hipBLASLt,
TransformerEngine), convolution calls (cuDNN, MIOpen), fused attention calls (cuDNN flash attention) and custom
kernels (Pallas, Mosaic, Triton: one of JAX's own kernels from its operands, else the cost estimate its author
attached, else operand shapes of a matrix product). cost.hlo costs every other instruction, and calls these.
"""

from __future__ import annotations

from math import prod

from xdiag.cost.library_kernels import library_kernel_cost
from xdiag.profile.space import HloComputation, HloInstruction


CUSTOM_CODE_REASON = "custom calls and host callbacks run code whose FLOPs the HLO does not say"
FLOOR_BASIS = ("its operands read and its results written once: a bandwidth the kernel at least achieved (re-reads "
               "inside it are not seen)")


def bandwidth_floor(moved_bytes: float, runs: int, total_ps: int) -> dict:
    """An opaque custom call's least bandwidth: what it must at least have moved per run (its operands read and its
    results written once: bytes_floor_per_run) over its runs' time (achieved_gb_per_s_floor), and why it is a floor
    (floor_basis); {} where neither is known."""
    if not moved_bytes or not total_ps:
        return {}
    return {"bytes_floor_per_run": moved_bytes,
            "achieved_gb_per_s_floor": round(moved_bytes * runs / (total_ps / 1e12) / 1e9, 3),
            "floor_basis": FLOOR_BASIS}


GEMM_TARGETS = ("gemm", "matmul", "cublas", "hipblas", "rocblas", "triton_gemm")
"""Custom-call targets that are matrix multiplications (cuBLAS `__cublas$gemm`, `__cublas$lt$matmul`,
hipBLASLt, TransformerEngine `te_gemm*`)."""


def is_gemm_call(ins: HloInstruction) -> bool:
    target = ins.custom_call_target.lower()
    return ins.opcode == "custom-call" and any(k in target for k in GEMM_TARGETS)


def call_result(ins: HloInstruction) -> tuple[str, tuple[int, ...]]:
    """A custom call's real result: the first element of its tuple (the rest is workspace)."""
    if ins.dtype == "tuple" and ins.tuple_shapes:
        return ins.tuple_shapes[0]
    return ins.dtype, ins.dims


def gemm_flops(ins: HloInstruction, computation: HloComputation) -> float | None:
    """2·B·M·N·K of a GEMM custom call, or None when its operands do not say K."""
    operands = [computation.by_name.get(o) for o in ins.operands[:2]]
    if len(operands) < 2 or any(o is None or len(o.dims) < 2 for o in operands):
        return None
    lhs, rhs = operands
    _, out = call_result(ins)
    if ins.lhs_contracting:
        return 2.0 * prod(out) * prod(lhs.dims[d] for d in ins.lhs_contracting if d < len(lhs.dims))
    # No dimension numbers: |lhs|·|rhs| = B²·M·N·K² and |out| = B·M·N, with B the leading dims all three share.
    batch = 1
    for a, b, c in zip(lhs.dims[:-2], rhs.dims[:-2], out[:-2]):
        if not a == b == c:
            break
        batch *= a
    if not out or not prod(out):
        return None
    k = round((prod(lhs.dims) * prod(rhs.dims) / (prod(out) * batch)) ** 0.5)
    if k < 1 or k not in lhs.dims or k not in rhs.dims or prod(lhs.dims) * prod(rhs.dims) != batch * prod(out) * k * k:
        return None
    return 2.0 * prod(out) * k


CONV_TARGETS = {
    "__cudnn$convForward": "forward", "__cudnn$convBiasActivationForward": "forward",
    "__cudnn$convForwardGraph": "forward", "__cudnn$convBackwardInput": "backward_input",
    "__cudnn$convBackwardFilter": "backward_filter",
}
"""Convolution custom calls (cuDNN on CUDA, MIOpen on ROCm under the same names) and which convolution each
runs. XLA keeps the forward convolution's window and dimension numbers on all three."""


def attention_flops(ins: HloInstruction, computation: HloComputation) -> float | None:
    """The matrix products of a fused attention call, from the score matrix S = [B,H,Sq,Sk] its backend config
    names and the head dimensions of Q (operand 0) and V (operand 2), each the last logical dimension:
    forward QKᵀ and PV, 2·|S|·(D + Dv); backward (recomputed QKᵀ, dV, dP, dQ, dK) 2·|S|·(3·D + 2·Dv). A causal
    mask halves it: flash kernels skip the masked blocks. None where the config or operands do not say."""
    scores = ins.attention_scores
    operands = [computation.by_name.get(o) for o in ins.operands[:3]]
    if len(scores) < 2 or len(operands) < 3 or any(o is None or not o.dims for o in operands):
        return None
    q, _, v = operands
    d, dv = q.dims[-1], v.dims[-1]
    if prod(q.dims) * scores[-1] != prod(scores) * d:  # Q is not [B,H,Sq,D] in some order: the config is not Q's
        return None
    flops = 2.0 * prod(scores) * ((3 * d + 2 * dv) if ins.custom_call_target.endswith("Backward") else (d + dv))
    return flops / 2 if ins.attention_causal else flops


def custom_kernel_cost(ins: HloInstruction, computation: HloComputation) -> tuple[float, float | None, str] | None:
    """(FLOPs, bytes or None, how they were found) of a custom kernel whose code the HLO does not show (a Pallas /
    Mosaic / Triton custom call): one of JAX's own Pallas kernels from its operands (library_kernels), else the
    cost estimate its author attached, else, where its two operands and result
    have exactly the shapes of a matrix product ([B..,M,K]·[B..,K,N] -> [B..,M,N]), 2·B·M·N·K. None otherwise."""
    if (ins.opcode != "custom-call" or is_gemm_call(ins) or ins.custom_call_target in CONV_TARGETS
            or ins.attention_scores):
        return None
    library = library_kernel_cost(ins, computation)
    if library is not None:
        return library
    if ins.kernel_cost_estimate:
        flops, moved = ins.kernel_cost_estimate[:2]
        return flops, moved or None, "the kernel's own cost estimate (its backend config)"
    operands = [computation.by_name.get(o) for o in ins.operands]
    if len(operands) != 2 or None in operands or ins.dtype == "tuple" or len(ins.dims) < 2:
        return None
    lhs, rhs = operands
    if not (len(lhs.dims) == len(rhs.dims) == len(ins.dims)) or lhs.dims[:-2] != ins.dims[:-2] or rhs.dims[:-2] != ins.dims[:-2]:
        return None
    (m, n), (a, b), (c, d) = ins.dims[-2:], lhs.dims[-2:], rhs.dims[-2:]
    # lhs [M,K] or [K,M], rhs [K,N] or [N,K]: one K shared, the others the result's M and N.
    for k in {a, b}:
        if sorted((a, b)) == sorted((m, k)) and sorted((c, d)) == sorted((k, n)):
            return 2.0 * prod(ins.dims) * k, None, "operand shapes of a matrix product (inferred: the kernel's code is not read)"
    return None
