"""The lever catalogue: the changes a fix can lead with, as data, each checked against the program before it is offered.

A lever fits a (component, finding, framework) of the program's anatomy (xdiag.analysis.anatomy, the tool
get_program_anatomy); its premises are read from that anatomy (already a Pallas kernel, already donated, inference or
training, device count, matmul precision, …). A lever whose premise the profile contradicts is not offered; one whose
premise the profile cannot show is offered with what to check. Its change is written in the framework's own API,
every name and parameter as the library's source spells it (jax 0.10.2's jax.experimental.pallas.ops.tpu, jax.nn,
jax.lax, jax.checkpoint_policies); its gain is a range over the measured gap it closes (`gain`: the fraction of the
gap the change recovered on the chip, low and high). Both investigators read the same candidates: the rule engine
leads each finding's fix with the best one, and Gemini's prompt carries them (`candidates_record`).

Adding a lever is one entry in LEVERS and its trial (docs/howto/add-a-lever.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JAX_CODE = ("JAX", "Flax linen", "Flax NNX", "Hugging Face", "Equinox", "Haiku")
"""Programs written in JAX's own API (jax.lax, jax.nn, Pallas) or a library that passes jax arrays through."""
JAX_FAMILY = (*JAX_CODE, "Keras 3")
TORCH_FAMILY = ("PyTorch", "PyTorch/XLA")

Check = Callable[[dict[str, Any], dict[str, Any]], "bool | None"]
"""(anatomy, component record) -> True (holds), False (the profile contradicts it), None (the profile cannot tell)."""


@dataclass(frozen=True)
class Premise:
    check: Check
    fails: str  # why the lever is not offered when the premise fails
    to_check: str = ""  # what the user checks where the profile cannot tell


def _phase(want: str) -> Check:
    return lambda a, c: a.get("phase") == want if a.get("phase") in ("training", "inference") else None


def _not_pallas(a: dict, c: dict) -> bool | None:
    return c.get("component") not in ("paged_attention", "ragged_paged_attention", "grouped_matmul", "custom_kernel",
                                      "fused_attention")


def _a_pallas(a: dict, c: dict) -> bool | None:
    component = c.get("component")
    return None if not component else component in ("paged_attention", "ragged_paged_attention", "grouped_matmul",
                                                    "custom_kernel", "fused_attention")


def _not_donated(a: dict, c: dict) -> bool | None:
    if a.get("argument_copies"):
        return True  # arguments copied because no output aliases them: whatever else is donated, these are not
    donated = a.get("donated_arguments")
    return None if donated is None else donated == 0


def _several_devices(a: dict, c: dict) -> bool | None:
    devices = a.get("devices")
    return None if devices is None else devices > 1


def _precision_above_default(a: dict, c: dict) -> bool | None:
    return bool(a.get("matmul_precision"))


def _long_loop(a: dict, c: dict) -> bool | None:
    trips = a.get("loop_trips_per_run")
    return None if trips is None else trips >= 16


def _below_roof(limit: float) -> Check:
    def check(a: dict, c: dict) -> bool | None:
        efficiency = c.get("roofline_efficiency_percent")
        return None if efficiency is None else efficiency < limit
    return check


def _head_dim_at_least(least: int) -> Check:
    def check(a: dict, c: dict) -> bool | None:
        head_dim = c.get("head_dim")
        return None if head_dim is None else head_dim >= least
    return check


def _not_keras(a: dict, c: dict) -> bool | None:
    return a.get("framework") != "Keras 3"


