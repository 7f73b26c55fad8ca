"""Recomputation in the op rows: the ops JAX marks as rematerialised (jax.checkpoint / remat re-runs a block's
forward pass inside the backward one; the framework ops of what it recomputes carry `rematted_computation`)."""

from __future__ import annotations

import re

from xdiag.profile.schema import BYTES_PER_ELEMENT
from xdiag.profile.space import HloInstruction, HloModule, Session

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


_EINSUM = re.compile(r"(\w+),(\w+)->(\w+)")


def _batch_dims(instruction: HloInstruction) -> bool:
    """The product has batch dimensions: a dot's own lhs_batch, or (a dot XLA rewrote as a convolution carries none)
    the letters an einsum spec in its framework op shares between both inputs and the output ('BTNH,BSNH->BNTS':
    B and N). A product with neither counts as one without, so the bytes it adds are never under-counted."""
    if instruction.lhs_batch:
        return True
    spec = _EINSUM.search(instruction.op_name)
    return bool(spec and set(spec.group(1)) & set(spec.group(2)) & set(spec.group(3)))


def _saveable_dots(row: dict, module: HloModule | None) -> list[HloInstruction]:
    """The recomputed products of the row's op that jax.checkpoint_policies.dots_with_no_batch_dims_saveable would
    save instead (jax/_src/ad_checkpoint.py DotsSaveable: a dot_general with no batch dimensions), nested fusions
    included (on a TPU a dot_general is mostly a convolution inside a fusion)."""
    found = module.find(str(row.get("op"))) if module is not None else None
    if found is None:
        return []
    out, seen, todo = [], set(), [found[1]]
    while todo:
        i = todo.pop()
        if (i.opcode == "dot" or (i.opcode == "convolution" and i.conv_is_matrix_product)) and REMAT_MARK in i.op_name \
                and not _batch_dims(i):
            out.append(i)
        for c in i.called:
            if c in module.computations and c not in seen:
                seen.add(c)
                todo.extend(module.computations[c].instructions)
    return out


def _bytes(instruction: HloInstruction) -> int:
    n = BYTES_PER_ELEMENT.get(instruction.dtype, 4)
    for d in instruction.dims:
        n *= d
    return n


def rematerialised_time(session: Session, rows: list[dict], leave_out: frozenset[tuple[str, str]] = frozenset()
                         ) -> dict:
    """rematerialised_op_percent (share of op time in the ops that recompute: what dropping the recomputation
    saves at most, the measured time of the recomputed ops), rematerialised_op_count and rematerialised_ops (the
    largest three, with their shares), rematerialised_saveable_dot_gib (what a dots-saving policy keeps instead);
    {} where no op recomputes. `leave_out`: (module, op) pairs whose recomputation another change removes."""
    modules: dict[str, HloModule | None] = {}
    remat = []
    saved: dict[str, int] = {}
    for row in rows:
        name = str(row.get("module") or "")
        if (name, str(row.get("op"))) in leave_out:
            continue
        if name not in modules:
            modules[name] = session.module(name) if name else None
        if _recomputes(row, modules[name]):
            remat.append(row)
            for dot in _saveable_dots(row, modules[name]):
                saved[f"{name}/{dot.name}"] = _bytes(dot)
    if not remat:
        return {}
    remat.sort(key=lambda r: -(r.get("share_of_op_time_percent") or 0.0))
    return {
        "rematerialised_op_percent": round(sum(r.get("share_of_op_time_percent") or 0.0 for r in remat), 2),
        "rematerialised_op_count": len(remat),
        "rematerialised_ops": [f"{r['op']} ({r.get('share_of_op_time_percent')}%)" for r in remat[:3]],
        # What saving instead of recomputing adds to the peak at most, under the policy the remat lever offers: the
        # outputs of the recomputed dot_generals with no batch dimensions, each instruction once (every block's are
        # live at once at the end of the forward pass).
        "rematerialised_saveable_dot_gib": round(sum(saved.values()) / 2**30, 3),
    }
