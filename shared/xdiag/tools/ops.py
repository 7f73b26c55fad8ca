"""Aggregation of the op table by HLO op, shared by the op-profile, roofline and detect_* tools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdiag.analysis.hlo_cost import instruction_cost
from xdiag.analysis.timeline import op_table, profile_op_costs
from xdiag.profile.space import NO_VALUE, Session


@dataclass
class OpStat:
    module: str
    name: str
    category: str
    count: int
    total_ps: int
    cost: dict | None  # flops/bytes/shapes from the HLO, when the profile carries the module

    @property
    def total_ms(self) -> float:
        return self.total_ps / 1e9

    def row(self, total_op_ps: int) -> dict:
        row = {
            "op": self.name,
            "module": self.module,
            "category": self.category,
            "count": self.count,
            "total_ms": round(self.total_ms, 4),
            "avg_us": round(self.total_ps / max(self.count, 1) / 1e6, 3),
            "share_of_op_time_percent": round(100 * self.total_ps / total_op_ps, 2) if total_op_ps else 0.0,
        }
        if self.cost and self.cost["flops_known"]:
            seconds = self.total_ps / 1e12
            row.update(
                shape=self.cost["shape"],
                operand_shapes=self.cost["operand_shapes"],
                opcode=self.cost["opcode"],
                framework_op=self.cost["op_name"],
                flops_per_run=self.cost["flops"],
                bytes_per_run=self.cost["bytes"],
                arithmetic_intensity_flops_per_byte=round(self.cost["flops"] / self.cost["bytes"], 3)
                if self.cost["bytes"]
                else None,
                achieved_gflops_per_s=round(self.cost["flops"] * self.count / seconds / 1e9, 3) if seconds else None,
                achieved_gib_per_s=round(self.cost["bytes"] * self.count / seconds / 2**30, 3) if seconds else None,
            )
            if self.cost["source"]:
                row["source"] = self.cost["source"]
            row["cost_source"] = self.cost.get("cost_source", "HLO shapes")
        elif self.cost:
            row.update(shape=self.cost["shape"], operand_shapes=self.cost["operand_shapes"], opcode=self.cost["opcode"],
                       framework_op=self.cost["op_name"], flops_per_run=None,
                       flops_unknown_because="custom calls and host callbacks run code whose FLOPs the HLO does not say")
        return row


def op_stats(session: Session) -> list[OpStat]:
    """Per (module, op): executions, total time and HLO cost, busiest first. Cached."""
    if "op_stats" in session.cache:
        return session.cache["op_stats"]
    ops = op_table(session)
    profile_costs = profile_op_costs(session)
    out: list[OpStat] = []
    if len(ops):
        keys = np.array([f"{m}\x00{n}" for m, n in zip(ops.module, ops.name)], dtype=object)
        unique, inverse = np.unique(keys, return_inverse=True)
        totals = np.bincount(inverse, weights=ops.duration_ps.astype(float))
        counts = np.bincount(inverse)
        first = np.full(len(unique), -1)
        first[inverse[::-1]] = np.arange(len(inverse))[::-1]
        for k, key in enumerate(unique):
            module_name, name = key.split("\x00", 1)
            pid = ops.program_id[first[k]]
            module = session.module_for(module_name, None if pid == NO_VALUE else int(pid)) if module_name else None
            cost = instruction_cost(module, name) if module else None
            recorded = profile_costs.get((module_name, name))
            if recorded:
                # The profiler's own cost model beats counting from shapes.
                cost = {**(cost or {"shape": recorded["shape"], "operand_shapes": [], "opcode": recorded["hlo_category"],
                                    "fusion_kind": "", "op_name": "", "source": recorded["source"]}),
                        "flops": recorded["flops"], "bytes": recorded["bytes"], "flops_known": True,
                        "cost_source": "profile cost model"}
            out.append(
                OpStat(
                    module=module_name,
                    name=name,
                    category=str(ops.category[first[k]]),
                    count=int(counts[k]),
                    total_ps=int(totals[k]),
                    cost=cost,
                )
            )
    out.sort(key=lambda s: -s.total_ps)
    session.cache["op_stats"] = out
    return out


def category_totals(stats: list[OpStat]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for s in stats:
        totals[s.category] = totals.get(s.category, 0.0) + s.total_ms
    return {k: round(v, 4) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
