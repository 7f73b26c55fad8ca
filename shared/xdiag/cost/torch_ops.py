"""FLOPs and bytes of a PyTorch CPU op from the input shapes and dtypes Kineto records with it (`Input Dims`,
`Input type`, `Concrete Inputs`; written when the profiler ran with `record_shapes=True`).

Only the ops whose work the shapes fix are counted: the matrix products (aten::mm, addmm, bmm, baddbmm, matmul,
linear), the fused attention forwards (flash, memory-efficient, cuDNN) and their backwards (2.5x the forward's
FLOPs: BACKWARD_ATTENTION_FACTOR) and the convolutions (aten::convolution,
_convolution, cudnn_/miopen_convolution and their transposes, convolution_backward). FLOPs are the multiply-adds'
2·M·K·N (bias and scaling adds are not counted, as XLA's cost model and HTA/TraceLens do not); attention is its two
products over the score entries the mask keeps, 2·B·H·(D+Dv) per entry; a convolution 2·|output|·(C_in/groups)·
prod(kernel spatial), the output's shape from the input's, the weight's and the stride, padding and dilation in
`Concrete Inputs` (a transposed one 2·|input|·(C_out/groups)·prod(kernel spatial), which needs none of them), and
its backward that count once per gradient it computes (input, weight: its output mask). Bytes are each operand read
once and the result written once: the least HBM traffic the op can have.
"""

from __future__ import annotations

import re
from math import prod

from xdiag.profile.op_records import op_from_record

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
ATTENTION_BACKWARD_OPS = {
    # op -> (layout of Q/K/V, indexes where its is_causal may be, the first that holds a bool): the inputs are
    # (grad_out, query, key, value, ...). The SDPA efficient backward of PyTorch 2.0 had no attn_bias: is_causal at 6.
    "aten::_flash_attention_backward": ("BSHD", (11,)),
    "aten::_scaled_dot_product_flash_attention_backward": ("BHSD", (11,)),
    "aten::_scaled_dot_product_efficient_attention_backward": ("BHSD", (11, 6)),
    "aten::_efficient_attention_backward": ("BSHD", (14,)),  # custom_mask_type, not a flag: see _causal
    "aten::_scaled_dot_product_cudnn_attention_backward": ("BHSD", (14,)),
    "aten::_cudnn_attention_backward": ("BHSD", (14,)),
}
BACKWARD_ATTENTION_FACTOR = 2.5
"""A fused attention backward's FLOPs over its forward's: it recomputes the scores (one product) and computes the
gradients of Q, K, V and the scores (four), 2.5x the forward's two products at the forward's multiply-add count
(FlashAttention's paper, and XLA's cost of a cuDNN fMHA backward, count it so)."""
CONVOLUTION_OPS = {
    # op -> index in its inputs of (stride, padding, dilation, output_padding, groups, transposed); transposed a
    # bool where the op fixes it. cudnn_convolution[_transpose] lost its bias input in PyTorch 1.8: _convolution_args.
    "aten::convolution": (3, 4, 5, 7, 8, 6),
    "aten::_convolution": (3, 4, 5, 7, 8, 6),
    "aten::cudnn_convolution": (4, 3, 5, None, 6, False),
    "aten::miopen_convolution": (4, 3, 5, None, 6, False),
    "aten::cudnn_convolution_transpose": (5, 3, 6, 4, 7, True),
    "aten::miopen_convolution_transpose": (5, 3, 6, 4, 7, True),
}
CONVOLUTION_BACKWARD = "aten::convolution_backward"
# convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
# groups, output_mask)
_BACKWARD_TRANSPOSED, _BACKWARD_MASK = 7, 10
COSTED_OPS = (*GEMM_OPS, *ATTENTION_OPS, *ATTENTION_BACKWARD_OPS, *CONVOLUTION_OPS, CONVOLUTION_BACKWARD)
NO_SHAPES_REASON = ("the trace was recorded without input shapes (torch.profiler's record_shapes=False): its CPU "
                    "ops carry no 'Input Dims', so their FLOPs cannot be counted")
NOT_COSTED_REASON = ("the CPU op that launched it is not a matrix product, convolution or fused attention, whose "
                     "FLOPs xdiag counts from its input shapes")


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
    if name in ("aten::_efficient_attention_forward", "aten::_efficient_attention_backward"):
        at = 9 if name.endswith("forward") else 14  # custom_mask_type: 0 none, 1 and 2 causal
        value = concrete[at] if len(concrete) > at else ""
        return None if value in ("", None) else str(value) not in ("0",)
    if index is None or index >= len(concrete) or concrete[index] in ("", None):
        return None
    return str(concrete[index]) == "True"


