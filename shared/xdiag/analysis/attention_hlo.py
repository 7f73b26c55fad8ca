"""Whether a program's HLO computes attention, read from its instructions alone (issue 71: no finding names attention
unless the HLO shows one).

Attention is three steps: scores from a matrix product of queries and keys ([.., S_q, S] over S keys), a softmax over
the key axis (an exponential, and a max or sum reduced along a dimension of S), and a matrix product of the softmax
with the values. A square matrix a product makes and an exponential reads (a Gaussian-process kernel exp(-d²/2l²)
that a Cholesky factor then reads) is no attention: no reduce along its keys, no product with values after it.
"""

from __future__ import annotations

from math import prod

from xdiag.profile.space import HloComputation, HloInstruction, HloModule

SCORES_MIN = 128
"""The least sequence length whose S×S scores count as materialised attention (smaller ones fit on chip)."""
MATMUL_OPCODES = frozenset({"dot", "convolution"})
SOFTMAX_REDUCTIONS = frozenset({"maximum", "add"})
STOPS = frozenset({"custom-call", "while", "call", "conditional", "sort", "scatter", "gather", "dynamic-slice",
                   "dynamic-update-slice", "slice", "pad", "concatenate", "reduce-window", "all-reduce", "all-gather",
                   "reduce-scatter", "all-to-all", "collective-permute", "send", "recv", "infeed", "outfeed"})
"""Ops a walk from the scores does not pass: they hand the values to other work (a factorisation, a loop, a slice
of them), not on through a softmax's elementwise steps."""
WALK_MAX = 64
"""How many ops a walk from one scores matmul visits: a softmax and the product after it are a few dozen, fused or
not."""


class _Walk:
    """Users of a value across fusion boundaries: into a fusion's parameter, and out of a fusion whose root it is."""

    def __init__(self, module: HloModule):
        self.module = module
        self.caller: dict[str, HloInstruction] = {}
        self.holder: dict[str, HloComputation] = {}
        for computation in module.computations.values():
            for instruction in computation.instructions:
                if instruction.opcode == "fusion":
                    for called in instruction.called:
                        self.caller.setdefault(called, instruction)
                        self.holder.setdefault(called, computation)

    def users(self, computation: HloComputation, instruction: HloInstruction):
        """(computation, user) for each op that reads the value, looking through fusion parameters and results and
        the tuples a multi-output fusion returns."""
        frontier = [(computation, instruction)]
        seen: set[tuple[str, str]] = set()
        while frontier:
            comp, ins = frontier.pop()
            if (comp.name, ins.name) in seen:
                continue
            seen.add((comp.name, ins.name))
            if ins.name == comp.root and comp.name in self.caller:
                frontier.append((self.holder[comp.name], self.caller[comp.name]))
            for user in comp.users.get(ins.name, []):
                if user.opcode in ("tuple", "get-tuple-element"):
                    frontier.append((comp, user))
                elif user.opcode == "fusion" and user.called and user.called[0] in self.module.computations:
                    called = self.module.computations[user.called[0]]
                    positions = {k for k, name in enumerate(user.operands) if name == ins.name}
                    frontier.extend((called, p) for p in called.instructions
                                    if p.opcode == "parameter" and p.parameter_number in positions)
                else:
                    yield comp, user


def _reduction(module: HloModule, ins: HloInstruction) -> str:
    """The op a reduce combines with (its computation's root: maximum, add, ...)."""
    called = module.computations.get(ins.called[0]) if ins.called else None
    root = called.by_name.get(called.root) if called is not None else None
    return root.opcode if root is not None else ""


def _online_softmax(ins: HloInstruction) -> bool:
    """A custom call XLA names a softmax (XLA:TPU's `online-softmax`) that reads the scores and one more array."""
    return ins.opcode == "custom-call" and len(ins.operands) >= 2 and "softmax" in f"{ins.name} {ins.op_name}".lower()


def _softmax_keys(walk: _Walk, computation: HloComputation, scores: HloInstruction) -> set[int]:
    """The key lengths over which a softmax of these scores runs into a product with values: the sizes of the
    dimensions its max or sum reduces, where an exponential of the scores reaches another matmul; else empty."""
    size = prod(scores.dims)
    keys, exponential, values_product = set(), False, False
    frontier, seen = [(computation, scores, False)], set()
    while frontier and len(seen) < WALK_MAX:
        comp, ins, after_exp = frontier.pop(0)
        for user_comp, user in walk.users(comp, ins):
            key = (user_comp.name, user.name)
            if key in seen:
                continue
            seen.add(key)
            if user.opcode in MATMUL_OPCODES:
                values_product |= after_exp
            elif _online_softmax(user) and ins.dims and ins.dims[-1] >= SCORES_MIN:
                # XLA:TPU's own rewrite of a softmax and the product after it: one custom call reading the scores
                # and the values, reducing along the scores' last (key) axis
                keys.add(ins.dims[-1])
                exponential = values_product = True
            elif user.opcode == "reduce":
                operand = user_comp.by_name.get(user.operands[0]) if user.operands else None
                if (operand is not None and prod(operand.dims) == size
                        and _reduction(walk.module, user) in SOFTMAX_REDUCTIONS):
                    keys |= {operand.dims[d] for d in user.dimensions
                             if d < len(operand.dims) and operand.dims[d] >= SCORES_MIN}
            elif user.opcode not in STOPS and prod(user.dims) == size:
                exponential_here = user.opcode == "exponential"
                exponential |= exponential_here
                frontier.append((user_comp, user, after_exp or exponential_here))
    return keys if exponential and values_product else set()


def attention_key_lengths(module: HloModule) -> frozenset[int]:
    """The key lengths S of the attentions the module computes: a matmul's scores, a softmax reducing along S, and a
    matmul of the softmax; empty where its HLO holds none."""
    walk = _Walk(module)
    found: set[int] = set()
    for computation in module.computations.values():
        for ins in computation.instructions:
            if ins.opcode in MATMUL_OPCODES and len(ins.dims) >= 2 and max(ins.dims) >= SCORES_MIN:
                found |= _softmax_keys(walk, computation, ins)
    return frozenset(found)