PREMISES: dict[str, Premise] = {
    "training": Premise(_phase("training"), "the profile has no backward pass: it is inference"),
    "inference": Premise(_phase("inference"), "the profile is a training step (it has a backward pass)"),
    "not_a_pallas_kernel": Premise(_not_pallas, "the time is already in a Pallas / fused kernel"),
    "a_pallas_kernel": Premise(_a_pallas, "the time is in ops XLA compiled, not in a Pallas kernel"),
    "not_donated": Premise(_not_donated, "the step's arguments are already donated (the HLO aliases them)",
                           "whether jax.jit(..., donate_argnums=...) names the state the step replaces"),
    "several_devices": Premise(_several_devices, "the job runs on one device", "how many devices the job uses"),
    "precision_above_default": Premise(_precision_above_default, "the matmuls already run at the default precision"),
    "long_loop": Premise(_long_loop, "the loop runs few trips per execution", "the loop's length"),
    "short_loop": Premise(lambda a, c: None if a.get("loop_trips_per_run") is None else a["loop_trips_per_run"] <= 128,
                          "the loop is too long to unroll in full (over 128 steps)", "the sequence length"),
    "far_below_roof": Premise(_below_roof(60.0), "the kernel already reaches 60% or more of its roof"),
    "not_keras": Premise(_not_keras, "the loop is a Keras layer's, which takes no scan argument"),
    "fetches_not_block": Premise(
        lambda a, c: None if not a.get("sync_event") else "block_until_ready" not in str(a["sync_event"]),
        "the host waits in block_until_ready on each call's result, not in a fetch of a value",
        "which call blocks: a float()/.item() on a device value, or a block_until_ready"),
    "head_dim_at_least_128": Premise(
        _head_dim_at_least(128),
        "the attention's head_dim is under 128 (read from its q/k/v shapes): on a TPU v5e, at head_dim 64 with the "
        "kernel's default 128 blocks, a Flax GPT-2 training step took 104 ms instead of 52 "
        "(docs/reference/measurements.md#flash-attention-at-head-dim-64), and no block size was measured that "
        "recovers it",
        "the attention's head_dim (the last dimension of q, k and v): at 64 the kernel doubled a training step"),
    "keras_mask_concrete": Premise(
        lambda a, c: None, "",
        "that the mask is a NumPy array (concrete), not built with keras.ops / jnp inside the jitted step, and that "
        "Keras is 3.15.1 or a version whose dot_product_attention source takes the same path"),
    "no_prefetch_yet": Premise(lambda a, c: None, "", "whether the input pipeline already prepares and copies the next "
                               "batch while a step runs (prefetching)"),
}


@dataclass(frozen=True)
class Lever:
    key: str
    component: str  # an anatomy component (xdiag.analysis.anatomy.COMPONENTS), or a finding's own subject
    findings: tuple[str, ...]  # the finding keys whose fix it can lead
    frameworks: tuple[str, ...]  # the frameworks its API belongs to
    platforms: tuple[str, ...]
    change: str  # the change, in the framework's API; {line} is the user's line, {kernel} the kernel
    premises: tuple[str, ...] = ()
    gain: tuple[float, float] = (0.3, 0.7)  # fraction of the measured gap the change recovers: low, high; above 1
    # only where the gap is a lower bound (a kernel rated from an upper bound of its work: ragged paged attention)
    gap: str = "below_roof"  # below_roof: share × (1 − efficiency); share: the component's whole share; finding: the
    # finding's stake; overlap: the shorter of the finding's stake and the device's compute share (work moved off the
    # critical path runs beside the device's); throughput: more work per step, not shorter steps (no step-time gain);
    # unmeasured: no trial has timed the change, so no gain is predicted (the user captures before and after)
    trial: str = ""  # the example program (shared/xdiag/examples) whose before/after capture exercises it
    order: int = 1  # 1: changes how the program runs; 2: changes what it computes (batch size): offered after


