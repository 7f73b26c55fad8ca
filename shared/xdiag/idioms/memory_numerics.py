"""Idioms of memory, precision and layout: data moved or widened where the result does not need it."""

from __future__ import annotations

from xdiag.idioms.catalogue import Match, idiom
from xdiag.idioms.hlo_graph import Graph, Site, elements, nbytes
from xdiag.idioms.program import Program

MOVES = frozenset({"copy", "transpose"})
"""Ops that move every element to another place without changing one."""
PASSES = frozenset({"bitcast", "reshape", "parameter", "tuple", "get-tuple-element"})
"""Ops a layout-only fusion holds beside its moves: none of them reads or writes an element."""
MIN_STAKE_PERCENT = 5.0


def _layout_only(graph: Graph, site: Site) -> bool:
    """The op only moves its operand's elements: a copy or transpose, or a fusion of nothing else."""
    ins = site.instruction
    if ins.opcode in MOVES:
        return True
    body = _body(graph, site)
    return body is not None and any(i.opcode in MOVES for i in body.instructions) and all(
        i.opcode in MOVES | PASSES for i in body.instructions)


def _permuted(dims: tuple[int, ...], source: tuple[int, ...]) -> bool:
    return dims != source and sorted(dims) == sorted(source)


def _body(graph: Graph, site: Site):
    ins = site.instruction
    return graph.module.computations.get(ins.called[0]) if ins.opcode == "fusion" and ins.called else None


def _reorders(graph: Graph, site: Site) -> bool:
    """The move puts the elements in another order: a transpose, or a copy into another layout (a copy into the
    same one, as of an argument returned unchanged, reorders nothing)."""
    body = _body(graph, site)
    moves = [Site(body, i) for i in body.instructions] if body is not None else [site]
    for move in moves:
        ins = move.instruction
        if ins.opcode == "transpose":
            return True
        source = graph.operand(move, 0) if ins.opcode == "copy" else None
        if source is not None and source.instruction.dims == ins.dims and source.instruction.layout != ins.layout:
            return True
    return False


def _moved_output(graph: Graph, site: Site) -> tuple[list[Site], list[Site], Site | None]:
    """The layout-only ops between an output and the value they copy (nearest the output first), every op on that
    way (the bitcasts too: a copy XLA inserts records no stack, the bitcast it copies may), and that value."""
    moves: list[Site] = []
    walked: list[Site] = []
    while site is not None and len(walked) < 16:
        ins = site.instruction
        if _layout_only(graph, site):
            moves.append(site)
        elif ins.opcode not in ("bitcast", "reshape"):
            return moves, walked, site
        walked.append(site)
        site = graph.operand(site, 0)
    return moves, walked, site


@idiom("transposed_outputs", "memory_numerics",
       "The jitted function returns one array again in other layouts",
       "return the array once from {function} and transpose it where it is consumed, inside that consumer's jax.jit "
       "(or compute the consumer in {function} itself), and stop returning an output nothing reads: {outputs} "
       "({shapes}) only {verb} {source} with its dimensions reordered",
       "a jitted function's outputs are written out in full in the layout they are returned in, so each reordered "
       "output is a copy of every element through memory; inside the consumer's jit XLA folds the permutation into "
       "the op that reads it and copies nothing",
       gain=(0.6, 0.95))
def transposed_outputs(program: Program) -> list[Match]:
    found = []
    for graph in program.graphs:
        entry = graph.module.computations.get(graph.module.entry)
        root = entry.by_name.get(entry.root) if entry is not None else None
        if root is None:
            continue
        outputs = [Site(entry, root)] if root.opcode != "tuple" else [
            s for s in (graph.operand(Site(entry, root), k) for k in range(len(root.operands))) if s is not None]
        chains = [(output, *_moved_output(graph, output)) for output in outputs]
        returned = {}  # how many outputs each value reaches: a value returned in several layouts is copied for each
        for _, _, _, source in chains:
            if source is not None:
                returned[source.instruction.name] = returned.get(source.instruction.name, 0) + 1
        moved, lines, shapes, sources = [], [], [], []
        for output, moves, walked, source in chains:
            # one output transposed is a layout finding of its own (a convolution's layout, a consumer's); the idiom is
            # the same values returned again in another order
            if source is None or not moves or returned[source.instruction.name] < 2 or not (
                    _permuted(output.instruction.dims, source.instruction.dims)
                    or any(_reorders(graph, m) for m in moves)):
                continue
            moved.extend(moves)
            shapes.append(f"{output.instruction.dtype}[{','.join(map(str, output.instruction.dims))}]")
            sources.append(source)
            lines.append(next((lf for lf in (_line(program, graph, m) for m in walked) if lf[0]), ("", "")))
        ops = list(dict.fromkeys(graph.timed_op(m) for m in moved))
        stake = program.step_percent(program.time_ms(graph.module, ops))
        if not ops or stake < MIN_STAKE_PERCENT:
            continue
        source = sources[0].instruction
        moved_at = [lf for lf in lines if lf[0]]
        line, function = moved_at[0] if moved_at else program.line_of(graph, sources[0])
        at = (f" at {', '.join(dict.fromkeys(lf[0] for lf in moved_at))}" if moved_at
              else f" from the array built at {line}" if line else "")
        values = f"one {source.dtype} array of {elements(source.dims):,} elements"
        copied = sum(nbytes(m.instruction) for m in moved if m.instruction.opcode != "fusion") or sum(
            nbytes(m.instruction) for m in moved)
        found.append(Match(
            "transposed_outputs", stake,
            f"{len(shapes)} output{'s' if len(shapes) > 1 else ''} of {program.module_key(graph.module)} "
            f"({', '.join(shapes[:4])}) {'are copies' if len(shapes) > 1 else 'is a copy'} of "
            f"{values}, its dimensions reordered, made by {len(ops)} copy or transpose "
            f"{'op' if len(ops) == 1 else 'ops'} ({copied / 2**20:,.0f} MiB moved per call) holding {stake:g}% of the "
            "step",
            module=program.module_key(graph.module), ops=ops, line=line, function=function,
            params={"outputs": ("the output" if len(shapes) == 1 else f"the {len(shapes)} outputs") + at,
                    "verb": "holds" if len(shapes) == 1 else "hold", "shapes": ", ".join(shapes[:4]),
                    "source": values},
            facts={"reordered_outputs": len(shapes), "moved_mib_per_call": round(copied / 2**20, 1)}))
    return found


def _line(program: Program, graph: Graph, site: Site) -> tuple[str, str]:
    """The user's line of a layout-only op: its own, or (a fusion's) that of the move inside it."""
    line = program.line_of(graph, site)
    if line[0] or site.instruction.opcode != "fusion":
        return line
    body = graph.module.computations.get(site.instruction.called[0])
    for ins in body.instructions if body is not None else []:
        if ins.opcode in MOVES:
            inner = program.line_of(graph, Site(body, ins))
            if inner[0]:
                return inner
    return "", ""
