"""The tools: one module per question, each registered in `registry.REGISTRY` on import."""

from xdiag.tools import (  # noqa: F401  (imported for registration)
    aggregate_xplane_events,
    detect_layout_mismatch_copies,
    detect_unfused_reshapes,
    detect_unnecessary_convert_reduce,
    get_device_information,
    get_custom_kernels,
    get_hlo_neighborhood,
    get_hlo_op_profile,
    get_hosts,
    get_kernel_stats,
    get_kpi_metrics,
    get_line_view,
    get_memory_profile,
    get_peak_allocations,
    get_program_anatomy,
    get_roofline_model,
    get_smart_suggestions,
    get_step_trace,
    get_utilization_viewer,
    get_xprof_overview,
    list_hlo_modules,
    llo,
)
from xdiag.tools.registry import BROAD_TOOLS, FOLLOW_UP_TOOLS, REGISTRY, XPROF_RECORD_TOOLS, run_tool

__all__ = ["BROAD_TOOLS", "FOLLOW_UP_TOOLS", "REGISTRY", "XPROF_RECORD_TOOLS", "run_tool"]