LEVERS: tuple[Lever, ...] = (
    Lever("flash_attention_tpu", "materialised_attention", ("materialised_attention", "memory_bound",
                                                            "low_kernel_efficiency"),
          JAX_CODE, ("TPU",),
          "replace the {attention} at {line} with the Pallas flash-attention kernel, which never writes the S×S "
          "scores to HBM: jax.experimental.pallas.ops.tpu.flash_attention.flash_attention(q, k, v, "
          "causal=True (False where the scores are not masked causally), sm_scale=1 / sqrt(head_dim)) with q, k, v "
          "as [batch, heads, seq, head_dim]; its default BlockSizes are 128 everywhere (BlockSizes.get_default), "
          "and no larger block was measured (for long or masked sequences, splash attention: "
          "jax.experimental.pallas.ops.tpu.splash_attention.make_splash_mha)",
          ("not_a_pallas_kernel", "head_dim_at_least_128"), gain=(0.5, 0.95), gap="share", trial="gpt_train"),
    Lever("keras_flash_attention", "materialised_attention", ("materialised_attention", "memory_bound",
                                                              "low_kernel_efficiency"),
          ("Keras 3",), ("TPU",),
          "replace the {attention} at {line} with keras.ops.dot_product_attention(query, key, value, "
          "mask=causal_mask, flash_attention=True), causal_mask a NumPy array built once outside the jitted step "
          "(causal_mask = np.tril(np.ones((batch, 1, seq, seq), dtype=bool)); np.ones(...) where the scores are "
          "not masked): that is the path of Keras 3.15.1 (keras/src/backend/jax/nn.py dot_product_attention) that "
          "reaches the Splash kernel under jit. Not is_causal=True, nor keras.layers.MultiHeadAttention("
          "use_causal_mask=True): Keras then builds the mask with jnp.tril, a Tracer under jit, and falls back to "
          "XLA attention, which still writes the scores (on a TPU v5e a Keras prefill step took 2.8× as long: "
          "docs/reference/measurements.md#keras-causal-attention)",
          ("not_a_pallas_kernel", "keras_mask_concrete"), gap="unmeasured"),
    Lever("cudnn_attention_gpu", "materialised_attention", ("materialised_attention", "memory_bound",
                                                            "low_kernel_efficiency"),
          JAX_CODE, ("GPU",),
          "replace the {attention} at {line} with jax.nn.dot_product_attention(q, k, v, "
          "is_causal=True, implementation=\"cudnn\") (q, k, v as [batch, seq, heads, head_dim], bf16 or fp16), "
          "a fused kernel that never writes the S×S scores to memory",
          ("not_a_pallas_kernel",), gain=(0.5, 0.9), gap="share", trial="gpt_train"),
    Lever("sdpa_torch", "materialised_attention", ("materialised_attention", "memory_bound", "low_kernel_efficiency"),
          TORCH_FAMILY, ("GPU", "TPU"),
          "replace the matmul + softmax + matmul at {line} with torch.nn.functional.scaled_dot_product_attention(q, "
          "k, v, is_causal=True), which dispatches to a fused flash / memory-efficient kernel",
          ("not_a_pallas_kernel",), gain=(0.5, 0.9), gap="share"),
    Lever("paged_attention_block", "paged_attention", ("memory_bound", "low_kernel_efficiency", "bounded_efficiency"),
          JAX_FAMILY, ("TPU",),
          "raise pages_per_compute_block{paged_block} in the jax.experimental.pallas.ops.tpu.paged_attention."
          "paged_attention(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=...) call at {line} (on "
          "a TPU v5e 16 → 64 took 32% off a decode step, 2 → 16 64.7% and 4 → 32 66.3% off two others: "
          "docs/reference/measurements.md#paged-attention-blocks; it must divide the pages per sequence), and give the KV cache larger pages so each copy "
          "from HBM is longer",
          ("far_below_roof",), gain=(0.4, 0.8), gap="below_roof", trial="paged_attention_decode"),
    Lever("ragged_paged_attention_block", "ragged_paged_attention",
          ("memory_bound", "low_kernel_efficiency", "bounded_efficiency"), JAX_FAMILY, ("TPU",),
          "leave num_kv_pages_per_block and num_queries_per_block out of the jax.experimental.pallas.ops.tpu."
          "ragged_paged_attention.ragged_paged_attention(...) call at {line}, so the kernel takes them from its tuned "
          "table (tuned_block_sizes.get_tuned_block_sizes; for shapes it has no entry for, 128 KV pages capped at the "
          "pages per sequence, and 32 queries): on a TPU v5e that took 55.3% off a serving step where raising them "
          "from 2 and 16 to 16 and 32 took 50.1%; where you set them, raise both (8 → 32 KV pages took 31%: "
          "docs/reference/measurements.md#ragged-paged-attention-blocks), so each grid step copies more KV pages "
          "per DMA",
          ("far_below_roof",), gain=(0.9, 1.4), gap="below_roof", trial="ragged_attention_serve"),
    Lever("megablox_tiling", "grouped_matmul", ("memory_bound", "low_kernel_efficiency", "bounded_efficiency"),
          JAX_FAMILY, ("TPU",),
          "pass larger tiles to megablox's grouped matmul at {line}: jax.experimental.pallas.ops.tpu.megablox.gmm("
          "lhs, rhs, group_sizes, tiling=(tm, tk, tn)) (default (128, 128, 128); e.g. (512, 1024, 1024) where they "
          "divide the problem: tk and tn multiples of 128, tm of 8), so each operand is re-read fewer times",
          ("far_below_roof",), gain=(0.6, 1.0), gap="below_roof", trial="megablox_small_tiles"),
    Lever("flash_block_sizes", "fused_attention", ("memory_bound", "low_kernel_efficiency", "bounded_efficiency"),
          JAX_FAMILY, ("TPU",),
          "raise the flash-attention tiles at {line}: flash_attention(q, k, v, block_sizes=BlockSizes(block_q=..., "
          "block_k_major=..., block_k=..., block_b=...)) (the backward pass has its own *_dkv and *_dq sizes), so "
          "K and V are re-read fewer times",
          ("far_below_roof",), gain=(0.2, 0.5), gap="below_roof", trial="flash_attention_train"),
    Lever("pallas_block_shape", "custom_kernel", ("memory_bound", "low_kernel_efficiency", "bounded_efficiency"),
          JAX_FAMILY, ("TPU", "GPU"),
          "give the pallas_call at {line} larger blocks: its in_specs/out_specs pl.BlockSpec(block_shape, index_map) "
          "set what each grid step copies into VMEM; larger blocks (multiples of (8, 128), within the VMEM limit) "
          "mean fewer grid steps, longer copies and fuller MXU passes",
          ("far_below_roof",), gain=(0.3, 0.7), gap="below_roof", trial="pallas_small_blocks"),
    Lever("scan_unroll", "recurrent_loop", ("latency_bound",),
          ("JAX", "Flax linen", "Flax NNX", "Equinox", "Haiku"), ("TPU", "GPU"),
          "unroll the recurrence's lax.scan at {line}: jax.lax.scan(step, carry, xs, unroll=8) (nn.scan(..., "
          "unroll=8) in Flax linen), so XLA schedules 8 dependent steps as one body and the per-op latency is paid "
          "once per 8 steps",
          ("long_loop", "not_keras"), gain=(0.15, 0.45), gap="below_roof", trial="lstm_scan"),
    Lever("keras_rnn_unroll", "recurrent_loop", ("latency_bound",),
          ("Keras 3",), ("TPU", "GPU", "CPU"),
          "unroll the Keras recurrent layer at {line}: keras.layers.LSTM(units, unroll=True) (GRU and SimpleRNN take "
          "the same argument), so its steps compile as one straight program instead of a loop of tiny dependent steps",
          ("short_loop",), gain=(0.15, 0.45), gap="below_roof", trial="lstm_scan"),
    Lever("batch_sequences", "recurrent_loop", ("latency_bound", "memory_bound", "low_kernel_efficiency"),
          JAX_FAMILY + TORCH_FAMILY, ("TPU", "GPU", "CPU"),
          "run more sequences, or other independent problems stacked along a new leading axis, through the loop at "
          "{line} at once (a larger batch): each dependent step costs about "
          "the same whatever its width, so k times the batch does about k times the work in the same time",
          ("long_loop",), gap="throughput", trial="lstm_batch64", order=2),
    Lever("matmul_precision", "matmul", ("low_kernel_efficiency", "memory_bound"), JAX_CODE, ("TPU", "GPU"),
          "let the matmuls at {line} run at the default precision: drop precision=jax.lax.Precision.HIGHEST there "
          "and any jax.config.update(\"jax_default_matmul_precision\", \"highest\") (or "
          "JAX_DEFAULT_MATMUL_PRECISION) the program sets, or wrap the step in "
          "jax.default_matmul_precision(\"bfloat16\"); f32 accumulation is kept",
          ("precision_above_default",), gain=(0.5, 0.85), gap="share", trial="f32_highest_matmul"),
    Lever("drop_per_step_fetch", "host", ("host_sync",), JAX_CODE, ("TPU", "GPU", "CPU"),
          "remove the per-step float(loss) / .item() / np.asarray(...) / jax.device_get at {line}: keep the "
          "metrics on the device and fetch them every N steps",
          ("fetches_not_block",), gain=(0.9, 1.0), gap="finding", trial="host_sync"),
    Lever("drop_per_step_item_torch", "host", ("host_sync",), TORCH_FAMILY, ("TPU", "GPU", "CPU"),
          "remove the per-step .item() / .cpu() / print of a tensor at {line}: accumulate on the device and read "
          "every N steps",
          ("fetches_not_block",), gain=(0.5, 1.0), gap="finding"),
    Lever("jit_whole_step", "dispatch", ("dispatch_overhead",), JAX_CODE, ("TPU", "GPU", "CPU"),
          "put the whole step at {line} under one jax.jit (decorate the function that runs the step's ops, and loop "
          "inside it with jax.lax.fori_loop / lax.scan where the Python loop drives many small ops), so each step "
          "launches one compiled program instead of one dispatch per op",
          (), gain=(0.5, 0.9), gap="finding", trial="dispatch_bound"),
    Lever("torch_compile_step", "dispatch", ("dispatch_overhead", "unfused_kernels"), ("PyTorch",), ("GPU",),
          "compile the model at {line}: model = torch.compile(model, mode=\"reduce-overhead\"), which fuses its "
          "elementwise chains and replays the step as a CUDA graph, one launch instead of one per kernel",
          (), gain=(0.3, 0.8), gap="finding"),
    Lever("donate_state", "memory", ("memory_pressure",), JAX_CODE, ("TPU", "GPU"),
          "donate the state the step replaces: jax.jit(step, donate_argnums=(0, 1)) (the parameters and optimizer "
          "state), so the updated copies reuse their buffers",
          ("training", "not_donated"), gain=(0.0, 0.0), gap="finding", trial="near_hbm_limit"),
    Lever("prefetch_to_device", "host_input", ("input_bound",), JAX_CODE, ("TPU", "GPU"),
          "put the next batch on the device while this step runs: a background thread that calls jax.device_put "
          "ahead of use (or flax.jax_utils.prefetch_to_device(iterator, 2)), and move per-step numpy work at {line} "
          "into the jitted step",
          ("no_prefetch_yet",), gain=(0.5, 0.9), gap="overlap", trial="input_bound"),
    Lever("dataloader_workers", "host_input", ("input_bound",), ("PyTorch",), ("GPU", "TPU", "CPU"),
          "DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2) and "
          "tensor.to(device, non_blocking=True), so batches are prepared while the step runs",
          ("training", "no_prefetch_yet"), gain=(0.5, 0.9), gap="overlap"),
)
"""The catalogue. Gains are the fraction of the measured gap the change recovered in the trials named (issue 61's
table: pages_per_compute_block 16 → 64 recovered 32% of a step whose gap, at most 15.4% of the roof, read 77%: 0.42;
num_kv_pages_per_block 8 → 32 recovered 31% of a step whose gap read 25% (100% of op time × (1 − at most 58.8%) × 60%
computing), 1.24 of a gap that is a lower bound; flash attention 95% of an einsum prefill whose attention held 97% of
op time; lax.scan(..., unroll=8) 14 points of an LSTM step whose gap read 56%: 0.25). Recalibrated on the pre-freeze
fix trials (bench/fix_trials.md; calibration data, not the acceptance figure): pages_per_compute_block 2 → 16 took 64.7%
of paged_decode_raw's step, whose gap read 73.4%: 0.88, beside issue 61's 0.42: paged 0.4–0.8, both within ×1.5 of
its middle; lstm_linen_train's per-step float(loss) removed took 14.7% of a step whose device idled 11.6% in the trace
(its 3 traced steps average 10.97 ms, the program's own loop 11.65): drop_per_step_fetch 0.9–1.0 of that idle share.
Every gain is capped at the share of the step the component holds (ragged_serve_raw read 76.1–118.4% before).
After the held-out trials (bench/fix_trials.md; calibration from here on): matmul_precision's gap is the matmuls'
whole share (at HIGHEST XLA:TPU runs an f32 matmul as 6 bf16 passes, at the default 1: up to 5/6 of their time).
A finding the idiom catalogue recognises (xdiag.idioms: argument_copies, needless_remat) carries its lever in its
entry: the change, its gain and where it was measured; this catalogue holds the levers of the bottleneck-class
findings."""

