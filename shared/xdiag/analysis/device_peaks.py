"""Checked device peaks: which accelerator ran the profile, and its datasheet FLOP/s and HBM bandwidth.

The peaks a profile records are not always right (XProf records about half the MI300X's HBM bandwidth, and
none for a V100's FLOP/s), so every roofline figure xdiag shows is measured against a peak whose source is
named: the vendor's datasheet where the device is identified, else what the profile recorded. A recorded peak
that disagrees with the datasheet is reported, never silently used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xdiag.text_numbers import plain_number

RECORDED_MISMATCH_RATIO = 1.15
"""A recorded peak more than 15% away from the datasheet's is called out as wrong."""


@dataclass(frozen=True)
class Datasheet:
    model: str
    peak_tflops: float  # dense bf16 (fp16 on V100, which has no bf16), tensor/matrix units, no sparsity
    hbm_gb_per_s: float  # 1 GB = 1e9 bytes
    source: str
    f32_matmul_tflops: float | None = None
    """Dense matrix rate with f32 operands, from the same page: TF32 tensor cores (A100 on, MI300X/MI325X), FP32
    matrix cores (MI250X), FP32 CUDA cores (V100). None where the page gives none (TPUs: the MXU multiplies in
    bf16, f32 at higher precision in several bf16 passes; the 16-bit peak is their roof)."""
    int8_tops: float | None = None
    """Dense int8 matrix rate (tera-operations/s), from the same page; None where it gives none."""
    fp8_tflops: float | None = None
    """Dense fp8 matrix rate, from the same page; None where it gives none (or the device has no fp8 units)."""


DATASHEETS = {
    d.model: d
    for d in (
        # Google Cloud TPU system architecture pages (per chip, bf16).
        Datasheet("TPU v4", 275, 1200, "https://cloud.google.com/tpu/docs/v4", int8_tops=275),
        Datasheet("TPU v5e", 197, 819, "https://cloud.google.com/tpu/docs/v5e", int8_tops=394),
        Datasheet("TPU v5p", 459, 2765, "https://cloud.google.com/tpu/docs/v5p", int8_tops=918),
        Datasheet("TPU v6e", 918, 1638, "https://cloud.google.com/tpu/docs/v6e", int8_tops=1836),
        Datasheet("TPU7x", 2307, 7380, "https://cloud.google.com/tpu/docs/tpu7x", fp8_tflops=4614),
        # NVIDIA data-center datasheets (SXM parts; dense Tensor Core bf16, fp16 on V100; TF32 dense, half the
        # "with sparsity" figure the pages give; FP32 on V100).
        Datasheet("V100", 125, 900, "https://www.nvidia.com/en-us/data-center/v100/", 15.7),
        Datasheet("A100", 312, 2039, "https://www.nvidia.com/en-us/data-center/a100/", 156, int8_tops=624),
        Datasheet("H100", 989, 3350, "https://www.nvidia.com/en-us/data-center/h100/", 494.7, int8_tops=1979, fp8_tflops=1979),
        Datasheet("H200", 989, 4800, "https://www.nvidia.com/en-us/data-center/h200/", 494.7, int8_tops=1979, fp8_tflops=1979),
        Datasheet("B200", 2250, 8000, "https://www.nvidia.com/en-us/data-center/hgx/", 1125, int8_tops=4500, fp8_tflops=4500),
        # AMD Instinct product pages (dense bf16 matrix peak; TF32 matrix, FP32 matrix on MI250X).
        Datasheet("MI250X", 383, 3277, "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html", 95.7),
        Datasheet("MI300X", 1307.4, 5300, "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html", 653.7,
                  int8_tops=2614.9, fp8_tflops=2614.9),
        Datasheet("MI325X", 1307.4, 6000, "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html", 653.7,
                  int8_tops=2614.9, fp8_tflops=2614.9),
        Datasheet("MI350X", 2307.2, 8000, "https://www.amd.com/en/products/accelerators/instinct/mi350/mi350x.html"),
        Datasheet("MI355X", 2516.6, 8000, "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html"),
    )
}

