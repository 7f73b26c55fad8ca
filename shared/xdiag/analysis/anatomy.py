"""Program anatomy: what the program is, in its own words, from the profile alone.

From the op rows (their HLO op names, custom-call targets, framework ops with their jvp/transpose scopes, shapes,
categories, loop bodies) and the Python files the HLO's stacks name, recognise the components that hold the op time
(attention that materialises its S×S scores or a fused attention kernel and which one, paged and ragged paged
attention, grouped matmul, projection matmuls, embedding gathers, recurrent loops of dependent steps, convolutions,
norms and elementwise work, the optimizer's update, collectives, host transfers), the phase (training or inference,
and where the profile says it, decode or prefill) and the framework (JAX, Flax linen / NNX, Keras 3, Hugging Face,
PyTorch, PyTorch/XLA). The phase is "unknown" where only op-by-op kernels ran (TensorFlow, eager PyTorch) and none
names a backward pass: their absence proves nothing there. The levers (xdiag.investigators.levers) are chosen
against this, so a decode trace is not told to change its optimizer and a Pallas kernel is not told to become one.

Each component is a share of op time (the sum of its ops' execution time over all ops' time), the same share
get_hlo_op_profile's rows give.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from xdiag.analysis.attention_hlo import SCORES_MIN

COMPONENTS = {
    "ragged_paged_attention": "ragged paged attention (Pallas kernel)",
    "paged_attention": "paged attention (Pallas kernel)",
    "fused_attention": "fused attention kernel",
    "materialised_attention": "attention that materialises its S×S scores",
    "grouped_matmul": "grouped matmul (megablox gmm/tgmm)",
    "recurrent_loop": "recurrent loop of dependent steps",
    "matmul": "MLP and projection matmuls",
    "convolution": "convolutions",
    "embedding": "embedding gathers and scatter-adds",
    "norm_elementwise": "norms and elementwise ops",
    "optimizer_update": "optimizer update",
    "collective": "collectives",
    "host_transfer": "transfers between host and device",
    "data_movement": "copies and layout changes",
    "custom_kernel": "custom Pallas / Mosaic kernel",
    "host_callback": "host callbacks",
    "other": "other ops",
}
"""component key -> how a report names it."""

PALLAS_COMPONENTS = frozenset({"ragged_paged_attention", "paged_attention", "grouped_matmul", "custom_kernel"})
ATTENTION_COMPONENTS = frozenset({"ragged_paged_attention", "paged_attention", "fused_attention",
                                  "materialised_attention"})

RECURRENT_OP_US_MAX = 20.0
"""Ops in a loop body at most this long per execution are the steps of a recurrence, not layers of a scanned stack."""

_FUSED_ATTENTION = re.compile(r"flash_attention|splash|flash_mha|fmha|flash_(?:fwd|bwd|attn)|cudnn.*(?:attn|sdpa|mha)"
                              r"|scaled_dot_product_(?:flash|efficient|cudnn)|_efficient_attention|mha_")
_SOFTMAX = re.compile(r"softmax|attention|attn|\bqk\b|bhqk|bqhd|bhqd|hqk|qhk")
_OPTIMIZER = re.compile(r"optax|adam|apply_updates|optimizer|\bsgd\b|lamb|adafactor|/update_moment|scale_by_")
_EMBEDDING = re.compile(r"gather|scatter|embed|\btake\b|index_select|one_hot")
_SHAPE = re.compile(r"(?<![\w])(?:[a-z]+\d*)\[([\d,]+)\]")

FRAMEWORK_FILES = (
    ("flax/nnx", "Flax NNX"),
    ("flax/linen", "Flax linen"),
    ("keras/", "Keras 3"),
    ("transformers/", "Hugging Face"),
    ("torch_xla", "PyTorch/XLA"),
    ("equinox/", "Equinox"),
    ("haiku/", "Haiku"),
)
"""(a path fragment of a library file the HLO's stacks name, the framework the program is written in); first match."""


def _dims(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in m.group(1).split(",") if d) for m in _SHAPE.finditer(text.replace(" ", ""))]