LEVERS_BY_KEY = {lever.key: lever for lever in LEVERS}

FINDING_COMPONENTS = {
    "latency_bound": "recurrent_loop",
    "needless_remat": "recompute",
    "host_sync": "host",
    "memory_pressure": "memory",
    "input_bound": "host_input",
    "materialised_attention": "materialised_attention",
    "dispatch_overhead": "dispatch",
    "unfused_kernels": "dispatch",
    "argument_copies": "argument_copies",
}
"""Findings whose subject is fixed; the others (memory_bound, low_kernel_efficiency, bounded_efficiency) are about the
component that holds their ops."""


@dataclass
class Offer:
    lever: Lever
    change: str
    unchecked: list[str]  # what to check, for each premise the profile cannot tell
    gain_percent: tuple[float, float] | None  # of step time, low and high
    gap_basis: str

    def record(self) -> dict[str, Any]:
        return {"lever": self.lever.key, "change": self.change, "to_check": self.unchecked,
                "gain_percent_of_step": list(self.gain_percent) if self.gain_percent else None,
                "gain_basis": self.gap_basis}


def _family(framework: str | None) -> str:
    return framework or "JAX"


def component_record(anatomy: dict[str, Any], key: str) -> dict[str, Any]:
    """The anatomy's record of a component, or of a finding's own subject the anatomy keeps (argument_copies)."""
    own = anatomy.get(key) if key in FINDING_COMPONENTS.values() else None
    if isinstance(own, dict):
        return {"component": key, **own}
    return next((c for c in anatomy.get("components") or [] if c.get("component") == key), {"component": key})


