"""get_peak_allocations: which buffers make up the memory peak?"""

from __future__ import annotations

from xdiag.analysis.hlo_cost import shape_bytes
from xdiag.errors import NotAvailable
from xdiag.profile.space import HloModule, Session
from xdiag.tools.common import try_view, xprof_source
from xdiag.tools.ops import op_stats
from xdiag.tools.registry import ToolOutput, tool

MIB = 2**20


@tool(
    "get_peak_allocations",
    "The largest buffers of the busiest HLO module at its memory peak (XProf's memory viewer on TPU/GPU); on "
    "CPU the largest values the module's HLO defines, by shape.",
    parameters={"module": {"type": "string", "description": "HLO module name or name(id); default the busiest"}},
)
def get_peak_allocations(session: Session, module: str | None = None) -> ToolOutput:
    """summary: module, largest_buffer_mib, largest_buffer, top10_total_mib. detail: buffers (top 20)."""
    target = session.module(module) if module else None
    if module and target is None:
        raise NotAvailable(f"no HLO module named {module!r} in this profile")
    if target is None:
        target = busiest_module(session)
    if target is None:
        raise NotAvailable("the profile carries no HLO modules to size buffers from")
    if session.platform != "CPU":
        view, reason = try_view(session, "peak_allocations", module=target.display_name)
        if view is not None:
            summary = {k: v for k, v in view.items() if k != "detail"}
            return ToolOutput({"module": target.display_name, **summary}, {"xprof": view}, xprof_source())
    values = [
        {"value": i.name, "shape": i.shape_text, "opcode": i.opcode, "mib": round(shape_bytes(i) / MIB, 4),
         "framework_op": i.op_name}
        for i in target.entry_computation.instructions
        if i.opcode not in ("tuple", "get-tuple-element", "bitcast") and shape_bytes(i) > 0
    ]
    if not values:
        raise NotAvailable(f"module {target.display_name} defines no sized values")
    values.sort(key=lambda v: -v["mib"])
    summary = {
        "module": target.display_name,
        "largest_buffer": values[0]["value"],
        "largest_buffer_shape": values[0]["shape"],
        "largest_buffer_mib": values[0]["mib"],
        "top10_total_mib": round(sum(v["mib"] for v in values[:10]), 4),
        "basis": "HLO value sizes (the profile has no buffer assignment); an upper bound of what is live at once",
    }
    return ToolOutput(summary, {"buffers": values[:20]}, "HLO shapes carried in the profile")


def busiest_module(session: Session) -> HloModule | None:
    """The HLO module the tool sizes by default: the busiest one the profile carries. Ops can name modules the
    profile does not carry (XLA's GPU autotuner compiles each candidate fusion as a module of its own, e.g.
    `gemm_fusion_dot.4`), so the busiest carried one, else the first."""
    carried = (session.module(s.module) for s in op_stats(session) if s.module)
    return next((m for m in carried if m is not None), session.hlo_modules[0] if session.hlo_modules else None)
