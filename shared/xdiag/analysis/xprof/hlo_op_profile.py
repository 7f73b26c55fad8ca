"""The `hlo_op_profile` view. HLO ops by self time (op_profile, via get_hlo_op_profile and get_top_hlo_ops).

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations

from xdiag.analysis.xprof.common import ViewSource, as_int, as_number, percent_of, rounded, xprof_api
from xdiag.errors import NotAvailable


def _why_no_ops(views: ViewSource) -> str:
    """What the files say about an op_profile with no HLO op: XLA programs whose kernels ran from command buffers
    (CUDA graphs: the kernels' HLO op names the buffer, which XProf does not map to an HLO instruction; 6 of the 9
    H200 profiles in tests/), or no XLA program at all (TensorFlow's V100 profile)."""
    if views.may_have_command_buffers():
        return (
            "the GPU kernels may have run from XLA command buffers (CUDA graphs), whose kernels XProf does not "
            "attribute to HLO instructions; xdiag's own op table names them by kernel"
        )
    if not views.has_metadata_plane():
        return "the profile carries no XLA programs (no HLO modules)"
    return "XProf attributed none of the device time to an HLO instruction"


def answers(views: ViewSource) -> tuple[dict, dict]:
    """XProf's CLI answers the view is built from (memoised by `views`): the categories, and every op ranked by
    time, FLOPs and bytes."""
    try:
        categories = views.tool("get_hlo_op_profile", xprof_api().hlo_op_profile, view="category", top_n=0)
        ops = views.tool("get_top_hlo_ops", xprof_api().top_hlo_ops, limit=0)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise NotAvailable(f"XProf's op_profile has no HLO ops for this profile ({error})") from error
    return categories, ops


def build(views: ViewSource, top_n: int) -> dict:
    categories, ops = answers(views)
    summary = categories.get("category_summary", [])
    total_ms = as_number(categories.get("total_profile_time_ms"))
    busy = [c for c in summary if str(c.get("category", "")).upper() != "IDLE"]
    if not busy:
        raise NotAvailable(
            f"XProf's op_profile holds no HLO ops on this profile, only idle time ({total_ms} ms): {_why_no_ops(views)}"
        )
    idle_ms = sum(as_number(c.get("total_self_time_ms")) or 0.0 for c in summary if c not in busy)

    def op_row(op: dict) -> dict:
        # "by_program/jit_dot(49)/custom-call/custom-call.1 [jit(dot)/dot_general:]": the label in
        # brackets (provenance or custom-call target) may itself contain slashes.
        path, bracket, label = str(op.get("name", "")).partition(" [")
        parts = path.split("/")
        source = f"{op['source_file']}:{op.get('source_line', 0)}" if op.get("source_file") else None
        self_ms = as_number(op.get("total_self_time_ms"))
        return {
            "name": parts[-1] + (bracket + label if bracket else ""),
            "program": parts[1] if len(parts) > 2 and parts[0] == "by_program" else None,
            "category": op.get("category"),
            "self_time_ms": rounded(self_ms, 4),
            "time_percent": percent_of(self_ms, total_ms),
            "occurrences": as_int(op.get("occurrences")),
            "flops": as_number(op.get("flops")),
            "bytes_accessed": as_number(op.get("bytes_accessed")),
            "flops_provenance": op.get("flops_provenance"),
            "source": source,
        }

    def busy_ops(key: str, measure: str | None = None) -> list[dict]:
        return [
            op
            for op in ops.get(key, [])
            if str(op.get("category", "")).upper() != "IDLE"
            and not str(op.get("name", "")).endswith("IDLE")
            and (measure is None or (as_number(op.get(measure)) or 0) > 0)
        ]

    by_time = [op_row(op) for op in busy_ops("top_by_time")]
    top_category = busy[0]
    result = {
        "total_time_ms": rounded(total_ms, 4),
        "idle_percent": percent_of(idle_ms, total_ms),
        "op_count": len(by_time),
        "category_count": len(busy),
        "top_category": top_category.get("category"),
        "top_category_percent": percent_of(as_number(top_category.get("total_self_time_ms")), total_ms),
        "top_op": by_time[0]["name"] if by_time else None,
        "top_op_percent": by_time[0]["time_percent"] if by_time else None,
        "detail": {
            "categories": [
                {
                    "category": c.get("category"),
                    "self_time_ms": as_number(c.get("total_self_time_ms")),
                    "time_percent": percent_of(as_number(c.get("total_self_time_ms")), total_ms),
                    "op_count": as_int(c.get("op_count")),
                    "flops": as_number(c.get("total_flops")),
                    "bytes_accessed": as_number(c.get("bytes_accessed")),
                    "top_op": c.get("top_op"),
                }
                for c in summary[:top_n]
            ],
            "top_ops_by_time": by_time[:top_n],
            "top_ops_by_flops": [op_row(op) for op in busy_ops("top_by_flops", "flops")[:top_n]],
            "top_ops_by_bytes": [op_row(op) for op in busy_ops("top_by_bytes_accessed", "bytes_accessed")[:top_n]],
            "note": (
                "total_time_ms and views times are core time summed over all cores; flops come from XLA's "
                "cost model (shape-derived for custom calls)"
            ),
        },
    }
    return result