def scores_shape(row: dict) -> tuple[int, ...] | None:
    """The S×S array an op reads or writes ([batch, heads, S, S], or [batch·heads, S, S] under a softmax or attention
    name): the last two dimensions equal and at least SCORES_MIN; None where it has none."""
    text = f"{row.get('shape') or ''} {' '.join(str(s) for s in row.get('operand_shapes') or [])}"
    named = bool(_SOFTMAX.search(str(row.get("framework_op") or "").lower()))
    for dims in _dims(text):
        if len(dims) >= 3 and dims[-1] == dims[-2] >= SCORES_MIN and (len(dims) >= 4 or named):
            return dims
    return None


def attention_scores(row: dict) -> tuple[int, ...] | None:
    """The op's S×S scores where they are an attention's: where its program's HLO was read (the row's
    attention_key_lengths), S must be the key length of an attention that HLO computes (scores from a product, a
    softmax along the keys, a product with values); a square matrix a Cholesky factor or a kernel's exp reads is
    none. Where no HLO was read (a PyTorch trace's recorded shapes), the shapes alone."""
    scores = scores_shape(row)
    if scores is None or "attention_key_lengths" not in row:
        return scores
    return scores if scores[-1] in row["attention_key_lengths"] else None


def head_dim(row: dict, seq: int) -> int | None:
    """The head dimension of an attention op with S×S scores (S = `seq`): the last dimension of the 4-d q/k/v (or
    output) array beside the scores, one whose dimensions hold S but whose last is not S ([batch, seq, heads,
    head_dim] or [batch, heads, seq, head_dim]); None where the op shows no such array."""
    text = f"{row.get('shape') or ''} {' '.join(str(s) for s in row.get('operand_shapes') or [])}"
    for dims in _dims(text):
        if len(dims) == 4 and seq in dims[:-1] and dims[-1] != seq and dims[-2] != dims[-1]:
            return dims[-1]
    return None


def masked(row: dict, seq: int) -> bool:
    """The op reads a boolean S×S array: the scores are masked (causally, or by padding)."""
    text = f"{' '.join(str(s) for s in row.get('operand_shapes') or [])}".replace(" ", "")
    return any(m.group(0).startswith("pred") and len(d) >= 2 and d[-1] == d[-2] == seq
               for m in _SHAPE.finditer(text) for d in [tuple(int(x) for x in m.group(1).split(",") if x)])


_EINSUM_SPEC = re.compile(r"(?:^|[/(])([A-Za-z]+,[A-Za-z]+->[A-Za-z]+)(?=[)/]|$)")
JAX_NN_ATTENTION_SPECS = ("BTNH,BSNH->BNTS", "BNTS,BSNH->BTNH")
"""The einsums jax.nn.dot_product_attention's XLA implementation writes (jax/_src/nn/functions.py
_dot_product_attention_core): ops named with them are that call's, not the user's own einsums."""


def einsum_spec(row: dict) -> str | None:
    """The einsum spec an op's framework op names ('vmap(BTNH,BSNH->BNTS)/dot_general'), else None."""
    m = _EINSUM_SPEC.search(str(row.get("framework_op") or ""))
    return m.group(1) if m else None


def written_as(specs: dict[str, float]) -> str:
    """How the attention is written, from the einsum specs its ops are named with (spec -> share of op time)."""
    if not specs:
        return "matmul + softmax + matmul"
    if set(specs) <= set(JAX_NN_ATTENTION_SPECS):
        return ("jax.nn.dot_product_attention (its XLA implementation: einsum 'BTNH,BSNH->BNTS', softmax, einsum "
                "'BNTS,BSNH->BTNH')")
    ordered = sorted(specs, key=lambda spec: -specs[spec])[:2]
    ordered.sort(key=lambda spec: not _scores_einsum(spec))  # q·kᵀ first: both inputs end in what it contracts
    return " + softmax + ".join(f"einsum '{spec}'" for spec in ordered)


def _scores_einsum(spec: str) -> bool:
    """Both inputs end in a letter the einsum contracts over (q·kᵀ: 'bhqd,bhkd->bhqk'), as scores · v does not."""
    inputs, output = spec.split("->")
    first, second = inputs.split(",")
    contracted = (set(first) & set(second)) - set(output)
    return bool(first and second) and first[-1] in contracted and second[-1] in contracted


