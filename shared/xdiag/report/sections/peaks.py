"""The device's peak FLOP rate and memory bandwidth, as the tools state them: the page's limits for every rate it
shows, and the roofline section's roofs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from xdiag.model import ToolResult
from xdiag.report.format import Limits, unit_of


@dataclass(frozen=True)
class Peaks:
    flops_per_s: float | None
    bytes_per_s: float | None
    source: str  # where they come from, in words
    note: str = ""  # the tools' word on how far to trust them (checked against a datasheet, recorded …)
    eight_bit: tuple[tuple[str, float], ...] = ()  # ("int8", ops/s), ("fp8", FLOP/s) where the datasheet gives them

    @property
    def limits(self) -> Limits:
        return Limits(self.flops_per_s, self.bytes_per_s, self.eight_bit)

    @property
    def known(self) -> bool:
        return bool(self.flops_per_s and self.bytes_per_s)


_BASE = {"GFLOP/s": 1e9, "TFLOP/s": 1e12, "GiB/s": 2.0**30, "GB/s": 1e9, "B/s": 1.0}
# Checked peaks (datasheet, cross-checked with what the profile records) first; XProf's recorded ones after.
CHECKED_PEAKS = (("peak_tflops", "peak_hbm_gb_per_s"),)
PEAK_NOTES = ("flops_source", "bandwidth_source", "peak_warnings")
EIGHT_BIT_PEAK_KEYS = (("int8", "peak_int8_tflops"), ("fp8", "peak_fp8_tflops"))


def device_peaks(results: Mapping[str, ToolResult]) -> Peaks:
    """The device's peak FLOP rate and memory bandwidth as FLOP/s and bytes/s: the checked peaks where a tool
    states them, else the first recorded ones (device information, then XProf's roofline); with the tools' word
    on where they come from."""
    flops = bandwidth = None
    sources: list[str] = []
    notes: list[str] = []
    for tool in ("get_device_information", "get_roofline_model"):
        r = results.get(tool)
        if r is None or not r.ok:
            continue
        for key in PEAK_NOTES:
            value = r.summary.get(key)
            notes += [str(v) for v in (value if isinstance(value, list) else [value]) if v]
        keys = [k for pair in CHECKED_PEAKS for k in pair if k in r.summary] + list(r.summary)
        for key in keys:
            value, k = r.summary[key], key.lower()
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 or "recorded" in k:
                continue
            unit = unit_of(key)
            if flops is None and "peak" in k and unit in ("GFLOP/s", "TFLOP/s"):
                flops = value * _BASE[unit]
                sources.append(tool)
            elif bandwidth is None and ("peak" in k or k == "memory_bandwidth") and unit in ("GiB/s", "GB/s", "B/s"):
                bandwidth = value * _BASE[unit]
                sources.append(tool)
    notes = [n.replace("datasheet (", "datasheet: ").rstrip(")") if n.startswith("datasheet (") else n for n in notes]
    info = results.get("get_device_information")
    eight_bit = tuple((name, float(info.summary[key]) * 1e12) for name, key in EIGHT_BIT_PEAK_KEYS
                      if info is not None and info.ok and isinstance(info.summary.get(key), (int, float)))
    return Peaks(flops, bandwidth, ", ".join(dict.fromkeys(sources)), "; ".join(dict.fromkeys(notes)), eight_bit)
