"""FLOPs and HBM bytes of JAX's own Pallas TPU kernels, from their operands and what each kernel is known to do.

A Pallas kernel is a custom call whose code the HLO does not show, and the library's kernels carry no cost estimate
a reader can trust: flash attention's forward carries the dense reference's (the full S x S even when the kernel is
causal), its backward kernels, paged and ragged paged attention none. Each is recognised by the name JAX gives it
(the instruction or its framework op) and costed from its operands' shapes:

- flash attention (`jax.experimental.pallas.ops.tpu.flash_attention`), q, k, v as [B, H, S, D]: the forward does
  QKᵀ and PV, 4·B·H·Sq·Sk·D; the dK/dV kernel recomputes QKᵀ and does dV, dP and dK, 8·B·H·Sq·Sk·D; the dQ kernel
  recomputes QKᵀ and does dP and dQ, 6·B·H·Sq·Sk·D. A causal kernel (its body builds a positional mask) skips the
  blocks above the diagonal: half of that.
- paged attention, q [B, Hq, (1,) D] and K, V pages [Hkv, pages, page size, D] with page indices [B·pages per
  sequence]: each sequence's K and V pages are read once, 4·B·Hq·L·D FLOPs for L tokens per sequence.
- ragged paged attention, q [T, Hq, D] and K/V pages [pages, page size, 2·Hkv, D] with page indices [S, pages per
  sequence]: each sequence's pages read once; at most 4·Hq·D·T·L FLOPs.

The sequence lengths of the paged kernels are runtime values the profile does not hold: their bytes and FLOPs are
for sequences that fill their pages, an upper bound, and the cost says so.
"""

from __future__ import annotations

from math import prod

from xdiag.profile.schema import BYTES_PER_ELEMENT
from xdiag.profile.space import HloComputation, HloInstruction

UPPER_BOUND = "an upper bound"
"""How a cost says it assumes full pages: its rates (FLOP/s, GB/s, share of the roof) are upper bounds, not
measurements (xdiag.analysis.op_stats marks such rows)."""

FLASH_FLOPS_PER_QKD = {"forward": 4, "backward dK/dV": 8, "backward dQ": 6}
"""Multiply-adds x 2 per (query, key, head-dim element) of each flash kernel: its matrix products."""


def _array_bytes(ins: HloInstruction) -> float:
    if ins.dtype == "tuple":
        return sum(prod(d) * BYTES_PER_ELEMENT.get(t, 4) for t, d in ins.tuple_shapes)
    return prod(ins.dims) * BYTES_PER_ELEMENT.get(ins.dtype, 4)


def _names(ins: HloInstruction) -> str:
    return f"{ins.name} {ins.op_name}".lower()


def _flash_kind(ins: HloInstruction) -> str | None:
    names = _names(ins)
    if "flash_mha_bwd_dkv" in names:
        return "backward dK/dV"
    if "flash_mha_bwd_dq" in names:
        return "backward dQ"
    if "flash_attention" in names and "bwd" not in names:
        return "forward"
    return None


def _flash(ins: HloInstruction, operands: list[HloInstruction]) -> tuple[float, float, str] | None:
    kind = _flash_kind(ins)
    if kind is None or len(operands) < 3 or any(len(o.dims) != 4 for o in operands[:3]):
        return None
    q, k, v = operands[:3]
    (b, h, sq, d), sk = q.dims, k.dims[2]
    if k.dims[:2] != (b, h) or v.dims[:3] != k.dims[:3] or k.dims[3] != d:
        return None
    flops = FLASH_FLOPS_PER_QKD[kind] * b * h * sq * sk * d
    causal = ins.kernel_position_mask
    if causal:
        flops /= 2
    moved = sum(_array_bytes(o) for o in operands) + _array_bytes(ins)
    how = (f"JAX's flash attention, {kind} kernel: {FLASH_FLOPS_PER_QKD[kind]}·B·H·Sq·Sk·D from q, k, v "
           f"[{b},{h},{sq},{d}]" + (", halved: its body builds a causal mask" if causal else "")
           + "; bytes: its operands read and its results written once")
    return float(flops), float(moved), how