def component_of(row: dict) -> tuple[str, str | None]:
    """(component, kernel) of one op row of get_hlo_op_profile; the kernel: the library kernel's name where one runs."""
    op, fop = str(row.get("op") or ""), str(row.get("framework_op") or "")
    text, category = f"{op} {fop}".lower(), str(row.get("category") or "")
    opcode = str(row.get("opcode") or "")
    pallas = "pallas_call" in text or "tpu_custom_call" in text or (category == "custom_call" and "mosaic" in text)
    if "ragged_paged_attention" in text:
        return "ragged_paged_attention", "ragged_paged_attention"
    if "paged_attention" in text:
        return "paged_attention", "paged_attention"
    fused = _FUSED_ATTENTION.search(text)
    if fused and (category in ("custom_call", "attention") or pallas or opcode == "custom-call" or "fusion" in opcode):
        return "fused_attention", fused.group(0)
    words = text.replace("/", " ").replace("(", " ")
    if re.search(r"\bt?gmm\b|megablox", words) and (pallas or category == "custom_call"):
        return "grouped_matmul", "tgmm" if "tgmm" in text else "gmm"
    if category == "collective":
        return "collective", None
    if category in ("async_copy", "memcpy", "host_transfer"):
        return "host_transfer", None
    if category == "host_callback":
        return "host_callback", None
    if pallas:
        return "custom_kernel", op.split(".")[0]
    if category != "convolution" and "conv" not in fop.lower() and attention_scores(row) is not None:
        return "materialised_attention", None
    if opcode == "while" or (("/while/body" in fop or row.get("in_loop_body"))
                             and (row.get("avg_us") or 1e9) <= RECURRENT_OP_US_MAX and category != "collective"):
        return "recurrent_loop", None
    if _OPTIMIZER.search(fop.lower()):
        return "optimizer_update", None
    if category == "convolution":
        return "convolution", None
    if opcode in ("gather", "scatter") or _EMBEDDING.search(fop.lower().rsplit("/", 1)[-1]):
        return "embedding", None
    if category == "matmul":
        return "matmul", None
    if category in ("elementwise", "reduction", "convert", "fusion"):
        return "norm_elementwise", None
    if category in ("data_movement", "prefetch"):
        return "data_movement", None
    return "other", None


@dataclass
class Component:
    key: str
    share_percent: float = 0.0  # of op time
    ms: float = 0.0
    ops: list[str] = field(default_factory=list)  # the busiest, by op name
    kernel: str | None = None
    lines: dict[str, float] = field(default_factory=dict)  # the user's line -> its share of op time
    efficiency_weighted: float = 0.0  # Σ share × roofline efficiency, over the rows that have one
    efficiency_share: float = 0.0  # Σ share over those rows
    efficiency_is_upper_bound: bool = False
    bounds: dict[str, float] = field(default_factory=dict)  # memory | compute -> share
    backward_share: float = 0.0
    scores_shape: tuple[int, ...] | None = None
    head_dims: dict[int, float] = field(default_factory=dict)  # attention: head_dim -> share of the ops that show it
    masked: bool = False  # attention: an op reads a boolean S×S mask (a causal or padding mask)
    specs: dict[str, float] = field(default_factory=dict)  # attention: einsum spec -> share of op time
    pages_per_sequence: int | None = None  # paged attention: the KV pages each sequence's page_indices row holds

    def record(self) -> dict[str, Any]:
        efficiency = (round(self.efficiency_weighted / self.efficiency_share, 1) if self.efficiency_share else None)
        out: dict[str, Any] = {
            "component": self.key, "what": COMPONENTS[self.key],
            "share_of_op_time_percent": round(self.share_percent, 2),
            "ms": round(self.ms, 4), "ops": self.ops[:5],
            "roofline_efficiency_percent": efficiency,
            "bound": max(self.bounds, key=self.bounds.get) if self.bounds else None,
            "lines": [line for line, _ in sorted(self.lines.items(), key=lambda kv: -kv[1])[:3]],
        }
        if self.kernel:
            out["kernel"] = self.kernel
        if efficiency is not None and self.efficiency_is_upper_bound:
            out["efficiency_is_upper_bound"] = True
        if self.backward_share:
            out["backward_share_percent"] = round(self.backward_share, 2)
        if self.scores_shape:
            out["scores_shape"] = list(self.scores_shape)
        if self.head_dims:
            out["head_dim"] = max(self.head_dims, key=self.head_dims.get)
        if self.masked:
            out["masked"] = True
        if self.key == "materialised_attention":
            out["written_as"] = written_as(self.specs)
        if self.pages_per_sequence:
            out["pages_per_sequence"] = self.pages_per_sequence
        return out