_TPU_NAMES = (
    ("v6 lite", "TPU v6e"), ("v6e", "TPU v6e"), ("v5 lite", "TPU v5e"), ("v5e", "TPU v5e"), ("v5p", "TPU v5p"),
    ("7x", "TPU7x"), ("v7", "TPU7x"), ("ironwood", "TPU7x"), ("v5", "TPU v5p"), ("v4", "TPU v4"),
)
_GIB = 1024**3


def identify(stats: dict[str, Any]) -> str | None:
    """The datasheet model of a device plane, from the stats the profiler recorded on it; None if unknown."""
    text = " ".join(str(stats.get(k, "")) for k in ("device_type_string", "gpu_device_name", "device_type")).lower()
    if "tpu" in text:
        return next((model for key, model in _TPU_NAMES if key in text), None)
    for model in ("MI355X", "MI350X", "MI325X", "MI300X", "MI250X", "B200", "H200", "H100", "A100", "V100"):
        if model.lower() in text:
            return model
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    memory_gib = (_recorded_number(stats.get("memory_size")) or 0) / _GIB
    if major is None:
        return None
    if str(stats.get("device_vendor", "")).lower().startswith("amd"):
        # ROCm reports the gfx target as the compute capability: gfx90a, gfx942, gfx950.
        if (major, minor) == (9, 4):
            return "MI325X" if memory_gib > 200 else "MI300X" if memory_gib > 150 else None
        if (major, minor) == (9, 5):
            # The same gfx950 die: the MI355X clocks to 2.4 GHz, the MI350X to 2.2 GHz (clock_rate is in kHz).
            return "MI355X" if (_recorded_number(stats.get("clock_rate")) or 0) >= 2.3e6 else "MI350X"
        if (major, minor) == (9, 0):
            return "MI250X" if memory_gib > 60 else None
        return None
    if (major, minor) == (7, 0):
        return "V100"
    if (major, minor) == (8, 0):
        return "A100"
    if (major, minor) == (9, 0):
        return "H200" if memory_gib > 100 else "H100"
    if (major, minor) == (10, 0):
        return "B200"
    return None


def _vendor(model: str | None, stats: dict[str, Any]) -> str | None:
    if model:
        return "Google" if "TPU" in model else "AMD" if model.startswith("MI") else "NVIDIA"
    vendor = str(stats.get("device_vendor", "")).lower()
    return "AMD" if vendor.startswith("amd") else "NVIDIA" if vendor.startswith("nvidia") else None


def recorded_peaks(stats: dict[str, Any]) -> tuple[float | None, float | None]:
    """(FLOP/s, HBM bytes/s) as the profile recorded them on the device plane; None where absent or 0."""
    flops = _recorded_number(stats.get("peak_teraflops_per_second"))
    bandwidth = _recorded_number(stats.get("peak_hbm_bw_gigabytes_per_second"))
    measured_bandwidth = _recorded_number(stats.get("memory_bandwidth"))
    flops_per_s = flops * 1e12 if flops else None
    bytes_per_s = bandwidth * 1e9 if bandwidth else measured_bandwidth
    return flops_per_s, bytes_per_s


def _recorded_number(value: Any) -> float | None:
    """A positive, finite stat; a stat written as text reads through text_numbers, and what is no number
    ('²', 'nan', '1e999') is None: absent, so the datasheet is used."""
    if isinstance(value, str):
        value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value < math.inf else None


