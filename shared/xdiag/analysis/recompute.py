"""Recomputation in the op rows: the ops JAX marks as rematerialised (jax.checkpoint / remat re-runs a block's
forward pass inside the backward one; the framework ops of what it recomputes carry `rematted_computation`)."""

from __future__ import annotations

from xdiag.profile.space import HloModule, Session

REMAT_MARK = "rematted_computation"
"""What JAX writes into the framework op (HLO op_name) of every op it recomputes under jax.checkpoint."""


WORK_OPCODES = ("dot", "convolution", "custom-call")
"""The instructions that hold a fusion's time where it has one (its products): the fusion recomputes when they do."""


def _recomputes(row: dict, module: HloModule | None) -> bool:
    """The row's op is one JAX recomputes: its own framework op carries the mark (a fusion takes its root's), or
    the product it fuses does (the recomputed matmul inside a fusion rooted in an elementwise op). A backward
    product that only fuses a recomputed elementwise op (tanh's `1 - y²` re-derived beside it) is backward work,
    not recomputation: counting it made remat_train's share 37.6% where its recomputed products are 16 of 64."""
    if REMAT_MARK in str(row.get("framework_op") or ""):
        return True
    found = module.find(str(row.get("op"))) if module is not None else None
    if found is None:
        return False
    if REMAT_MARK in found[1].op_name:
        return True
    fused = [i for c in found[1].called if c in module.computations for i in module.computations[c].instructions]
    work = [i for i in fused if i.opcode in WORK_OPCODES]
    return any(REMAT_MARK in i.op_name for i in work)


def rematerialised_time(session: Session, rows: list[dict]) -> dict:
    """rematerialised_op_percent (share of op time in the ops that recompute: what dropping the recomputation
    saves at most, the measured time of the recomputed ops), rematerialised_op_count and rematerialised_ops (the
    largest three, with their shares); {} where no op recomputes."""
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
        "rematerialised_op_count": len(remat),
        "rematerialised_ops": [f"{r['op']} ({r.get('share_of_op_time_percent')}%)" for r in remat[:3]],
    }
