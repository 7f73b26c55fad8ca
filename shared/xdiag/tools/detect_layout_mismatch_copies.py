"""detect_layout_mismatch_copies: how much time goes to copies and transposes that only change layout? The ops are the
layout_copies idiom's (xdiag.idioms.memory_numerics.layout_copy): this tool lists them all, with XProf's own
category beside them."""

from __future__ import annotations

import numpy as np

from xdiag.analysis.op_table import op_table, profile_op_costs
from xdiag.analysis.session_cache import cached
from xdiag.idioms.memory_numerics import layout_copy
from xdiag.profile.space import Session
from xdiag.tools.hlo_checks import detect
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "detect_layout_mismatch_copies",
    "Copies and transposes that only change an array's layout (same elements, permuted dimensions or a "
    "different minor-to-major order), with their shapes, bytes moved and share of op time.",
)
def detect_layout_mismatch_copies(session: Session) -> ToolOutput:
    """summary: count, total_ms, share_of_op_time_percent, ops_with_hlo, op_time_with_hlo_percent, top_op, top_op_shape, top_op_why,
    top_op_next_to_convolution (the transpose feeds or follows a convolution: the conv's layout asks for it);
    xprof_data_formatting_percent and counted_ops_note where the profile files ops in XProf's categories (TPU).
    detail: ops (top 20, each with next_to_convolution)."""
    out = detect(session, layout_copy, lambda top: {"top_op_shape": top["shape"], "top_op_why": top["why"],
                                                     "top_op_next_to_convolution": top["next_to_convolution"]})
    formatting = _xprof_data_formatting_percent(session)
    if formatting is not None:
        counted = out.summary["share_of_op_time_percent"]
        out.summary["xprof_data_formatting_percent"] = formatting
        out.summary["counted_ops_note"] = (
            f"counted: copies and transposes whose result is laid out differently from their input ({counted}% of op "
            f"time); XProf's 'data formatting' ({formatting}%) is a category of every copy, transpose and reshape op, "
            "also those that move data without re-laying it (a value copied into another buffer in the same layout), "
            "which detect_unfused_reshapes reports")
    return out


def _xprof_data_formatting_percent(session: Session) -> float | None:
    """Share of device op time in ops the profile's own cost model files as 'data formatting' (TPU); None where
    the profile records no op categories."""
    found = cached(session, "data_formatting", lambda: combined_data_formatting([data_formatting_ps(session)]))
    return round(100 * found[0] / found[1], 2) if found is not None and found[1] else None


def data_formatting_ps(session: Session) -> dict:
    """Device op time in ops the profile's cost model files as 'data formatting', of all device op time, and whether
    the profile records op categories at all: what the share is of, per host (combined_data_formatting)."""
    ops = op_table(session)
    costs = profile_op_costs(session)
    per_op = np.bincount(ops.op, weights=ops.duration_ps.astype(float), minlength=len(ops.op_keys))
    formatting = sum(ps for (module, _, name, *_), ps in zip(ops.op_keys, per_op)
                     if costs.get((module, name), {}).get("hlo_category") == "data formatting")
    return {"costed": bool(costs), "formatting_ps": float(formatting), "op_ps": float(per_op.sum())}


def combined_data_formatting(parts: list[dict]) -> tuple[float, float] | None:
    """(data-formatting op time, all op time) of several hosts' data_formatting_ps (integral picoseconds, so their
    sums are exact); None where no host records op categories."""
    if not any(part["costed"] for part in parts):
        return None
    return sum(part["formatting_ps"] for part in parts), sum(part["op_ps"] for part in parts)