def checked_peaks(stats: dict[str, Any], xprof_flops_gflops: float | None = None,
                  xprof_hbm_gibs: float | None = None) -> dict[str, Any]:
    """The peaks to measure against, each with its source, and what disagrees.

    Returns: device_model (or None), peak_flops_per_s, peak_hbm_bytes_per_s, ridge_flop_per_byte,
    peak_f32_matmul_flops_per_s and f32_matmul_basis (the roof of ops with f32 operands; None where unknown),
    peak_int8_ops_per_s and peak_fp8_flops_per_s (the roofs of 8-bit matrix products; None where the datasheet
    gives none),
    flops_source / bandwidth_source ("datasheet <url>" | "recorded in the profile" | "XProf's roofline_model"),
    recorded_* (what the profile and XProf said), peak_warnings (one sentence per disagreement).
    """
    model = identify(stats)
    sheet = DATASHEETS.get(model) if model else None
    recorded_flops, recorded_bw = recorded_peaks(stats)
    if recorded_flops is None and xprof_flops_gflops:
        recorded_flops = xprof_flops_gflops * 1e9
    if recorded_bw is None and xprof_hbm_gibs:
        recorded_bw = xprof_hbm_gibs * _GIB
    warnings = []
    out: dict[str, Any] = {
        "device_model": model,
        "vendor": _vendor(model, stats),
        "recorded_peak_tflops": round(recorded_flops / 1e12, 1) if recorded_flops else None,
        "recorded_peak_hbm_gb_per_s": round(recorded_bw / 1e9, 1) if recorded_bw else None,
    }
    if sheet:
        flops, bandwidth = sheet.peak_tflops * 1e12, sheet.hbm_gb_per_s * 1e9
        out.update(flops_source=f"datasheet ({sheet.source})", bandwidth_source=f"datasheet ({sheet.source})")
        for key, recorded, truth, unit, scale in (("flops_source", recorded_flops, flops, "TFLOP/s", 1e12),
                                                  ("bandwidth_source", recorded_bw, bandwidth, "GB/s", 1e9)):
            if recorded and abs(recorded / truth - 1) >= 0.005:
                # Say which figure is used where the profile's own differs (TPU v5e records 202.7 TFLOP/s, the
                # datasheet says 197): XProf's utilisations divide by the recorded one.
                out[key] += (f": {truth / scale:,.4g} {unit}, used rather than the {recorded / scale:,.4g} {unit} the "
                             "profile records (XProf's utilisation divides by that) because it is the vendor's figure "
                             "for this model, the same on every profile")
        for article, what, recorded, truth, unit, scale in (
            ("a", "peak FLOP rate", recorded_flops, flops, "TFLOP/s", 1e12),
            ("an", "HBM bandwidth", recorded_bw, bandwidth, "GB/s", 1e9),
        ):
            if recorded and not (1 / RECORDED_MISMATCH_RATIO <= recorded / truth <= RECORDED_MISMATCH_RATIO):
                warnings.append(
                    f"the profile records {article} {what} of {recorded / scale:,.0f} {unit} for this {model}, "
                    f"{recorded / truth:.0%} of the datasheet's {truth / scale:,.0f} {unit}; efficiencies here use "
                    "the datasheet, and any computed against the recorded figure are off by that ratio"
                )
    else:
        flops, bandwidth = recorded_flops, recorded_bw
        out.update(flops_source="recorded in the profile" if flops else None,
                   bandwidth_source="recorded in the profile" if bandwidth else None)
        if flops or bandwidth:
            warnings.append("the device is not in xdiag's datasheet table, so its recorded peaks are used unchecked")
    f32_flops = sheet.f32_matmul_tflops * 1e12 if sheet and sheet.f32_matmul_tflops else None
    if f32_flops:
        out["f32_matmul_basis"] = f"f32 operands: {sheet.f32_matmul_tflops:g} TFLOP/s (TF32/FP32 matrix rate, datasheet)"
    elif model and "TPU" in model:
        f32_flops = flops
        out["f32_matmul_basis"] = ("f32 operands: the MXU's bf16 peak (it multiplies in bf16; f32 at higher "
                                   "precision takes several passes)")
    for key, rate in (("peak_int8_ops_per_s", sheet and sheet.int8_tops), ("peak_fp8_flops_per_s", sheet and sheet.fp8_tflops)):
        out[key] = rate * 1e12 if rate else None
    out.update(
        peak_f32_matmul_flops_per_s=f32_flops,
        peak_flops_per_s=flops,
        peak_hbm_bytes_per_s=bandwidth,
        peak_tflops=round(flops / 1e12, 1) if flops else None,
        peak_hbm_gb_per_s=round(bandwidth / 1e9, 1) if bandwidth else None,
        ridge_flop_per_byte=round(flops / bandwidth, 1) if flops and bandwidth else None,
        peak_warnings=warnings,
    )
    return out


def session_peaks(session) -> dict[str, Any] | None:
    """checked_peaks() of the session's first device with events (cached); None on CPU, which records none."""
    if "device_peaks" not in session.cache:
        planes = session.device_planes(with_events=True) or session.device_planes()
        session.cache["device_peaks"] = checked_peaks(planes[0].stats) if planes else None
    return session.cache["device_peaks"]
