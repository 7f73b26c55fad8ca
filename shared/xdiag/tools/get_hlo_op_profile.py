"""get_hlo_op_profile: which HLO ops take the time, and how well do they use the hardware?"""

from __future__ import annotations

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.tools.common import DEVICE_PLANE_SOURCE, HOST_PLANE_SOURCE, percent, try_view
from xdiag.tools.ops import category_totals, op_stats
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_hlo_op_profile",
    "Which HLO ops take the most time (per op: count, total and average time, category, shapes, FLOPs, bytes, "
    "arithmetic intensity), and how op time splits across categories.",
    parameters={"top_n": {"type": "integer", "description": "how many ops to list (default 20)"}},
)
def get_hlo_op_profile(session: Session, top_n: int = 20) -> ToolOutput:
    """summary: op_count, total_op_time_ms, top_op, top_op_share_percent, top_category,
    category_percent {category: % of op time}. detail: ops [top_n rows], categories_ms, xprof (device only)."""
    stats = op_stats(session)
    if not stats:
        raise NotAvailable("the profile holds no XLA op executions (no hlo_op events on host threads or device planes)")
    total_ps = sum(s.total_ps for s in stats)
    categories = category_totals(stats)
    total_ms = total_ps / 1e9
    top = stats[0]
    summary = {
        "distinct_ops": len(stats),
        "op_executions": sum(s.count for s in stats),
        "total_op_time_ms": round(total_ms, 4),
        "top_op": top.name,
        "top_op_module": top.module,
        "top_op_category": top.category,
        "top_op_share_percent": percent(top.total_ps, total_ps),
        "top_category": next(iter(categories)),
        "category_percent": {k: percent(v, total_ms) for k, v in categories.items()},
    }
    detail = {
        "ops": [s.row(total_ps) for s in stats[: max(top_n, 1)]],
        "categories_ms": categories,
        "note": "op time is the sum of execution intervals; ops that overlap (several threads or streams) add up",
    }
    source = HOST_PLANE_SOURCE if session.platform == "CPU" else DEVICE_PLANE_SOURCE
    if session.platform != "CPU":
        view, reason = try_view(session, "hlo_op_profile", top_n=top_n)
        detail["xprof"] = view if view is not None else {"available": False, "reason": reason}
    return ToolOutput(summary, detail, source)