def _backward_causal(name: str, concrete: list) -> bool | None:
    if name == "aten::_efficient_attention_backward":
        return _causal(name, concrete, None)
    found = [str(concrete[i]) for i in ATTENTION_BACKWARD_OPS[name][1]
             if i < len(concrete) and str(concrete[i]) in ("True", "False")]
    return None if not found else found[0] == "True"


def op_cost(name: str, args: dict) -> dict | None:
    """{flops, bytes, label} of one CPU op from its recorded inputs; {reason} where it is an op counted here whose
    inputs do not give its FLOPs; None for ops not counted here."""
    if name not in COSTED_OPS:
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return {"reason": NO_SHAPES_REASON}
    concrete = args.get("Concrete Inputs") or []
    if name in ATTENTION_OPS or name in ATTENTION_BACKWARD_OPS:
        return _attention_cost(name, dims, types, concrete)
    if name in CONVOLUTION_OPS:
        return _convolution_cost(name, dims, types, concrete)
    if name == CONVOLUTION_BACKWARD:
        return _convolution_backward_cost(name, dims, types, concrete)
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


def recorded_op_cost(record: str) -> dict | None:
    """op_cost of a CPU op from the record the trace reader kept of it (xdiag.profile.op_records)."""
    return op_cost(*op_from_record(record))


def _attention_cost(name: str, dims: list, types: list, concrete: list) -> dict:
    """A fused attention forward's two products over the score entries its mask keeps; a backward's
    BACKWARD_ATTENTION_FACTOR times its forward's, from its own query, key, value and causal flag."""
    backward = name in ATTENTION_BACKWARD_OPS
    layout = ATTENTION_BACKWARD_OPS[name][0] if backward else ATTENTION_OPS[name][0]
    q, k, v = (_shape(dims, types, i + backward) for i in range(3))
    if q is None or k is None or v is None or not (len(q[0]) == len(k[0]) == len(v[0]) == 4):
        return {"reason": f"{name}'s recorded inputs hold no 4-D query, key and value (a packed variable-length "
                          "batch: its sequence lengths are not in the shapes)"}
    if layout == "BSHD":
        (batch, sq, heads, d), (_, sk, _, _), dv = q[0], k[0], v[0][3]
    else:
        (batch, heads, sq, d), (_, _, sk, _), dv = q[0], k[0], v[0][3]
    causal = _backward_causal(name, concrete) if backward else _causal(name, concrete, ATTENTION_OPS[name][1])
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
    output = batch * heads * sq * dv * size
    label = " ".join([name + (" causal" if causal else ""), *(_text(s, t) for s, t in (q, k, v))])
    if backward:
        # Reads Q, K, V, the output and its gradient; writes the gradients of Q, K and V.
        return {"flops": round(BACKWARD_ATTENTION_FACTOR * flops), "bytes": 2 * read + 2 * output, "label": label}
    return {"flops": flops, "bytes": read + output, "label": label}


def _ints(value) -> list[int] | None:
    """A recorded int list ("[2, 2]", or one int "1") as ints; None where it is not one (not recorded: "")."""
    found = re.findall(r"-?\d+", str(value)) if value not in ("", None) else []
    return [int(v) for v in found] if found and re.fullmatch(r"\[?[-\d,\s]*\]?", str(value)) else None


def _per_dim(value, count: int) -> list[int] | None:
    found = _ints(value)
    if found is None:
        return None
    if len(found) == 1:
        return found * count  # one value for every spatial dimension
    return found if len(found) == count else None


def _flag(value) -> bool | None:
    return {"True": True, "False": False, "1": True, "0": False}.get(str(value))


def _conv_operands(name: str, dims: list, types: list) -> tuple | str:
    """(input, weight) shapes and types of a convolution op, or why they do not fit one."""
    x, w = _shape(dims, types, 0), _shape(dims, types, 1)
    if x is None or w is None or len(x[0]) < 3 or len(w[0]) != len(x[0]):
        return f"{name}'s recorded inputs hold no input and weight of one convolution"
    return x, w


def _convolution_args(name: str, types: list) -> tuple:
    *at, transposed = CONVOLUTION_OPS[name]
    if name.startswith("aten::cudnn_") and len(types) > 2 and types[2] in ("ScalarList", "GenericList"):
        # cudnn_convolution[_transpose](input, weight, padding, ...): no bias input since PyTorch 1.8
        at = [None if i is None else i - 1 for i in at]
    return (*at, transposed)


