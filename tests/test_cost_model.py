"""The cost model on the ops that dominate real profiles: each rate is checked against a hand calculation
written here, from the op's shapes as the profile's HLO gives them and the kernel time measured straight from
the profile's device events (not from the tools' tables)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import H200, shared_profile
from xdiag.profile.reader import read_session
from xdiag.tools.registry import run_tool

TOLERANCE = 0.15


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
    assert roofline["costed_op_time_percent"] > 95  # the transposes and the convolution, not the transposes alone


def test_custom_fusions_are_named_after_what_emits_them_not_all_triton(cpu_profiles):
    # XLA marks every custom fusion kCustom: Triton's on GPU, YNNPACK's (`__ynn_fusion`) on XLA:CPU.
    cpu = run_tool(read_session([cpu_profiles["healthy"]]), "get_custom_kernels").detail["kernels"]
    fusions = [k for k in cpu if k["target"].startswith("__")]
    assert fusions and not any("Triton" in k["kind"] for k in cpu)
    assert all(k["kind"] == "YNNPACK (XLA:CPU fusion)" for k in fusions if "ynn" in k["target"])
    gpu = run_tool(read_session([H200 / "input_bound.xplane.pb"]), "get_custom_kernels").detail["kernels"]
    assert gpu and all(k["kind"] == "Triton (XLA fusion)" and "triton" in k["target"] for k in gpu)