def pages_per_sequence(row: dict) -> int | None:
    """JAX's Pallas paged_attention passes lengths (s32[batch]) then page_indices (s32[batch × pages per sequence],
    flattened) ahead of its other operands: the pages each sequence holds, which pages_per_compute_block must
    divide."""
    ints = []
    for shape in row.get("operand_shapes") or []:
        dims = _dims(str(shape)) if str(shape).startswith("s32[") else []
        if dims and len(dims[0]) == 1:
            ints.append(dims[0][0])
    if len(ints) >= 2 and ints[0] and ints[1] > ints[0] and ints[1] % ints[0] == 0:
        return ints[1] // ints[0]
    return None


def _line(row: dict) -> str | None:
    source = row.get("source")
    return source.get("line") if isinstance(source, dict) else None


def components(rows: Iterable[dict]) -> list[Component]:
    """The components the op rows make up, the largest share first."""
    found: dict[str, Component] = {}
    for row in rows:
        key, kernel = component_of(row)
        share = float(row.get("share_of_op_time_percent") or 0.0)
        c = found.setdefault(key, Component(key))
        c.share_percent += share
        c.ms += float(row.get("total_ms") or 0.0)
        if len(c.ops) < 5:
            c.ops.append(str(row.get("op")))
        c.kernel = c.kernel or kernel
        if (line := _line(row)) is not None:
            c.lines[line] = c.lines.get(line, 0.0) + share
        efficiency = row.get("roofline_efficiency_percent")
        if efficiency is not None and share:
            c.efficiency_weighted += share * float(efficiency)
            c.efficiency_share += share
            c.efficiency_is_upper_bound |= bool(row.get("rates_are_upper_bounds"))
        if row.get("bound"):
            c.bounds[str(row["bound"])] = c.bounds.get(str(row["bound"]), 0.0) + share
        if "transpose(" in str(row.get("framework_op") or ""):
            c.backward_share += share
        if key == "paged_attention":
            c.pages_per_sequence = c.pages_per_sequence or pages_per_sequence(row)
        if key == "materialised_attention":
            scores = attention_scores(row)
            c.scores_shape = c.scores_shape or scores
            if scores:
                if (dim := head_dim(row, scores[-1])) is not None:
                    c.head_dims[dim] = c.head_dims.get(dim, 0.0) + share
                c.masked |= masked(row, scores[-1])
            if (spec := einsum_spec(row)) is not None:
                c.specs[spec] = c.specs.get(spec, 0.0) + share
    return sorted(found.values(), key=lambda c: -c.share_percent)


def framework_of(base: str | None, library_files: Iterable[str]) -> str | None:
    """The framework the program is written in: the library files the HLO's stacks name refine the runtime the
    trace says (JAX -> Flax linen, Keras 3, ...)."""
    files = [f.replace("\\", "/") for f in library_files]
    for fragment, name in FRAMEWORK_FILES:
        if any(fragment in f for f in files):
            return name
    return base