def subject_of(anatomy: dict[str, Any], finding: str, names: set[str]) -> str | None:
    """The component a finding is about: fixed for some findings (FINDING_COMPONENTS), else the one that holds the
    ops it names (`names`: op names from its staked ops and evidence)."""
    if finding in FINDING_COMPONENTS:
        return FINDING_COMPONENTS[finding]
    return component_of_ops(anatomy, names)


def evidence_ops(evidence: list[Any]) -> set[str]:
    """The op names a finding's evidence rows cite: a metric's first word ('paged_attention.4 achieved_gb_per_s'),
    and the names a dominant_ops row lists."""
    names = {str(e.metric).split(" ")[0] for e in evidence}
    return names | {n.split(" (")[0] for e in evidence if e.metric == "dominant_ops" for n in str(e.value).split(", ")}


def component_of_ops(anatomy: dict[str, Any], ops: set[str]) -> str | None:
    """The component that holds the most of `ops` (op names), the largest first; None where none does."""
    for c in anatomy.get("components") or []:
        if ops & set(c.get("ops") or []):
            return c["component"]
    return None


def candidates(anatomy: dict[str, Any], finding: str, component: str | None, compute_percent: float | None,
               finding_step_percent: float | None = None, at_line: str | None = None
               ) -> tuple[list[Offer], list[tuple[str, str]]]:
    """The levers for `finding` about `component` (at_line: the user's line where the finding names one that its
    component does not, as a host finding does), those that change how the program runs first, each by its gain, and
    the ones not offered with why."""
    platform, framework = anatomy.get("platform") or "CPU", _family(anatomy.get("framework"))
    record = component_record(anatomy, component or "")
    line = (record.get("lines") or [None])[0]
    offers: list[Offer] = []
    rejected: list[tuple[str, str]] = []
    for lever in LEVERS:
        if finding not in lever.findings or lever.component != (component or FINDING_COMPONENTS.get(finding)):
            continue
        if platform not in lever.platforms or framework not in lever.frameworks:
            continue
        unchecked, failed = [], None
        for name in lever.premises:
            premise = PREMISES[name]
            holds = premise.check(anatomy, record)
            if holds is False:
                failed = premise.fails
                break
            if holds is None and premise.to_check:
                unchecked.append(premise.to_check)
        if failed:
            rejected.append((lever.key, failed))
            continue
        gain, basis = _gain(lever, record, compute_percent, finding_step_percent)
        change = lever.change.format(line=at_line or line or "the line that calls it",
                                     kernel=record.get("kernel") or "",
                                     attention=record.get("written_as") or "attention",
                                     paged_block=_paged_block(record.get("pages_per_sequence")))
        offers.append(Offer(lever, change, unchecked, gain, basis))
    offers.sort(key=lambda o: (o.lever.order, -(o.gain_percent[1] if o.gain_percent else 0)))
    return offers, rejected


