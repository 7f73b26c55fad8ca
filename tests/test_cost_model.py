"""The cost model on the ops that dominate real profiles: each rate is checked against a hand calculation
written here, from the op's shapes as the profile's HLO gives them and the kernel time measured straight from
the profile's device events (not from the tools' tables)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import H200, TESTS, shared_profile
from xdiag.investigators.health import health_snapshot
from xdiag.profile.reader import read_session
from xdiag.tools.registry import run_tool

TOLERANCE = 0.15
TPU_V5E = TESTS / "profiles" / "tpu_v5e"


def _kernel_time_s(session, keep) -> tuple[float, dict[str, int]]:
    """Seconds of the device kernels `keep(name, hlo_op)` selects, and how many of each kernel name ran."""
    seconds, counts = 0.0, {}
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            names = plane.names_of(line)
            hlo_op = line.strings.get("hlo_op")
            ops = [plane.strings[i] if i >= 0 else "" for i in hlo_op] if hlo_op is not None else [""] * len(line)
            mask = np.array([bool(keep(n, o)) for n, o in zip(names, ops)], dtype=bool)
            seconds += float(line.duration_ps[mask].sum()) / 1e12
            for name in names[mask]:
                counts[name] = counts.get(name, 0) + 1
    return seconds, counts


def _rows(session) -> list[dict]:
    result = run_tool(session, "get_hlo_op_profile", {"top_n": 200})
    assert result.ok, result.reason
    return result.detail["ops"]


def test_cublas_gemms_inside_a_cuda_graph_are_costed_from_the_custom_calls_that_launched_them():
    # H200 `healthy`: an MLP train step (x f32[4096,4096], hidden f32[4096,8192]→[8192,8192]×3, out [8192,4096])
    # whose 14 cuBLAS TF32 GEMMs per step run inside a CUDA graph: their hlo_op names the command buffer.
    session = read_session([H200 / "healthy.xplane.pb"])
    seconds, counts = _kernel_time_s(session, lambda name, op: "xmma_gemm" in name)
    steps = sum(counts.values()) / 14
    assert steps == 15
    # Per step, 2·M·N·K each: the forward pass 4096·8192·4096 (input layer), 3 × 4096·8192·8192, 4096·4096·8192
    # (output layer); the input gradients 4096·8192·4096 and 3 × 4096·8192·8192; the weight gradients
    # 4096·8192·4096 (input layer), 3 × 8192·8192·4096 and 8192·4096·4096 (output layer): 5 GEMMs of
    # 2·4096·8192·4096 FLOPs and 9 of twice that.
    flops_per_step = 2 * 4096 * 8192 * 4096 * (5 + 9 * 2)
    hand_rate = flops_per_step * steps / seconds
    assert 250e12 <= hand_rate <= 400e12  # ~320 TFLOP/s: an H200's TF32 tensor cores at about two thirds of peak

    gemms = [r for r in _rows(session) if r.get("opcode") == "custom-call" and r["category"] == "matmul"]
    assert len(gemms) == 14 and all(r["count"] == steps for r in gemms)
    flops = sum(r["flops_per_run"] * r["count"] for r in gemms)
    assert flops == pytest.approx(flops_per_step * steps)
    rate = flops / (sum(r["total_ms"] for r in gemms) / 1e3)
    assert rate == pytest.approx(hand_rate, rel=TOLERANCE)

    kpi = run_tool(session, "get_kpi_metrics").summary
    # The headline rate covers the whole op time now (the GEMMs were 92.5% of it and counted nothing before).
    assert kpi["achieved_gflops_per_s_during_ops"] * 1e9 == pytest.approx(hand_rate, rel=TOLERANCE)


def test_a_miopen_convolution_is_costed_from_its_dimension_numbers_and_counted_once_per_execution():
    # MI300X conv ×8: `cudnn-conv.1` (MIOpen under cuDNN's custom-call name) takes bf16[1,16,32,60,104] (N, C, D,
    # H, W) and a bf16[5120,16,1,2,2] kernel (O, I, D, H, W) to bf16[1,5120,34,31,53]; each execution launches an
    # im2col kernel, then its GEMM.
    session = read_session([shared_profile("gpu/mi300x_jax_conv_8gpu.xplane.pb")])
    seconds, counts = _kernel_time_s(session, lambda name, op: op == "cudnn-conv.1")
    executions = max(counts.values())  # the GEMM kernel runs once per execution; one im2col lost its hlo_op
    assert executions == 40 and sum(counts.values()) == 79
    # 2·N·outputs·C·R·S: every output element sums C=16 input features × a 1×2×2 window.
    flops_per_run = 2 * 1 * (5120 * 34 * 31 * 53) * 16 * (1 * 2 * 2)
    hand_rate = flops_per_run * executions / seconds

    conv = next(r for r in _rows(session) if r["op"] == "cudnn-conv.1")
    assert conv["count"] == executions and conv["flops_per_run"] == flops_per_run
    assert conv["achieved_gflops_per_s"] * 1e9 == pytest.approx(hand_rate, rel=TOLERANCE)
    assert "dimension numbers" in conv["cost_source"]
    # Its bytes: the input, the kernel and the output once each, so it sits on the memory side of the MI300X's
    # ridge (~247 FLOP/byte).
    moved = 2 * (16 * 32 * 60 * 104 + 5120 * 16 * 4 + 5120 * 34 * 31 * 53)
    assert conv["bytes_per_run"] == moved and conv["bound"] == "memory"

    roofline = run_tool(session, "get_roofline_model").summary
    assert roofline["costed_compute_op_time_percent"] > 95  # the transposes and the convolution, not the transposes alone


def test_custom_fusions_are_named_after_what_emits_them_not_all_triton(cpu_profiles):
    # XLA marks every custom fusion kCustom: Triton's on GPU, YNNPACK's (`__ynn_fusion`) on XLA:CPU.
    cpu = run_tool(read_session([cpu_profiles["healthy"]]), "get_custom_kernels").detail["kernels"]
    fusions = [k for k in cpu if k["target"].startswith("__")]
    assert fusions and not any("Triton" in k["kind"] for k in cpu)
    assert all(k["kind"] == "YNNPACK (XLA:CPU fusion)" for k in fusions if "ynn" in k["target"])
    gpu = run_tool(read_session([H200 / "input_bound.xplane.pb"]), "get_custom_kernels").detail["kernels"]
    assert gpu and all(k["kind"] == "Triton (XLA fusion)" and "triton" in k["target"] for k in gpu)


def _tpu_op_time_s(session, prefix: str) -> tuple[float, int]:
    """Seconds and executions of the TPU ops (the `XLA Ops` line's events) whose HLO name starts with `prefix`."""
    seconds, count = 0.0, 0
    for plane in session.device_planes(with_events=True):
        for line in plane.lines:
            if line.name != "XLA Ops":
                continue
            names = [(plane.event_display_names.get(k) or plane.event_names.get(k, "")).lstrip("%").split(" ")[0]
                     for k in line.metadata_id.tolist()]
            mask = np.array([n.startswith(prefix) for n in names], dtype=bool)
            seconds += float(line.duration_ps[mask].sum()) / 1e12
            count += int(mask.sum())
    return seconds, count


def test_a_pallas_matmul_is_costed_from_its_operand_shapes():
    # TPU v5e `pallas_small_blocks`: 8 Pallas products per step, f32[2048,1024]·f32[1024,2048] -> f32[2048,2048]
    # with small blocks. XLA's cost model records 0 FLOPs for a custom call; the HLO gives the operand shapes.
    session = read_session([TPU_V5E / "pallas_small_blocks.xplane.pb"])
    seconds, executions = _tpu_op_time_s(session, "small_block_matmul")
    assert executions == 8 * 10  # 8 products x 10 steps
    flops_per_run = 2 * 2048 * 2048 * 1024  # 2·M·N·K
    hand_rate = flops_per_run * executions / seconds

    rows = [r for r in _rows(session) if r["op"].startswith("small_block_matmul")]
    assert len(rows) == 8 and all(r["flops_per_run"] == flops_per_run for r in rows)
    assert all("matrix product" in r["cost_source"] for r in rows)
    rate = sum(r["flops_per_run"] * r["count"] for r in rows) / (sum(r["total_ms"] for r in rows) / 1e3)
    assert rate == pytest.approx(hand_rate, rel=TOLERANCE)
    # Far below the v5e's 197 TFLOP/s: the small blocks are the workload's problem, and the diagnosis sees it.
    assert hand_rate < 0.3 * 197e12
    profile = run_tool(session, "get_hlo_op_profile").summary
    assert profile["dominant_ops_roofline_efficiency_percent"] < 30 and not profile["dominant_ops_unmeasured"]


def _snapshot(session) -> dict:
    tools = ("get_step_trace", "get_hlo_op_profile", "get_kpi_metrics")
    return health_snapshot({name: run_tool(session, name) for name in tools})


def test_optimal_needs_the_dominant_ops_measured_at_30_percent_of_their_roof():
    # H200 healthy: the TF32 GEMMs that dominate are measured, against the TF32 roof (494.7 TFLOP/s).
    healthy = _snapshot(read_session([H200 / "healthy.xplane.pb"]))
    assert healthy.dominant_ops_roofline_efficiency_percent >= 30 and not healthy.dominant_ops_unmeasured
    assert not any("dominant" in r or "roofline" in r for r in healthy.unhealthy_because)
    # H200 recompilation: what dominates is XLA's autotuner (redzone checks, delay kernels), which no HLO names:
    # the snapshot says the efficiency is not measured and why, and the headline rate is left out with its reason
    # rather than computed over the 0.1% of op time whose FLOPs are known.
    session = read_session([H200 / "recompilation.xplane.pb"])
    snapshot = _snapshot(session)
    assert snapshot.dominant_ops_unmeasured and "FLOPs unknown" in snapshot.dominant_ops_unmeasured[0]
    assert any("no efficiency is measured" in r for r in snapshot.unhealthy_because)
    kpi = run_tool(session, "get_kpi_metrics").summary
    assert kpi["achieved_gflops_per_s_during_ops"] is None and kpi["achieved_rate_covers_op_time_percent"] < 50
    assert "compute op time" in kpi["achieved_rate_unavailable_because"]


def test_each_program_gets_the_time_of_the_kernels_it_launched():
    # MI300X GEMM: six `jit_dot` programs share one name; each one's hipBLASLt call is its own op time, and the
    # busiest is the one whose calls take the most (52.7% of op time), not a 0.8% dtype conversion.
    session = read_session([shared_profile("gpu/mi300x_jax_gemm.xplane.pb")])
    modules = run_tool(session, "list_hlo_modules")
    per_program: dict[str, float] = {}
    for row in _rows(session):
        per_program[row["module"]] = per_program.get(row["module"], 0.0) + row["total_ms"]
    rows = {r["module"]: r["op_time_ms"] for r in modules.detail["modules"]}
    assert {m: rows[m] for m in per_program if m in rows} == pytest.approx({m: t for m, t in per_program.items() if m in rows}, abs=1e-3)
    busiest = max(per_program, key=per_program.get)
    assert busiest.startswith("jit_dot(") and modules.summary["busiest_module"] == busiest
    assert modules.summary["busiest_module_share_percent"] > 50


# The backend config XLA:GPU gives a cuDNN flash attention call, as its own fused-MHA test writes it (batch 2, 6
# heads, 2048 tokens, head_dim 128); no profile here holds one, since none was captured on an NVIDIA GPU with it.
_FMHA_CONFIG = (
    '{"operation_queue_id":"0","wait_on_operation_queues":[],"cudnn_fmha_backend_config":{"algorithm":{"algo_id":"0",'
    '"math_type":"TENSOR_OP_MATH","tuning_knobs":{"17":"1","24":"0"},"is_cudnn_frontend":true,"workspace_size":"0"},'
    '"fmha_scale":2,"dropout_rate":0,"bmm1_dot_dimension_numbers":{"lhs_contracting_dimensions":["3"],'
    '"rhs_contracting_dimensions":["3"],"lhs_batch_dimensions":["0","1"],"rhs_batch_dimensions":["0","1"]},'
    '"bmm2_dot_dimension_numbers":{"lhs_contracting_dimensions":["3"],"rhs_contracting_dimensions":["2"],'
    '"lhs_batch_dimensions":["0","1"],"rhs_batch_dimensions":["0","1"]},"intermediate_tensor_shape":{'
    '"element_type":"BF16","dimensions":["2","6","2048","2048"],"tuple_shapes":[]},"mask_type":"CAUSAL"}}'
)


def test_a_fused_attention_call_is_costed_from_the_scores_its_config_names():
    from types import SimpleNamespace

    from xdiag.analysis.hlo_cost import attention_flops, instruction_cost
    from xdiag.profile.compact import module_from_record, module_record
    from xdiag.profile.reader import _attention
    from xdiag.profile.space import HloComputation, HloInstruction, HloModule

    read = _attention(SimpleNamespace(opcode="custom-call", custom_call_target="__cudnn$fmhaSoftmax",
                                      backend_config=_FMHA_CONFIG.encode()))
    assert read == {"attention_scores": (2, 6, 2048, 2048), "attention_causal": True}
    assert _attention(SimpleNamespace(opcode="custom-call", custom_call_target="__cublas$gemm",
                                      backend_config=_FMHA_CONFIG.encode())) == {}

    def array(name, dims):
        return HloInstruction(name, "parameter", "bf16", dims, (), (), "", "", "", ())

    qkv = [array(n, (2, 6, 2048, 128)) for n in ("q", "k", "v")]

    def call(target, causal):
        return HloInstruction("fmha", "custom-call", "tuple", (), (), ("q", "k", "v"), "", "", "", (),
                              tuple_shapes=(("bf16", (2, 6, 2048, 128)), ("u8", (0,))), custom_call_target=target,
                              attention_scores=(2, 6, 2048, 2048), attention_causal=causal)

    b, h, s, d = 2, 6, 2048, 128
    forward = 4 * b * h * s * s * d  # QKᵀ and PV: 2·B·H·Sq·Sk·D each
    for target, causal, expected in (("__cudnn$fmhaSoftmax", False, forward),
                                     ("__cudnn$fmhaSoftmax", True, forward / 2),  # the masked half is skipped
                                     ("__cudnn$fmhaSoftmaxBackward", False, 2.5 * forward)):  # five products
        ins = call(target, causal)
        computation = HloComputation("main", [*qkv, ins])
        assert attention_flops(ins, computation) == expected
        cost = instruction_cost(HloModule("m", 1, "main", {"main": computation}, "host0"), "fmha")
        assert cost["flops_known"] and cost["flops"] == expected and "fused attention" in cost["cost_source"]
        module = module_from_record(module_record(HloModule("m", 1, "main", {"main": computation}, "host0")))
        assert module.computations["main"].by_name["fmha"] == ins  # kept by the prepared session file as read
    # Scores that are not Q's (a config for other shapes): not costed rather than costed wrong.
    wrong = HloInstruction("fmha", "custom-call", "tuple", (), (), ("q", "k", "v"), "", "", "", (),
                           custom_call_target="__cudnn$fmhaSoftmax", attention_scores=(2, 6, 1024, 2048))
    assert attention_flops(wrong, HloComputation("main", [*qkv, wrong])) is None


def _attention_backward_record(name: str, layout: str, causal: bool) -> dict:
    """A fused attention backward's CPU-op args as Kineto writes them, built on the pattern of the forward records in
    ../shared/traces/kineto_TraceLens_h100_Qwen1.5-0.5B-Chat.json.gz (aten::_scaled_dot_product_flash_attention:
    bf16[16,16,559,64] Q, K and V, `Scalar` inputs with their values in Concrete Inputs, tensors with ""). No shared
    trace has a backward one: the inputs are those of the backward's own schema, (grad_out, query, key, value, out,
    logsumexp, ...), its causal flag where that schema puts it (custom_mask_type for the efficient kernel)."""
    from xdiag.profile.torch_op_cost import ATTENTION_BACKWARD_OPS

    shape = [16, 16, 559, 64] if layout == "BHSD" else [16, 559, 16, 64]
    flag_at = ATTENTION_BACKWARD_OPS[name][1][0]
    count = flag_at + 3
    dims = [shape, shape, shape, shape, shape, [16, 16, 559]] + [[] for _ in range(count - 6)]
    types = ["c10::BFloat16"] * 5 + ["float"] + ["Scalar"] * (count - 6)
    concrete = [""] * 6 + ["0"] * (count - 6)
    concrete[flag_at] = ("1" if causal else "0") if name == "aten::_efficient_attention_backward" else str(causal)
    return {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete}


@pytest.mark.parametrize("name", [
    "aten::_scaled_dot_product_flash_attention_backward", "aten::_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward", "aten::_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
])
def test_a_fused_attention_backward_is_two_and_a_half_forwards(name):
    """Q, K, V bf16 of batch 16, 16 heads, 559 tokens, head size 64: the forward is 4·B·H·S²·D = 20,478,754,816
    FLOPs (10,257,694,720 causal: the 156,520 of 559² score entries a causal mask keeps), the backward 2.5 times
    that, read from the backward's own inputs and flag."""
    from xdiag.profile.torch_op_cost import ATTENTION_BACKWARD_OPS, op_cost

    layout = ATTENTION_BACKWARD_OPS[name][0]
    full = op_cost(name, _attention_backward_record(name, layout, causal=False))
    causal = op_cost(name, _attention_backward_record(name, layout, causal=True))
    assert full["flops"] == 2.5 * 4 * 16 * 16 * 559 * 559 * 64 == 51_196_887_040
    assert causal["flops"] == 2.5 * 2 * 16 * 16 * (559 * 560 // 2) * 128
    assert "causal" in causal["label"] and "causal" not in full["label"]
    # Q, K, V, out and its gradient read, the three gradients written: 8 arrays of 16·16·559·64 bf16.
    assert full["bytes"] == 8 * 16 * 16 * 559 * 64 * 2
    unknown = _attention_backward_record(name, layout, causal=True)
    unknown["Concrete Inputs"] = []
    assert "causal" in op_cost(name, unknown)["reason"]
