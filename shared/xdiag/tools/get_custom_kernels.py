"""get_custom_kernels: which custom calls and hand-written kernels ran, for how long, and how fast?"""

from __future__ import annotations

from xdiag.profile.space import Session
from xdiag.tools.common import percent
from xdiag.tools.llo import counter_lines, low_level_gap, low_level_lines
from xdiag.analysis.op_stats import OpStat, op_stats
from xdiag.tools.registry import ToolOutput, tool

# (text in the custom-call target or op name, lower case) -> what kind of kernel it is; first match wins.
# XLA names the GEMM library call `__cublas$…` on ROCm too (it runs hipBLASLt there): the family is named, and
# the target is kept beside it.
KERNEL_KINDS = (
    ("tpu_custom_call", "Pallas/Mosaic (TPU)"),
    ("mosaic_gpu", "Mosaic GPU"),
    ("triton", "Triton"),
    ("cublas", "library GEMM (cuBLAS/hipBLASLt)"),
    ("hipblas", "library GEMM (cuBLAS/hipBLASLt)"),
    ("rocblas", "library GEMM (rocBLAS)"),
    ("cudnn", "library kernel (cuDNN)"),
    ("miopen", "library kernel (MIOpen)"),
    ("transformer_engine", "TransformerEngine"),
    ("te_", "TransformerEngine"),
    ("callback", "host callback"),
)


def kernel_kind(target: str) -> str:
    """The family of a custom kernel from its custom-call target (or op name): 'Pallas/Mosaic (TPU)', 'Triton',
    'cuBLASLt', …; the target itself when unknown."""
    low = target.lower()
    return next((kind for key, kind in KERNEL_KINDS if key in low), target or "custom call")


CUSTOM_FUSION_KINDS = (
    ("triton", "Triton (XLA fusion)"),
    ("ynn", "YNNPACK (XLA:CPU fusion)"),
    ("onednn", "oneDNN (XLA:CPU fusion)"),
    ("cudnn", "cuDNN (XLA fusion)"),
    ("dynamic_slice", "custom fusion (XLA address computation)"),
)
"""(text in a custom fusion's backend kind, lower case) -> what emits it; XLA marks every one `kCustom`."""


def custom_fusion_kind(backend_kind: str) -> str:
    """What emits a custom fusion, from the kind its backend config names; said plainly when it names none."""
    low = backend_kind.lower()
    found = next((kind for key, kind in CUSTOM_FUSION_KINDS if key in low), None)
    if found:
        return found
    return f"custom fusion ({backend_kind})" if backend_kind else "custom fusion (its backend config names no emitter)"


def _custom(session: Session, stat: OpStat) -> tuple[str, str] | None:
    """(kind, target) when `stat` is a custom kernel: a custom call, a custom (Triton) fusion, or an op the
    timeline could only place as a custom call."""
    # Several programs may share a module name (jit_dot five times): the one that holds the op is the one.
    modules = [m for m in session.hlo_modules if stat.module in (m.name, m.display_name)] if stat.module else []
    module, found = next(((m, f) for m in modules if (f := m.find(stat.name)) is not None), (None, None))
    if found is not None:
        _, ins = found
        if ins.opcode == "custom-call":
            return kernel_kind(ins.custom_call_target or stat.name), ins.custom_call_target
        if ins.opcode == "fusion" and "custom" in ins.fusion_kind.lower():
            if "custom-call" in module.fused_opcodes.get(ins.name, []):
                return "custom call (fused)", ins.fusion_backend_kind or ins.fusion_kind
            return custom_fusion_kind(ins.fusion_backend_kind), ins.fusion_backend_kind or ins.fusion_kind
        return None
    if stat.category == "custom_call":
        return kernel_kind(stat.name), ""
    return None


@tool(
    "get_custom_kernels",
    "Every custom call and hand-written kernel (Pallas/Mosaic, Triton, cuBLAS/hipBLASLt GEMMs, cuDNN/MIOpen, "
    "TransformerEngine): its kind, time share, FLOPs and bytes where the HLO says them, achieved rate; and on TPU "
    "the LLO / Tensor Core lines the capture carries (or why there are none) and its counter samples.",
)
def get_custom_kernels(session: Session) -> ToolOutput:
    """summary: custom_kernels, total_ms, share_of_op_time_percent, top_kernel, kinds {kind: count},
    costed_kernels (how many have FLOPs known), low_level_lines. detail: kernels [every custom kernel, busiest first:
    op, module, kind, target, count, total_ms, share_of_op_time_percent, and the op row's FLOPs/bytes/rates],
    low_level {available, lines | reason, counters: the counter lines (samples, not time)}."""
    stats = op_stats(session)
    total_ps = sum(s.total_ps for s in stats)
    kernels = []
    for stat in stats:
        found = _custom(session, stat)
        if found is None:
            continue
        kind, target = found
        row = stat.row(total_ps)
        kernels.append({"op": row.pop("op"), "module": row.pop("module"), "kind": kind, "target": target, **row})
    lines = low_level_lines(session)
    low_level = {"available": True, "lines": lines} if lines else {"available": False, "reason": low_level_gap(session)}
    if counters := counter_lines(session):
        low_level["counters"] = counters
    kernel_ps = sum(s.total_ps for s in stats if _custom(session, s) is not None)
    kinds: dict[str, int] = {}
    for k in kernels:
        kinds[k["kind"]] = kinds.get(k["kind"], 0) + 1
    summary = {
        "custom_kernels": len(kernels),
        "total_ms": round(kernel_ps / 1e9, 4),
        "share_of_op_time_percent": percent(kernel_ps, total_ps),
        "top_kernel": kernels[0]["op"] if kernels else None,
        "kinds": kinds,
        "costed_kernels": sum(1 for k in kernels if k.get("flops_per_run") is not None),
        "low_level_lines": len(lines),
    }
    detail = {"kernels": kernels, "low_level": low_level}
    if not kernels:
        detail["none_because"] = ("no custom call or hand-written kernel ran: every op in this profile is "
                                  "XLA-generated" if stats else "the profile holds no XLA op executions")
    return ToolOutput(summary, detail, "HLO carried in the profile, joined with op times")