PAGED_BLOCK_MAX = 32
"""The pages_per_compute_block named: the largest a held-out trial realized its gain with (4 → 32, 66.3%,
paged_decode_nnx); issue 61's 16 → 64 realized 32% on another program, so larger may help too, unmeasured here."""


def _paged_block(pages: int | None) -> str:
    """The value to raise pages_per_compute_block to: the largest power of two up to PAGED_BLOCK_MAX that divides
    the pages per sequence (the kernel requires it to); "" where the profile does not show them or none does."""
    if not pages:
        return ""
    block = next((b for b in (PAGED_BLOCK_MAX >> i for i in range(3)) if pages % b == 0), None)
    return (f" to {block} (the largest power of two up to {PAGED_BLOCK_MAX} that divides the {pages} pages per "
            "sequence its page_indices hold)" if block else "")


def _gain(lever: Lever, record: dict, compute: float | None, finding_step: float | None
          ) -> tuple[tuple[float, float] | None, str]:
    """The gain range (percent of step time) of the lever: its gain fractions over the measured gap."""
    low, high = lever.gain
    share, efficiency = record.get("share_of_op_time_percent"), record.get("roofline_efficiency_percent")
    at_most = "at most " if record.get("efficiency_is_upper_bound") else ""
    if lever.gap == "throughput":
        return None, "more work per step in about the same time, not a shorter step"
    if lever.gap == "unmeasured":
        return None, "not measured: no trial has timed this change; capture a step before and after it"
    if lever.gap == "overlap":
        # Work moved off the critical path overlaps the device's: the step falls by at most the shorter of the two.
        if finding_step is None or compute is None:
            return None, "the finding's share of the step"
        gap = min(finding_step, compute)
        basis = (f"overlapped, the step falls by at most the shorter of the host's {finding_step:.3g}% and the "
                 f"device's {compute:.3g}%")
        return (round(gap * low, 1), round(gap * high, 1)), f"{low:g}–{high:g} of the gap: {basis}"
    if lever.gap == "finding":
        if finding_step is None:
            return None, "the finding's share of the step"
        gap, basis = finding_step, f"the {finding_step:.3g}% of the step the finding stakes"
    elif share is None or compute is None:
        return None, "not measured"
    elif lever.gap == "share":
        gap = share * compute / 100
        basis = f"the component's {share:.3g}% of op time × {compute:.3g}% of the step computing"
    else:
        if efficiency is None:
            return None, "its roofline efficiency is not measured"
        gap = share * (1 - efficiency / 100) * compute / 100
        basis = (f"{share:.3g}% of op time × (1 − {at_most}{efficiency:g}% of the roof) × {compute:.3g}% of the "
                 "step computing"
                 + (" (a lower bound of the gap: the efficiency is an upper bound)" if at_most else ""))
    if not high:
        return None, "it frees memory, not time"
    low_percent, high_percent = gap * low, gap * high
    if lever.gap != "finding" and share is not None and compute is not None and high_percent > share * compute / 100:
        # No change to a component takes more off the step than the component holds of it.
        held = share * compute / 100
        low_percent, high_percent = min(low_percent, held), held
        basis += f"; capped at the {held:.3g}% of the step the component holds"
    return (round(low_percent, 1), round(high_percent, 1)), f"{low:g}–{high:g} of the gap: {basis}"