def _paged(ins: HloInstruction, operands: list[HloInstruction]) -> tuple[float, float, str] | None:
    pages = [o for o in operands if len(o.dims) == 4 and o.dtype not in ("s32", "u32")]
    if len(pages) < 3:
        return None
    q, k_pages, v_pages = pages[-3:]  # q [B, Hq, 1, D] (or [B, Hq, D] where not reshaped), then K and V pages
    indices = [o for o in operands if o.dtype == "s32" and len(o.dims) == 1 and o.dims[0] > 1]
    if len(indices) < 2 or k_pages.dims != v_pages.dims:
        return None
    lengths, page_indices = indices[0], indices[1]  # [B] lengths, then the flattened [B·pages per sequence]
    batch, heads_q, dim = q.dims[0], q.dims[1], q.dims[-1]
    heads_kv, _, page_size, dim_kv = k_pages.dims
    if dim_kv != dim or lengths.dims[0] != batch or page_indices.dims[0] % batch:
        return None
    tokens = page_indices.dims[0] // batch * page_size
    kv_bytes = 2 * batch * tokens * heads_kv * dim * BYTES_PER_ELEMENT.get(k_pages.dtype, 2)
    flops = 4.0 * batch * heads_q * tokens * dim
    how = (f"JAX's paged attention: K and V pages of {batch} sequences x {tokens} tokens x {heads_kv} KV heads x "
           f"{dim} read once, 4·B·Hq·L·D FLOPs; {UPPER_BOUND} (sequence lengths are runtime values: full pages assumed)")
    return flops, float(kv_bytes + _array_bytes(q) + _array_bytes(ins)), how


def _ragged(ins: HloInstruction, operands: list[HloInstruction]) -> tuple[float, float, str] | None:
    q = next((o for o in operands if len(o.dims) == 3 and o.dtype not in ("s32", "u32")), None)
    kv = next((o for o in operands if len(o.dims) == 4 and o.dtype not in ("s32", "u32")), None)
    page_indices = next((o for o in operands if o.dtype == "s32" and len(o.dims) == 2), None)
    if q is None or kv is None or page_indices is None or kv.dims[3] != q.dims[2]:
        return None
    tokens, heads_q, dim = q.dims
    _, page_size, combined_kv_heads, _ = kv.dims
    seqs, pages_per_seq = page_indices.dims
    kv_tokens = pages_per_seq * page_size
    kv_bytes = seqs * kv_tokens * combined_kv_heads * dim * BYTES_PER_ELEMENT.get(kv.dtype, 2)
    flops = 4.0 * heads_q * dim * tokens * kv_tokens
    how = (f"JAX's ragged paged attention: K and V pages of {seqs} sequences x {kv_tokens} tokens read once, at "
           f"most 4·Hq·D·T·L FLOPs for {tokens} query tokens; {UPPER_BOUND} (sequence and query lengths are runtime "
           "values: full pages assumed)")
    return flops, float(kv_bytes + _array_bytes(q) + _array_bytes(ins)), how


def library_kernel_cost(ins: HloInstruction, computation: HloComputation) -> tuple[float, float, str] | None:
    """(FLOPs, HBM bytes, how they were found) of one of JAX's Pallas TPU library kernels; None for any other
    instruction, or where its operands are not the shapes the kernel takes."""
    if ins.opcode != "custom-call":
        return None
    operands = [computation.by_name[o] for o in ins.operands if o in computation.by_name]
    names = _names(ins)
    if "ragged_paged_attention" in names:
        return _ragged(ins, operands)
    if "paged_attention" in names:
        return _paged(ins, operands)
    return _flash(ins, operands)
