"""Where an HLO value comes from, across fusion boundaries: what the idiom recognisers ask of a program's graph.

XLA fuses the ops that build a value (an iota compared with indices, a mask of two iotas) into the fusion that reads
it, or into a fusion of its own whose output another fusion reads. `Graph` follows a value back through both: a
fusion's result is its computation's root, a fusion parameter is the caller's operand in that position, and ops that
only re-shape or re-type a value (convert, bitcast, reshape, copy, broadcast) are looked through. Every answer is read
from the instructions' opcodes, operands and shapes, never from their names or the program's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from xdiag.profile.space import HloComputation, HloInstruction, HloModule

SHAPE_ONLY = frozenset({"convert", "bitcast", "bitcast-convert", "reshape", "copy", "broadcast", "transpose",
                        "copy-start", "copy-done"})
"""Ops that change a value's type, shape, layout or memory (a TPU's copy into on-chip memory) but not which of its
elements are set."""
MATMUL_OPCODES = ("dot", "convolution")
PLUMBING = frozenset({*SHAPE_ONLY, "parameter", "constant", "iota", "get-tuple-element", "tuple", "fusion"})
"""Ops of a fusion that say nothing of what it computes: its inputs, constants and re-shapes, nested fusions."""
DEPTH = 12
"""How many producers a walk follows: the chains that build a one-hot or a mask are a handful of ops long."""
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def elements(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def opcode_name(ins: HloInstruction) -> str:
    """The op's opcode as a user reads it: a convolution with no spatial dimension (how XLA:TPU writes a dot) is a
    matmul."""
    return "matmul" if ins.opcode == "convolution" and ins.conv_is_matrix_product else ins.opcode


def nbytes(instruction: HloInstruction) -> int:
    return elements(instruction.dims) * DTYPE_BYTES.get(instruction.dtype, 4)


def plain_shape(instruction: HloInstruction) -> str:
    """The value's dtype and dimensions as a user writes them ("bf16[2048,64]"), without XLA's layout."""
    return instruction.shape_text.split("{")[0]


@dataclass(frozen=True)
class Site:
    """An instruction and the computation that holds it."""

    computation: HloComputation
    instruction: HloInstruction


class Graph:
    """One HLO module's instructions with their callers: what a value is built from, across fusions."""

    def __init__(self, module: HloModule):
        self.module = module

    @cached_property
    def callers(self) -> dict[str, Site]:
        """For each called computation, the instruction that calls it (a fusion, a while loop, a sort's comparator)."""
        out: dict[str, Site] = {}
        for computation in self.module.computations.values():
            for instruction in computation.instructions:
                for called in instruction.called:
                    out.setdefault(called, Site(computation, instruction))
        return out

    @cached_property
    def top_level(self) -> dict[str, str]:
        """For each computation, the name of the op the profile times for it: a fusion's instruction (or the
        fusion's own caller, for fusions nested in fusions); a loop body's and the entry's ops are timed themselves."""
        out: dict[str, str] = {}
        for start in self.module.computations:
            name, site, seen = start, self.callers.get(start), set()
            while site is not None and site.instruction.opcode == "fusion" and name not in seen:
                seen.add(name)
                outer = self.callers.get(site.computation.name)
                if outer is None or outer.instruction.opcode != "fusion":
                    out[start] = site.instruction.name
                    break
                name, site = site.computation.name, outer
        return out

    def timed_op(self, site: Site) -> str:
        """The name of the op whose time the profile records for this instruction."""
        return self.top_level.get(site.computation.name, site.instruction.name)

    def sites(self) -> Iterator[Site]:
        for computation in self.module.computations.values():
            for instruction in computation.instructions:
                yield Site(computation, instruction)

    def operand(self, site: Site, index: int) -> Site | None:
        if index >= len(site.instruction.operands):
            return None
        found = site.computation.by_name.get(site.instruction.operands[index])
        return Site(site.computation, found) if found is not None else None

    def producer(self, site: Site) -> Site | None:
        """One step back along a value: a fusion's result is its computation's root, a fusion's parameter the
        caller's operand in its position, an op that only re-shapes or re-types a value its operand; None where the
        value is made here (or where a parameter is no fusion's)."""
        ins = site.instruction
        if ins.opcode == "fusion" and ins.called:
            called = self.module.computations.get(ins.called[0])
            root = called.by_name.get(called.root) if called is not None else None
            return Site(called, root) if root is not None else None
        if ins.opcode == "parameter":
            caller = self.callers.get(site.computation.name)
            if caller is None or caller.instruction.opcode != "fusion" or ins.parameter_number < 0:
                return None
            return self.operand(caller, ins.parameter_number)
        if ins.opcode in SHAPE_ONLY and ins.operands:
            return self.operand(site, 0)
        return None

    def origin(self, site: Site | None, depth: int = DEPTH) -> Site | None:
        """The instruction that makes the value: through fusion results and parameters, and through ops that only
        re-shape or re-type it."""
        while site is not None and depth > 0:
            depth -= 1
            back = self.producer(site)
            if back is None:
                return site
            site = back
        return site

    def users(self, site: Site, depth: int = DEPTH) -> Iterator[Site]:
        """The instructions that read this value, through fusion parameters, get-tuple-elements and ops that only
        re-shape it, and out of a fusion the walk entered where the value is its result (XLA:TPU wraps a matmul's
        operand in a fusion of one bitcast inside the matmul's fusion)."""
        frontier, seen = [site], set()
        entered: dict[str, Site] = {}  # each fusion computation the walk went into -> the fusion that calls it
        while frontier and depth > 0:
            depth -= 1
            nxt = []
            for current in frontier:
                key = (current.computation.name, current.instruction.name)
                if key in seen:
                    continue
                seen.add(key)
                caller = entered.get(current.computation.name)
                if caller is not None and current.instruction.name == current.computation.root:
                    nxt.append(caller)
                for user in current.computation.users.get(current.instruction.name, []):
                    user_site = Site(current.computation, user)
                    if user.opcode in ("get-tuple-element", *SHAPE_ONLY):
                        nxt.append(user_site)
                    elif user.opcode in ("fusion", "async-start") and user.called:
                        called = self.module.computations.get(user.called[0])
                        if called is None:
                            continue
                        if user.opcode == "fusion":
                            entered[called.name] = user_site
                        for position in [k for k, name in enumerate(user.operands) if name == current.instruction.name]:
                            nxt.extend(Site(called, p) for p in called.instructions
                                       if p.opcode == "parameter" and p.parameter_number == position)
                    else:
                        yield user_site
            frontier = nxt

    def widened_from(self, site: Site | None, depth: int = DEPTH) -> str | None:
        """The narrower float type a value was converted up from on its way here ('bf16' for a bf16 array made f32
        by a convert, as JAX promotes bf16 @ f32), else None."""
        while site is not None and depth > 0:
            depth -= 1
            ins = site.instruction
            if ins.opcode == "convert" and ins.operands:
                source = self.operand(site, 0)
                if source is not None and source.instruction.dtype in ("bf16", "f16") and ins.dtype == "f32":
                    return source.instruction.dtype
            site = self.producer(site)
        return None

    def mask_kind(self, site: Site | None, depth: int = DEPTH) -> str | None:
        """What a matrix operand is built as, where it is built from iotas or one constant: 'one_hot' (an iota
        compared equal with indices), 'triangular' (two iotas of different dimensions compared in order: a
        lower or upper triangle), 'diagonal' (two iotas of different dimensions compared equal: an identity),
        'constant' (one value broadcast), else None."""
        site = self.origin(site)
        if site is None or depth <= 0:
            return None
        ins = site.instruction
        if ins.opcode == "select" and len(ins.operands) == 3:
            kind = self.mask_kind(self.operand(site, 0), depth - 1)
            if kind in ("one_hot", "triangular") and all(
                    self._constant(self.operand(site, k)) for k in (1, 2)):
                return kind
            return None
        if ins.opcode == "compare" and len(ins.operands) == 2:
            left, right = (self.origin(self.operand(site, k)) for k in (0, 1))
            if left is None or right is None:
                return None
            iotas = [s for s in (left, right) if s.instruction.opcode == "iota"]
            if len(iotas) == 2 and left.instruction.dimensions != right.instruction.dimensions:
                if ins.comparison in ("LT", "LE", "GT", "GE"):
                    return "triangular"
                if ins.comparison == "EQ":
                    return "diagonal"
            if len(iotas) == 1 and ins.comparison == "EQ":
                other = right if iotas[0] is left else left
                # indices: an integer array (an argument, or a constant one the program closed over), not one value
                if other.instruction.dtype.startswith(("s", "u")) and other.instruction.dims:
                    return "one_hot"
            return None
        if self._constant(site):
            return "constant"
        return None

    def _constant(self, site: Site | None) -> bool:
        site = self.origin(site)
        return site is not None and site.instruction.opcode == "constant" and not site.instruction.dims

    def computes(self, site: Site) -> str:
        """What an op computes, as a user reads it, never by its HLO name (which names nothing in their code): "a
        matmul of bf16[2048,64] × bf16[64,2048] → bf16[2048,2048] (fused with add, multiply)", "a matrix-vector
        product (a multiply and a reduce) of ...", else its opcode, or the ops a fusion holds, on its operands."""
        ins = site.instruction
        inner = self.module.computations.get(ins.called[0]) if ins.opcode == "fusion" and ins.called else None
        held = inner.instructions if inner is not None else [ins]
        kinds = sorted({i.opcode for i in held if i.opcode not in PLUMBING and i.opcode not in MATMUL_OPCODES})
        matmul = next((i for i in held if i.opcode in MATMUL_OPCODES), None)
        if matmul is not None:
            where = Site(inner, matmul) if inner is not None else site
            text = "a matmul of " + self._operand_shapes(where, 2, " × ")
            fused = f" (fused with {', '.join(kinds)})" if kinds else ""
            return f"{text} → {plain_shape(ins)}{fused}"
        text = ("a matrix-vector product (a multiply and a reduce)" if {"multiply", "reduce"} <= set(kinds)
                else f"a fusion of {', '.join(kinds)}" if inner is not None and kinds else f"a {opcode_name(ins)}")
        operands = self._operand_shapes(site, 3, ", ")
        return f"{text}{' of ' + operands if operands else ''} → {plain_shape(ins)}"

    def _operand_shapes(self, site: Site, most: int, joiner: str) -> str:
        shapes = [plain_shape(o.instruction) for o in (self.operand(site, k) for k in range(
            min(len(site.instruction.operands), most))) if o is not None]
        return joiner.join(shapes)

    def outputs(self) -> list[Site]:
        """The values the program returns: the entry's root, or each element of the tuple it is."""
        entry = self.module.computations.get(self.module.entry)
        root = entry.by_name.get(entry.root) if entry is not None else None
        if root is None:
            return []
        return [Site(entry, root)] if root.opcode != "tuple" else [
            s for s in (self.operand(Site(entry, root), k) for k in range(len(root.operands))) if s is not None]

    def updated_by_step(self, argument: HloInstruction) -> bool:
        """Whether the program returns a new array of the argument's shape and type (a weight the optimizer updates,
        a cache the step writes): the caller passes the new one on the next call."""
        return any(o.instruction.dims == argument.dims and o.instruction.dtype == argument.dtype
                   and self.origin(o).instruction is not argument for o in self.outputs())

    def loop_invariant(self, site: Site | None) -> Site | None:
        """Where a value inside a while loop's body is an element of the loop's state that every trip passes on
        unchanged (weights a loop reads on every trip): the body's get-tuple-element of it; else None."""
        site = self.origin(site)
        if site is None or site.instruction.opcode != "get-tuple-element":
            return None
        param = self.operand(site, 0)
        body = site.computation
        caller = self.callers.get(body.name)
        if param is None or param.instruction.opcode != "parameter" or caller is None or \
                caller.instruction.opcode != "while" or body.name != caller.instruction.called[0]:
            return None
        root = body.by_name.get(body.root)
        index = site.instruction.tuple_index
        if root is None or root.opcode != "tuple" or not 0 <= index < len(root.operands):
            return None
        passed = self.origin(Site(body, body.by_name[root.operands[index]])) if root.operands[index] in body.by_name \
            else None
        if passed is None or passed.instruction.opcode != "get-tuple-element" or \
                passed.instruction.tuple_index != index:
            return None
        return site

    def loop_of(self, computation: HloComputation) -> HloInstruction | None:
        """The while loop whose body is this computation (or holds the fusion that calls it)."""
        name, seen = computation.name, set()
        while name not in seen:
            seen.add(name)
            caller = self.callers.get(name)
            if caller is None:
                return None
            if caller.instruction.opcode == "while" and caller.instruction.called and \
                    caller.instruction.called[0] == name:  # a while calls (body, condition)
                return caller.instruction
            name = caller.computation.name
        return None

    def carried(self, body: HloComputation, scalars: bool = False) -> frozenset[int]:
        """The elements of a while loop's state each trip computes from the trip before (a recurrence: a hidden
        state, a token): not passed on unchanged, not a scalar counter (unless `scalars`: a counter, a clock), not a
        buffer the trips only write into (dynamic-update-slice, as lax.map stacks its outputs). A buffer a trip writes a
        slice of and also reads (a decode loop's tokens, each trip reading those the trips before wrote) is one."""
        root = body.by_name.get(body.root)
        if root is None or root.opcode != "tuple":
            return frozenset()
        out = set()
        for index, name in enumerate(root.operands):
            value = body.by_name.get(name)
            if value is None or not (value.dims or scalars):
                continue
            origin = self.origin(Site(body, value))
            if origin is not None and origin.instruction.opcode == "get-tuple-element" and \
                    origin.instruction.tuple_index == index:
                continue  # passed on unchanged
            if origin is not None and origin.instruction.opcode == "dynamic-update-slice" and \
                    not self.state_reads(body, index):
                continue  # a buffer each trip only writes a slice of
            out.add(index)
        return frozenset(out)

    def state_reads(self, body: HloComputation, index: int) -> list[Site]:
        """The instructions of a loop body (and of the fusions it calls) that read an element of the loop's state
        as the trip found it, other than the in-place updates that write a slice into it (a dynamic-update-slice
        whose buffer operand it is)."""
        out = []
        for element in body.instructions:
            state = body.by_name.get(element.operands[0]) if element.operands else None
            if element.opcode != "get-tuple-element" or element.tuple_index != index or state is None or \
                    state.opcode != "parameter":
                continue
            for user in self.users(Site(body, element)):
                buffer = self.origin(self.operand(user, 0))
                if user.instruction.opcode == "dynamic-update-slice" and buffer is not None and \
                        buffer.instruction is element:
                    continue
                out.append(user)
        return out

    def depends_on_carried(self, site: Site, depth: int = 64, scalars: bool = False) -> bool:
        """Whether an instruction of a loop body reads, through the body's instructions, an element of the loop's
        state that the trip before computed (`carried`; with `scalars`, a counter or clock among them)."""
        carried = self.carried(site.computation, scalars)
        if not carried:
            return False
        frontier, seen = list(site.instruction.operands), set()
        while frontier and depth > 0:
            depth -= 1
            nxt = []
            for name in frontier:
                if name in seen:
                    continue
                seen.add(name)
                ins = site.computation.by_name.get(name)
                if ins is None:
                    continue
                if ins.opcode == "get-tuple-element" and ins.tuple_index in carried and ins.operands and \
                        site.computation.by_name.get(ins.operands[0]) is not None and \
                        site.computation.by_name[ins.operands[0]].opcode == "parameter":
                    return True
                nxt.extend(ins.operands)
            frontier = nxt
        return False