def lead_sentence(offer: Offer) -> str:
    gain = (f" Expected: {offer.gain_percent[0]:g}–{offer.gain_percent[1]:g}% shorter steps "
            f"({offer.gap_basis})." if offer.gain_percent
            else f" Expected gain: {offer.gap_basis}." if offer.lever.gap == "unmeasured" else "")
    check = (" Check first: " + "; ".join(offer.unchecked) + "." if offer.unchecked else "")
    return "First, " + offer.change + "." + gain + check


def alternatives_sentence(offers: list[Offer]) -> str:
    if not offers:
        return ""
    parts = []
    for o in offers:
        premise = ", ".join(p.replace("_", " ") for p in o.lever.premises) or "none"
        parts.append(f"{o.change} (premise: {premise}" + (f"; check {'; '.join(o.unchecked)}" if o.unchecked else "")
                     + ")")
    return " Alternatives: " + "; ".join(parts) + "."


CONTRADICTIONS: tuple[tuple[str, str, str], ...] = (
    (r"zero_grad|fused optimizer|foreach|fused=True|gradient accumulation|DataLoader\(num_workers", "training",
     "training advice on an inference trace"),
    (r"a Pallas kernel (?:that|can)|write a Pallas kernel|use a Pallas kernel", "not_a_pallas_kernel",
     "Pallas advice for a Pallas kernel"),
    (r"pltpu\.emit_pipeline|for Pallas kernels,", "a_pallas_kernel", "Pallas tuning for ops that are no Pallas kernel"),
    (r"donate_argnums", "not_donated", "donation where the arguments are aliased"),
    (r"shard (?:them|parameters|the)|FSDP|ZeRO", "several_devices", "sharding on one device"),
)
"""(text in a fix, the premise it needs, what offering it there would be): a fix sentence the profile contradicts."""