def _convolution_cost(name: str, dims: list, types: list, concrete: list) -> dict:
    operands = _conv_operands(name, dims, types)
    if isinstance(operands, str):
        return {"reason": operands}
    (x, x_type), (w, w_type) = operands
    stride_at, padding_at, dilation_at, output_padding_at, groups_at, transposed = _convolution_args(name, types)
    if not isinstance(transposed, bool):
        transposed = _flag(concrete[transposed]) if transposed < len(concrete) else None
        if transposed is None:
            return {"reason": f"{name}'s trace does not say whether it is transposed (no 'Concrete Inputs')"}
    kernel = w[2:]
    wanted = (stride_at, padding_at, dilation_at) + ((output_padding_at,) if transposed else ())
    found = [_per_dim(concrete[i], len(kernel)) if i < len(concrete) else None for i in wanted]
    groups = _ints(concrete[groups_at]) if transposed and groups_at < len(concrete) else [1]
    if any(f is None for f in found) or not groups or len(groups) != 1:
        return {"reason": f"{name}'s trace does not record its stride, padding and dilation ('Concrete Inputs'), "
                          "which set its output's size"}
    stride, padding, dilation = found[:3]
    if transposed:  # the gradient of a convolution from `out` to `x`: its output is that convolution's input
        spatial = [(size - 1) * s - 2 * p + d * (k - 1) + extra + 1
                   for size, k, s, p, d, extra in zip(x[2:], kernel, stride, padding, dilation, found[3])]
        out = [x[0], w[1] * groups[0], *spatial]
    else:
        spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1 if s > 0 else 0
                   for size, k, s, p, d in zip(x[2:], kernel, stride, padding, dilation)]
        out = [x[0], w[0], *spatial]
    if any(size <= 0 for size in spatial):
        return {"reason": f"{name}'s recorded shapes {x} and {w} give no output"}
    # Weight [C_out, C_in/groups, *kernel] (transposed: [C_in, C_out/groups, *kernel]): each output element of a
    # convolution, each input element of a transposed one, meets C_in/groups (C_out/groups) · prod(kernel) weights.
    macs = (prod(x) if transposed else prod(out)) * w[1] * prod(kernel)
    size = ELEMENT_BYTES.get(x_type)
    if size is None:
        return {"reason": f"{name}'s input type {x_type!r} has no known width"}
    read = prod(x) * size + prod(w) * ELEMENT_BYTES.get(w_type, size)
    bias = _shape(dims, types, 2)
    if bias is not None and len(bias[0]) == 1:
        read += prod(bias[0]) * ELEMENT_BYTES.get(bias[1], size)
    label = f"{name} {_text(x, x_type)} {_text(w, w_type)} -> {_text(out, x_type)}"
    return {"flops": 2 * macs, "bytes": read + prod(out) * size, "label": label}


def _convolution_backward_cost(name: str, dims: list, types: list, concrete: list) -> dict:
    grad = _shape(dims, types, 0)
    operands = _conv_operands(name, dims[1:], types[1:])
    if grad is None or isinstance(operands, str) or len(grad[0]) != len(operands[0][0]):
        return {"reason": f"{name}'s recorded inputs hold no gradient, input and weight of one convolution"}
    (x, x_type), (w, w_type) = operands
    mask = _ints(str(concrete[_BACKWARD_MASK]).replace("True", "1").replace("False", "0")) \
        if _BACKWARD_MASK < len(concrete) else None
    transposed = _flag(concrete[_BACKWARD_TRANSPOSED]) if _BACKWARD_TRANSPOSED < len(concrete) else None
    if mask is None or len(mask) != 3 or transposed is None:
        return {"reason": f"{name}'s trace does not record which gradients it computes ('Concrete Inputs': "
                          "output_mask)"}
    # The forward's multiply-adds, once for the input's gradient and once for the weight's: a transposed
    # convolution's over its input, a convolution's over its output (the gradient's shape).
    macs = (prod(x) if transposed else prod(grad[0])) * w[1] * prod(w[2:])
    passes = mask[0] + mask[1]
    size = ELEMENT_BYTES.get(grad[1])
    if size is None:
        return {"reason": f"{name}'s input type {grad[1]!r} has no known width"}
    read = (prod(grad[0]) + prod(x) + prod(w)) * size
    written = (prod(x) if mask[0] else 0) + (prod(w) if mask[1] else 0)
    gradients = "+".join(g for g, on in (("input", mask[0]), ("weight", mask[1])) if on) or "bias"
    label = " ".join([f"{name} ({gradients} gradient{'s' if passes > 1 else ''})", _text(*grad), _text(x, x_type),
                      _text(w, w_type)])
    return {"flops": 2 * macs * passes, "bytes": read + written * size, "label": label}