def phase_of(rows: list[dict], comps: list[Component], program_names: Iterable[str],
             compiled: bool = True, facts: ProgramFacts | None = None) -> dict[str, Any]:
    """training (a backward pass: transpose(jvp(...)) scopes, or autograd ops) or inference, and for inference
    decode (a paged kernel holds time, or the program is named so) or prefill (attention over S×S scores)."""
    fops = " ".join(str(r.get("framework_op") or "") + " " + str(r.get("op") or "") for r in rows).lower()
    backward = sum(float(r.get("share_of_op_time_percent") or 0) for r in rows
                   if "transpose(" in str(r.get("framework_op") or "") or "backward" in str(r.get("op") or "").lower())
    shares = {c.key: c.share_percent for c in comps}
    if facts is not None and facts.host_training_event:
        return {"phase": "training", "backward_share_percent": round(backward, 2),
                "why": f"the host records {facts.host_training_event!r}, which only a training step runs"}
    if backward > 0 or "autograd" in fops or "optimizer.step" in fops or "gradients/" in fops:
        return {"phase": "training", "backward_share_percent": round(backward, 2),
                "why": "backward-pass ops (transpose(jvp(...)) scopes or autograd) hold "
                       f"{backward:.3g}% of op time"}
    names = " ".join(program_names).lower()
    if not compiled and facts is not None and facts.host_ops_recorded:
        return {"phase": "inference", "why": "the host's framework ops are recorded (aten::…) and none is autograd's "
                                             "or an optimizer's"}
    if not compiled:
        # Op-by-op kernels (TensorFlow, eager PyTorch) name no backward scope: their absence says nothing.
        return {"phase": "unknown", "why": "no backward-pass op names, but the kernels carry no compiled program's "
                                           "scopes (jvp/transpose) that would show one"}
    if shares.get("paged_attention", 0) + shares.get("ragged_paged_attention", 0) > 0:
        return {"phase": "inference", "step": "decode", "why": "no backward pass; a paged-attention kernel runs"}
    if re.search(r"decode|generate|sample", names):
        return {"phase": "inference", "step": "decode", "why": "no backward pass; the program is named for decoding"}
    if shares.get("materialised_attention", 0) > 0 or shares.get("fused_attention", 0) > 0:
        return {"phase": "inference", "step": "prefill",
                "why": "no backward pass; attention runs over whole sequences (S×S scores)"}
    return {"phase": "inference", "why": "no backward-pass ops in the profile"}


@dataclass
class ProgramFacts:
    """What the levers' premises are checked against, beside the components: read from the session by the tool."""

    framework: str | None = None  # the runtime the trace says (get_device_information)
    library_files: tuple[str, ...] = ()  # library files the HLO's stacks name
    program_names: tuple[str, ...] = ()  # HLO module names
    platform: str | None = None
    devices: int | None = None
    donated_arguments: int | None = None  # entry parameters an output aliases, in the busiest program; None: no HLO
    matmul_precision: str | None = None  # the dominant matmuls' operand precision, where above the default
    argument_copies: dict[str, Any] | None = None  # copies of entry parameters no output aliases (not donated)
    rematerialised_op_percent: float | None = None
    loop_trips_per_run: float | None = None
    host_training_event: str | None = None  # a host event that only training records (autograd, Optimizer.step)
    host_ops_recorded: bool = False  # the host's framework ops are in the trace (aten::…), so their absence speaks


def program_anatomy(rows: list[dict], facts: ProgramFacts) -> dict[str, Any]:
    """The anatomy record: components (largest first), phase, framework and the facts the levers' premises read."""
    comps = components(rows)
    framework = framework_of(facts.framework, facts.library_files)
    compiled = facts.framework == "PyTorch/XLA" or any(
        "jit(" in str(r.get("framework_op") or "") or str(r.get("module") or "").startswith(("jit_", "pjit_"))
        for r in rows[:50])
    phase = phase_of(rows, comps, facts.program_names, compiled, facts)
    pallas = sorted({c.kernel or c.key for c in comps if c.key in PALLAS_COMPONENTS})
    return {
        "framework": framework,
        "runtime": facts.framework,
        "platform": facts.platform,
        **phase,
        "components": [c.record() for c in comps if c.share_percent > 0 or c.ms > 0],
        "pallas_kernels": pallas,
        # One device in the trace but collectives among its ops: a rank's trace of a job on several devices.
        "devices": None if facts.devices == 1 and any(c.key == "collective" for c in comps) else facts.devices,
        "donated_arguments": facts.donated_arguments,
        "matmul_precision": facts.matmul_precision,
        "argument_copies": facts.argument_copies,
        "rematerialised_op_percent": facts.rematerialised_op_percent,
        "loop_trips_per_run": facts.loop_trips_per_run,
    }
