"""What the three detect_* tools share: executed ops joined with their HLO instructions."""

from __future__ import annotations

from dataclasses import dataclass

from xdiag.profile.space import HloComputation, HloInstruction, HloModule, Session
from xdiag.tools.ops import OpStat, op_stats


@dataclass
class ExecutedInstruction:
    stat: OpStat
    module: HloModule
    computation: HloComputation
    instruction: HloInstruction

    def operands(self) -> list[HloInstruction]:
        return [self.computation.by_name[o] for o in self.instruction.operands if o in self.computation.by_name]

    def fused(self) -> list[HloInstruction]:
        """The instructions inside a fusion (empty for a plain instruction)."""
        if self.instruction.opcode != "fusion" or not self.instruction.called:
            return []
        called = self.module.computations.get(self.instruction.called[0])
        return called.instructions if called else []


def executed_instructions(session: Session) -> tuple[list[ExecutedInstruction], int]:
    """(ops that ran and whose HLO the profile carries, total op time in ps over all ops)."""
    stats = op_stats(session)
    out = []
    for stat in stats:
        module = session.module_for(stat.module) if stat.module else None
        found = module.find(stat.name) if module else None
        if found:
            out.append(ExecutedInstruction(stat, module, found[0], found[1]))
    return out, sum(s.total_ps for s in stats)


def hlo_coverage(session: Session) -> dict:
    executed, total_ps = executed_instructions(session)
    joined = sum(e.stat.total_ps for e in executed)
    return {
        "ops_with_hlo": len(executed),
        "op_time_with_hlo_percent": round(100 * joined / total_ps, 2) if total_ps else 0.0,
    }
