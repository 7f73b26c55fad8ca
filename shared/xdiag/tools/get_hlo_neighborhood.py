"""get_hlo_neighborhood: what produces and consumes a given HLO op?"""

from __future__ import annotations

from xdiag.errors import NotAvailable
from xdiag.profile.space import Session
from xdiag.analysis.op_stats import op_stats
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_hlo_neighborhood",
    "For one HLO op: its instruction (opcode, shape, layout, framework op, source line), the ops that feed it "
    "and the ops that use it, up to `depth` hops, and for a fusion the instructions it fuses.",
    parameters={
        "op": {"type": "string", "description": "HLO instruction name, e.g. 'transpose.3' or 'convert_reduce_fusion'", "required": True},
        "module": {"type": "string", "description": "HLO module name or name(id); default: the module that ran the op longest"},
        "depth": {"type": "integer", "description": "hops before and after (1-3, default 1)", "minimum": 1,
                  "maximum": 3},
    },
)
def get_hlo_neighborhood(session: Session, op: str, module: str | None = None, depth: int = 1) -> ToolOutput:
    """summary: op, module, computation, opcode, shape, fusion_kind, framework_op, source, producers, consumers. detail: the neighbourhood's instructions."""
    depth = max(1, min(depth, 3))
    candidates = [session.module(module)] if module else [
        session.module_for(s.module) for s in op_stats(session) if s.name == op and s.module
    ] + list(session.hlo_modules)
    for target in candidates:
        if target is None:
            continue
        found = target.find(op)
        if found is None:
            continue
        computation, ins = found
        users: dict[str, list[str]] = {}
        for other in computation.instructions:
            for operand in other.operands:
                users.setdefault(operand, []).append(other.name)
        before, after, frontier_b, frontier_a = [], [], [ins.name], [ins.name]
        for _ in range(depth):
            frontier_b = [o for n in frontier_b for o in computation.by_name[n].operands if o in computation.by_name]
            frontier_a = [u for n in frontier_a for u in users.get(n, [])]
            before += frontier_b
            after += frontier_a

        def describe(name: str) -> dict:
            i = computation.by_name[name]
            return {"name": i.name, "opcode": i.opcode, "shape": i.shape_text, "framework_op": i.op_name}

        fused = []
        if ins.opcode == "fusion" and ins.called and ins.called[0] in target.computations:
            fused = [
                {"name": i.name, "opcode": i.opcode, "shape": i.shape_text}
                for i in target.computations[ins.called[0]].instructions
            ]
        summary = {
            "op": ins.name, "module": target.display_name, "computation": computation.name, "opcode": ins.opcode,
            "shape": ins.shape_text, "fusion_kind": ins.fusion_kind or None, "framework_op": ins.op_name,
            "source": ins.source or None,
            "producers": [computation.by_name[n].opcode + " " + n for n in dict.fromkeys(before)][:10],
            "consumers": [computation.by_name[n].opcode + " " + n for n in dict.fromkeys(after)][:10],
        }
        detail = {
            "before": [describe(n) for n in dict.fromkeys(before)][:30],
            "after": [describe(n) for n in dict.fromkeys(after)][:30],
            "fused_instructions": fused[:60],
        }
        return ToolOutput(summary, detail, "HLO carried in the profile")
    if not session.hlo_modules:
        raise NotAvailable("the profile carries no HLO modules")
    raise NotAvailable(f"no HLO instruction named {op!r} in {'module ' + module if module else 'any module'}")
