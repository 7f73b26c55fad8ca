"""list_hlo_modules: which compiled programs ran, how often, and how big are they?"""

from __future__ import annotations

from collections import defaultdict

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.analysis.op_stats import op_stats
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "list_hlo_modules",
    "The HLO modules (compiled programs) the profile carries: name with id, instruction and fusion counts, "
    "op time spent in each; several ids for one name means the function was compiled several times.",
)
def list_hlo_modules(session: Session) -> ToolOutput:
    """summary: modules, distinct_names, recompiled_names {name: versions}, busiest_module, busiest_module_share_percent.
    detail: per module rows, busiest first."""
    if not session.hlo_modules:
        raise NotAvailable("the profile carries no HLO modules (no 'Hlo Proto' stats in /host:metadata)")
    op_ms: dict[str, float] = defaultdict(float)
    for s in op_stats(session):
        op_ms[s.module] += s.total_ms
    rows = []
    for module in session.hlo_modules:
        instructions = sum(len(c.instructions) for c in module.computations.values())
        fusions = sum(1 for i in module.entry_computation.instructions if i.opcode == "fusion") if module.entry else 0
        rows.append(
            {"module": module.display_name, "name": module.name, "program_id": module.program_id, "host": module.host,
             "instructions": instructions, "entry_fusions": fusions,
             "entry_instructions": len(module.entry_computation.instructions) if module.entry else 0,
             # op_stats names a program by its name, or by name and id where several programs share the name.
             "op_time_ms": round(op_ms.get(module.display_name, op_ms.get(module.name, 0.0)), 4)}
        )
    by_name: dict[str, set[int]] = defaultdict(set)
    for module in session.hlo_modules:
        by_name[module.name].add(module.program_id)
    total = sum(op_ms.values())
    rows.sort(key=lambda r: -r["op_time_ms"])
    busiest = rows[0]
    summary = {
        "modules": len(rows),
        "distinct_names": len(by_name),
        "recompiled_names": {n: len(ids) for n, ids in sorted(by_name.items()) if len(ids) > 1},
        "busiest_module": busiest["module"],
        "busiest_module_share_percent": round(100 * busiest["op_time_ms"] / total, 2) if total else None,
    }
    return ToolOutput(summary, {"modules": rows[:100]}, "HLO modules carried in the profile")