def contradictions(text: str, anatomy: dict[str, Any], component: str | None) -> list[str]:
    """What in `text` (a fix) the anatomy contradicts: one entry per contradicted piece of advice."""
    record = component_record(anatomy, component or "")
    found = []
    for pattern, premise, what in CONTRADICTIONS:
        if re.search(pattern, text) and PREMISES[premise].check(anatomy, record) is False:
            found.append(what)
    return found


def without_contradictions(text: str, anatomy: dict[str, Any], component: str | None) -> str:
    """`text` with each clause (split on ';' and sentences) the anatomy contradicts left out."""
    clauses = re.split(r"(?<=;)\s+|(?<=\.)\s+(?=[A-Z])", text)
    kept = [c for c in clauses if not contradictions(c, anatomy, component)]
    out = re.sub(r";\s*$", ".", " ".join(kept).strip())
    return out[:1].upper() + out[1:]


def candidates_record(anatomy: dict[str, Any], compute_percent: float | None) -> list[dict[str, Any]]:
    """Every lever whose component holds at least 5% of op time and whose premises the profile does not contradict,
    per component: what Gemini's prompt carries, the same candidates the rule engine leads its fixes with."""
    out = []
    for c in anatomy.get("components") or []:
        if (c.get("share_of_op_time_percent") or 0) < 5:
            continue
        findings = {f for lever in LEVERS if lever.component == c["component"] for f in lever.findings}
        seen = set()
        for finding in sorted(findings):
            offers, rejected = candidates(anatomy, finding, c["component"], compute_percent)
            for o in offers:
                if o.lever.key not in seen:
                    seen.add(o.lever.key)
                    out.append({"component": c["component"], **o.record()})
            for key, why in rejected:
                if key not in seen:
                    seen.add(key)
                    out.append({"component": c["component"], "lever": key, "not_offered": why})
    return out
