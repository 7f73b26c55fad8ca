"""Recomputation in the op rows: the ops JAX marks as rematerialised (jax.checkpoint / remat re-runs a block's
forward pass inside the backward one; the framework ops of what it recomputes carry `rematted_computation`)."""

from __future__ import annotations

from xdiag.profile.space import HloModule, Session

REMAT_MARK = "rematted_computation"
"""What JAX writes into the framework op (HLO op_name) of every op it recomputes under jax.checkpoint."""


def _recomputes(row: dict, module: HloModule | None) -> bool:
    """The row's op, or an instruction fused into it (a fusion takes its root's name; the recomputed matmul may be
    inside it), is one JAX recomputes."""
    if REMAT_MARK in str(row.get("framework_op") or ""):
        return True
    found = module.find(str(row.get("op"))) if module is not None else None
    if found is None:
        return False
    called = [module.computations[c] for c in found[1].called if c in module.computations]
    return any(REMAT_MARK in i.op_name for computation in called for i in computation.instructions)


def rematerialised_time(session: Session, rows: list[dict]) -> dict:
    """rematerialised_op_percent (share of op time in ops that recompute) and rematerialised_ops (the largest three,
    with their shares); {} where no op recomputes."""
    modules: dict[str, HloModule | None] = {}
    remat = []
    for row in rows:
        name = str(row.get("module") or "")
        if name not in modules:
            modules[name] = session.module(name) if name else None
        if _recomputes(row, modules[name]):
            remat.append(row)
    if not remat:
        return {}
    remat.sort(key=lambda r: -(r.get("share_of_op_time_percent") or 0.0))
    return {
        "rematerialised_op_percent": round(sum(r.get("share_of_op_time_percent") or 0.0 for r in remat), 2),
        "rematerialised_ops": [f"{r['op']} ({r.get('share_of_op_time_percent')}%)" for r in remat[:3]],
    }
