"""The `utilization` view. Hardware-counter utilisation (utilization_viewer): *_percent per unit (HBM, MXU, ICI, vector ALU …) over the whole capture.

Built once per session by XprofViews (views.py), which memoises it. utilization_viewer reads only
events that carry the `counter_value` stat (hardware performance-counter samples); where no file holds
that stat name its answer is known to be empty, and the conversion (seconds on large profiles) is not run.
"""

from __future__ import annotations

from typing import Any

from xdiag.analysis.xprof.common import ViewSource, as_number, clean_values, xprof_api
from xdiag.errors import NotAvailable


def build(views: ViewSource) -> dict:
    if len(views.files) > 1:
        raise NotAvailable(f"XProf's utilization_viewer reads one trace; this session has {len(views.files)}")
    if not views.may_have_counter_samples():
        views.require_readable()
        raise _no_samples(views)
    try:
        data = views.tool("get_utilization_viewer", xprof_api().utilization)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise NotAvailable(f"XProf's utilization_viewer failed on this profile ({error})") from error
    if data.get("status") == "NO_DATA":
        raise _no_samples(views)
    result: dict[str, Any] = {key: as_number(value) for key, value in data.items() if key.endswith("percent_of")}
    metrics = clean_values(data.get("metrics", {}))
    peaks = clean_values(data.get("peak_sample_percent", {}))
    kept = sorted(metrics, key=lambda name: -(metrics[name] or 0))[:50]
    result["detail"] = {
        "metrics_percent": {name: metrics[name] for name in kept},
        "peak_sample_percent": {name: peaks[name] for name in kept if name in peaks},
        "basis": data.get("measurement_window", {}).get("basis"),
        "warnings": data.get("warnings", []),
    }
    return result


def _no_samples(views: ViewSource) -> NotAvailable:
    return NotAvailable(
        "XProf's utilization_viewer found no hardware performance-counter samples in this profile "
        f"(device: {views.device_type() or 'unknown'}); they are recorded only when the capture "
        "enables TPU performance counters"
    )
