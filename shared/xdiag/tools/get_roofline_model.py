"""get_roofline_model: is the work compute-bound or memory-bound, and how close to the roof?"""

from __future__ import annotations

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import views, xprof_source
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_roofline_model",
    "XProf's roofline model of a TPU/GPU profile: peak FLOP/s and bandwidth, ridge point, achieved FLOP rate "
    "and its share of the roofline, and per op whether it is compute- or memory-bound.",
    parameters={"top_n": {"type": "integer", "description": "how many ops to list (default 20)"}},
)
def get_roofline_model(session: Session, top_n: int = 20) -> ToolOutput:
    """summary: XProf's roofline numbers (peak_flop_rate_gflops, peak_hbm_bw_gibs, ridge point, achieved
    utilisation, memory/compute-bound op shares). Not available on CPU: a CPU profile records no peaks
    (get_hlo_op_profile still gives each op's arithmetic intensity and achieved rate from HLO shapes)."""
    if session.platform == "CPU":
        raise NotAvailable(
            "a CPU profile records no peak FLOP/s or memory bandwidth, so there is no roof; "
            "get_hlo_op_profile gives each op's arithmetic intensity and achieved rate from its HLO shapes"
        )
    view = views(session).roofline()
    summary = {k: v for k, v in view.items() if k != "detail"}
    return ToolOutput(summary, {"xprof": view}, xprof_source())
