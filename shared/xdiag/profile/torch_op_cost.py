"""FLOPs and bytes of a PyTorch CPU op from the input shapes and dtypes Kineto records with it (`Input Dims`,
`Input type`, `Concrete Inputs`; written when the profiler ran with `record_shapes=True`).

Only the ops whose work the shapes fix are counted: the matrix products (aten::mm, addmm, bmm, baddbmm, matmul,
linear) and the fused attention forwards (flash, memory-efficient, cuDNN). FLOPs are the multiply-adds' 2·M·K·N
(bias and scaling adds are not counted, as XLA's cost model and HTA/TraceLens do not); attention is its two
products over the score entries the mask keeps, 2·B·H·(D+Dv) per entry. Bytes are each operand read once and the
result written once: the least HBM traffic the op can have.
"""

from __future__ import annotations

from math import prod

ELEMENT_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "int": 4, "long int": 8, "short int": 2,
    "signed char": 1, "unsigned char": 1,
}
SHORT_TYPES = {
    "float": "f32", "double": "f64", "c10::Half": "f16", "c10::BFloat16": "bf16", "c10::Float8_e4m3fn": "f8e4m3fn",
    "c10::Float8_e5m2": "f8e5m2", "c10::Float8_e4m3fnuz": "f8e4m3fnuz", "c10::Float8_e5m2fnuz": "f8e5m2fnuz",
    "int": "s32", "long int": "s64", "short int": "s16", "signed char": "s8", "unsigned char": "u8",
}
"""Kineto's C++ type names in XLA's short form (what the roofline reads an operand's width from)."""

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
ATTENTION_OPS = {
    # op -> (layout of Q/K/V: BSHD or BHSD, index of is_causal in its Concrete Inputs)
    "aten::_flash_attention_forward": ("BSHD", 8),
    "aten::_efficient_attention_forward": ("BSHD", None),  # custom_mask_type, not a flag: see _causal
    "aten::_scaled_dot_product_flash_attention": ("BHSD", 4),
    "aten::_scaled_dot_product_efficient_attention": ("BHSD", 6),
    "aten::_scaled_dot_product_cudnn_attention": ("BHSD", 6),
}
COSTED_OPS = (*GEMM_OPS, *ATTENTION_OPS)
NO_SHAPES_REASON = ("the trace was recorded without input shapes (torch.profiler's record_shapes=False): its CPU "
                    "ops carry no 'Input Dims', so their FLOPs cannot be counted")
NOT_COSTED_REASON = ("the CPU op that launched it is not a matrix product or fused attention, whose FLOPs xdiag "
                     "counts from its input shapes")


def _shape(dims, types, i: int) -> tuple[list[int], str] | None:
    if i >= len(dims) or not isinstance(dims[i], list) or i >= len(types):
        return None
    try:
        return [int(d) for d in dims[i]], str(types[i])
    except (TypeError, ValueError):
        return None


def _text(shape: list[int], dtype: str) -> str:
    return f"{SHORT_TYPES.get(dtype, dtype)}[{','.join(str(d) for d in shape)}]"


def _matmul_dims(a: list[int], b: list[int]) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of torch.matmul(a, b) with broadcasting; None where the shapes do not multiply."""
    if not a or not b:
        return None
    a2 = [1, *a] if len(a) == 1 else a
    b2 = [*b, 1] if len(b) == 1 else b
    m, k, k2, n = a2[-2], a2[-1], b2[-2], b2[-1]
    if k != k2:
        return None
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (width - len(batch_a)) + batch_a, [1] * (width - len(batch_b)) + batch_b
    if any(x != y and 1 not in (x, y) for x, y in zip(batch_a, batch_b)):
        return None
    return prod(max(x, y) for x, y in zip(batch_a, batch_b)), m, k, n


def _causal(name: str, concrete: list, index: int | None) -> bool | None:
    if name == "aten::_efficient_attention_forward":
        value = concrete[9] if len(concrete) > 9 else ""
        return None if value in ("", None) else str(value) not in ("0",)
    if index is None or index >= len(concrete) or concrete[index] in ("", None):
        return None
    return str(concrete[index]) == "True"


def op_cost(name: str, args: dict) -> dict | None:
    """{flops, bytes, label} of one CPU op from its recorded inputs; {reason} where it is an op counted here whose
    inputs do not give its FLOPs; None for ops not counted here."""
    if name not in GEMM_OPS and name not in ATTENTION_OPS:
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return {"reason": NO_SHAPES_REASON}
    if name in ATTENTION_OPS:
        return _attention_cost(name, dims, types, args.get("Concrete Inputs") or [])
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    a, b = _shape(dims, types, first), _shape(dims, types, first + 1)
    if a is None or b is None:
        return {"reason": f"{name}'s recorded inputs hold no two matrices"}
    if name == "aten::linear":  # weight [N, K]: the product is input · weightᵀ
        found = _matmul_dims(a[0], list(reversed(b[0]))) if len(b[0]) == 2 else None
    else:
        found = _matmul_dims(a[0], b[0])
    if found is None:
        return {"reason": f"{name}'s input shapes {a[0]} and {b[0]} do not multiply"}
    batch, m, k, n = found
    size = ELEMENT_BYTES.get(a[1])
    if size is None:
        return {"reason": f"{name}'s input type {a[1]!r} has no known width"}
    operands = [a, b]
    bias = _shape(dims, types, 0 if first else 2)
    if bias is not None and bias[0] and name in ("aten::addmm", "aten::baddbmm", "aten::linear"):
        operands.append(bias)
    read = sum(prod(s) * ELEMENT_BYTES.get(t, size) for s, t in operands)
    return {"flops": 2 * batch * m * k * n, "bytes": read + batch * m * n * size,
            "label": " ".join([name, *(_text(s, t) for s, t in operands)])}


def _attention_cost(name: str, dims: list, types: list, concrete: list) -> dict:
    layout, causal_index = ATTENTION_OPS[name]
    q, k, v = (_shape(dims, types, i) for i in range(3))
    if q is None or k is None or v is None or not (len(q[0]) == len(k[0]) == len(v[0]) == 4):
        return {"reason": f"{name}'s recorded inputs hold no 4-D query, key and value (a packed variable-length "
                          "batch: its sequence lengths are not in the shapes)"}
    if layout == "BSHD":
        (batch, sq, heads, d), (_, sk, _, _), dv = q[0], k[0], v[0][3]
    else:
        (batch, heads, sq, d), (_, _, sk, _), dv = q[0], k[0], v[0][3]
    causal = _causal(name, concrete, causal_index)
    if causal is None:
        return {"reason": f"{name}'s trace does not say whether its mask is causal (no 'Concrete Inputs'), which "
                          "halves its FLOPs"}
    size = ELEMENT_BYTES.get(q[1])
    if size is None:
        return {"reason": f"{name}'s input type {q[1]!r} has no known width"}
    # Causal masks are aligned bottom-right (query i sees keys up to Sk - Sq + i).
    if not causal:
        kept = sq * sk
    else:
        kept = sq * sk - sq * (sq - 1) // 2 if sq <= sk else sk * (sk + 1) // 2
    flops = 2 * batch * heads * kept * (d + dv)
    read = sum(prod(s) * ELEMENT_BYTES.get(t, size) for s, t in (q, k, v))
    return {"flops": flops, "bytes": read + batch * heads * sq * dv * size,
            "label": " ".join([name + (" causal" if causal else ""), *(_text(s, t) for s, t in (q, k, v))])}
