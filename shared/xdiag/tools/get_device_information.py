"""get_device_information: what hardware and software produced this profile?"""

from __future__ import annotations

from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.op_table import device_op_counts
from xdiag.analysis.xprof.session_views import try_view
from xdiag.profile.space import Session
from xdiag.profile.trace_json import KINETO, trace_format
from xdiag.tools.common import host_plane_source
from xdiag.tools.registry import ToolOutput, tool

_DEVICE_STATS = (
    "device_type_string", "gpu_device_name", "peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second", "core_count",
    "clock_rate", "memory_bandwidth", "memory_size", "compute_cap_major", "compute_cap_minor", "device_vendor",
)


@tool(
    "get_device_information",
    "Device type and count, per-device peak FLOP/s, memory size and bandwidth as the profile records them, "
    "and the framework versions; for CPU profiles the number of XLA:CPU devices.",
)
def get_device_information(session: Session) -> ToolOutput:
    """summary: platform, framework (JAX | TensorFlow | PyTorch/XLA | None), read_from (the trace format, where the
    session was read from a Chrome trace rather than an xplane), device_type, device_count,
    devices_with_events, the recorded stats (peak_teraflops_per_second, peak_hbm_bw_gigabytes_per_second,
    memory_size, memory_bandwidth, compute_cap_{major,minor}, core_count, clock_rate), versions, and on TPU/GPU the checked peaks:
    device_model, vendor, peak_tflops, peak_hbm_gb_per_s, ridge_flop_per_byte, flops_source / bandwidth_source
    (datasheet with its URL, or recorded), recorded_peak_*, peak_warnings, peak_int8_tflops / peak_fp8_tflops (the
    datasheet's 8-bit matrix peaks, the roof of int8/fp8 work). detail: per-device stats, xprof view."""
    versions: dict[str, str] = {}
    for plane in session.planes:
        if plane.name == "/host:metadata":
            versions.update({k: str(v) for k, v in plane.stats.items() if k.endswith("_version")})
    devices = []
    for plane in session.device_planes():
        devices.append(
            {"host": plane.host, "plane": plane.name, "events": plane.event_count,
             **{k: v for k, v in plane.stats.items() if k in _DEVICE_STATS}}
        )
    summary: dict = {"platform": session.platform, "versions": versions, "framework": framework(session)}
    if trace_format(session):
        summary["read_from"] = trace_format(session)
    if devices:
        first = devices[0]
        summary.update(
            device_count=len(devices),
            devices_with_events=sum(1 for d in devices if d["events"]),
            device_type=first.get("device_type_string") or first.get("gpu_device_name") or first.get("device_vendor") or session.platform,
        )
        for key in ("peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second", "core_count",
                    "memory_size", "memory_bandwidth", "compute_cap_major", "compute_cap_minor", "clock_rate"):
            if first.get(key) is not None:
                summary[key] = first[key]
        peaks = session_peaks(session) or {}
        summary.update({k: peaks.get(k) for k in ("device_model", "vendor", "peak_tflops", "peak_hbm_gb_per_s",
                                                   "ridge_flop_per_byte", "flops_source", "bandwidth_source",
                                                   "recorded_peak_tflops", "recorded_peak_hbm_gb_per_s", "peak_warnings")})
        # The 8-bit matrix peaks (where the datasheet gives them): the roof int8/fp8 work is read against.
        summary.update({name: round(peaks[key] / 1e12, 1) for name, key in (("peak_int8_tflops", "peak_int8_ops_per_s"),
                                                                             ("peak_fp8_tflops", "peak_fp8_flops_per_s"))
                        if peaks.get(key)})
        detail = {"devices": devices}
        view, reason = try_view(session, "device_information")
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
        return ToolOutput(summary, detail, "profile device planes")
    cpu_devices = list(device_op_counts(session))
    summary.update(device_type="CPU (PyTorch)" if trace_format(session) == KINETO else "CPU (XLA:CPU)",
                   device_count=len(cpu_devices), devices_with_events=len(cpu_devices))
    threads = sorted({line.name for p in session.host_planes() for line in p.lines if line.name.startswith("tf_XLA")})
    detail = {
        "devices": cpu_devices,
        "xla_cpu_threads": len(threads),
        "not_available": {"peak_flops": "a CPU profile records no peak FLOP/s or memory bandwidth"},
    }
    return ToolOutput(summary, detail, host_plane_source(session))


FRAMEWORK_MARKS = ("PjitFunction", "PmapFunction", "__inference_", "__forward_", "aten::", "torch_xla")
"""The beginnings of host event names that framework() looks for (a host summary keeps one name of each)."""


def framework(session: Session) -> str | None:
    """The framework that produced the profile, from what it left in the trace; None when nothing says."""
    if trace_format(session) == KINETO:
        return "PyTorch"  # eager PyTorch: Kineto traces come from torch.profiler (PyTorch/XLA writes xplanes)
    names = {m.name for m in session.hlo_modules}
    if any(n.startswith("SyncTensorsGraph") for n in names):
        return "PyTorch/XLA"
    device_lines = {line.name for plane in session.device_planes(with_events=True) for line in plane.lines}
    if "TensorFlow Ops" in device_lines and not names:
        return "TensorFlow"
    host_names = {n for plane in session.host_planes() for n in plane.event_names.values()}
    if any(n.startswith(("PjitFunction", "PmapFunction")) for n in host_names) or any(n.startswith(("jit_", "pjit_")) for n in names):
        return "JAX"
    if "TensorFlow Ops" in device_lines or any(n.startswith(("__inference_", "__forward_")) for n in host_names):
        return "TensorFlow"
    if any(n.startswith(("aten::", "torch_xla")) for n in host_names):
        return "PyTorch/XLA"
    return None
