"""Idioms of what an op really is: ops whose category or shape would misread them, named from the primitive and the
library function their HLO records, and the numeric type they really run in.

- linear_algebra: JAX's own linear-algebra routines (an LU or Cholesky factorisation, triangular solves, an explicit
  inverse): library custom calls and matmuls, not a kernel of the user's nor attention. Where the program forms an
  inverse, or factors the same matrix again for a determinant or for each right-hand side, one factorisation reused
  does the work.
- promoted_matmul: bfloat16 activations multiplied by float32 weights: JAX promotes the product to float32.
- float64_on_accelerator: ops computing in float64 (64-bit floats switched on, NumPy's float64 arrays passed in) on
  a TPU, which emulates them in software, or a GPU, which runs them at a fraction of float32's rate.
- integer_matmul: a matmul of 32- or 64-bit integers, which the matrix units (bfloat16, int8) do not take: it
  runs on the vector units, where the same counts in floating point run on the matrix unit.
- membership_all_pairs: a membership test (jnp.isin's default method) that compares each element with each listed
  value, N × K compares on the vector units, where a table of the listed values answers each element once.
- complex_matmul: a complex matmul, 4 real matmuls (3 in XLA:TPU's Gauss form), where one operand may be real or
  purely imaginary (a real matrix cast to complex, or times -1j): then 2 real matmuls give the product.
- eigendecomposition_for_solve: a full symmetric eigendecomposition read only to solve a system and take its
  log-determinant, which a Cholesky factor gives.
- convolution_as_patches_matmul: image patches (a convolution with a constant one-hot kernel) and a matmul with the
  flattened kernel, which one convolution with the kernel does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from xdiag.idioms.catalogue import Match, Variant, idiom
from xdiag.idioms.hlo_graph import MATMUL_OPCODES, SHAPE_ONLY, Graph, Site, elements, nbytes, opcode_name
from xdiag.idioms.program import Program, calls_per_step_of
from xdiag.profile.space import HloInstruction
from xdiag.idioms.work_not_needed import FFT_LOWERING, matmul_flops, timed_stake, value_readers

ROUTINES = re.compile(r"(?:^|[/(])(inv|solve|slogdet|det|cholesky|lu|qr|eigh|svd|triangular_solve|"
                      r"lu_pivots_to_permutation|cho_solve|lu_solve)(?=[)/]|$)")
"""The jax.numpy.linalg / jax.scipy.linalg functions and lax.linalg primitives an op's framework path names."""
PRIMITIVES = frozenset({"cholesky", "lu", "qr", "eigh", "svd", "triangular_solve", "lu_pivots_to_permutation"})
"""lax.linalg's primitives: an op whose path names one is JAX's linear algebra, whatever the user's functions are
called (a user's own `solve` names no primitive)."""
MIN_STAKE_PERCENT = 2.0


def routines_of(op_name: str) -> set[str]:
    return set(ROUTINES.findall(op_name or ""))


@idiom("linear_algebra", "op_identity",
       "JAX's linear-algebra routines hold the time, factoring more than once",
       "{change}",
       "an explicit inverse costs a factorisation and n more solves, and a determinant or each separate solve of the "
       "same matrix factors it again; one factorisation, kept and reused, does all of it",
       gain=(0.5, 0.95),
       alternatives=("for a matrix that changes every call, jnp.linalg.solve(a, b) with every right-hand side as a "
                     "column of b (one factorisation per matrix)",))
def linear_algebra(program: Program) -> list[Match]:
    routines: dict[str, float] = {}
    ops: list[str] = []
    lines: dict[tuple[str, str], float] = {}
    module = ""
    rebuilt = False  # an LU factorisation in a loop of a matrix made from the loop's changing state: none to hoist
    for graph in program.graphs:
        key = program.module_key(graph.module)
        for site in graph.sites():
            found = routines_of(site.instruction.op_name)
            if not found & PRIMITIVES:
                continue
            rebuilt = rebuilt or ("lu" in found and site.instruction.opcode in ("custom-call", "cholesky") and
                                  graph.loop_of(site.computation) is not None and
                                  graph.depends_on_carried(site, scalars=True))
            timed = graph.timed_op(site)
            if timed in ops or (key, timed) not in program.op_ms:
                continue
            ms = program.op_ms[(key, timed)]
            ops.append(timed)
            module = module or key
            for routine in found:
                routines[routine] = routines.get(routine, 0.0) + ms
            line = program.line_of(graph, site)
            if line[0]:
                lines[line] = lines.get(line, 0.0) + ms
    stake = program.step_percent(sum(program.op_ms[(module, op)] for op in ops if (module, op) in program.op_ms)) \
        if ops else 0.0
    if stake < MIN_STAKE_PERCENT or any(m.module == module for m in tiny_matrix_decomposition(program)):
        return []  # a stack of tiny matrices: their closed form, not another factorisation, removes the time
    ops_share = stake
    line, function = max(lines, key=lines.get) if lines else ("", "")
    named = sorted(routines, key=lambda r: -routines[r])
    calls_per_step = next((n for m, n in calls_per_step_of(program) if m == module), 0.0)
    if "inv" in routines and ("slogdet" in routines or "det" in routines):
        change = (f"factor the matrix once at {line or 'the line that inverts it'} and reuse it for both the solve and "
                  "the determinant: for a symmetric positive-definite matrix, c = jax.scipy.linalg.cho_factor(a); "
                  "x = jax.scipy.linalg.cho_solve(c, b); logdet = 2 * jnp.sum(jnp.log(jnp.diag(c[0]))), instead of "
                  "jnp.linalg.inv(a) @ b and jnp.linalg.slogdet(a) (lu = jax.scipy.linalg.lu_factor(a) and "
                  "lu_solve for a general one)")
    elif "inv" in routines:
        change = (f"solve instead of inverting at {line or 'the line that inverts'}: jnp.linalg.solve(a, b) (for a "
                  "symmetric positive-definite a, jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b)) "
                  "instead of jnp.linalg.inv(a) @ b")
    elif "slogdet" in routines or "det" in routines:
        change = (f"read the determinant from the factorisation the solve makes at {line or 'its line'}: "
                  "c = jax.scipy.linalg.cho_factor(a) (symmetric positive-definite), logdet = 2 * "
                  "jnp.sum(jnp.log(jnp.diag(c[0]))), x = jax.scipy.linalg.cho_solve(c, b), instead of a separate "
                  "jnp.linalg.slogdet and jnp.linalg.solve")
    elif "solve" in routines and "cholesky" not in routines and rebuilt:
        calls_per_step = 0.0  # the loop's trips, not calls, run the factorisation again: each trip's matrix differs
        change = (f"solve by Cholesky at {line or 'the line that solves'}: jax.scipy.linalg.solve(a, b, "
                  "assume_a=\"pos\") (or jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b)) instead of "
                  "jnp.linalg.solve(a, b), its premise that the matrix is symmetric positive definite: the loop "
                  "rebuilds the matrix from its state every trip, so no factorisation can be kept, and a Cholesky "
                  "factorisation does half an LU's work with no pivoting")
    elif "solve" in routines and calls_per_step > 1.5:  # jnp.linalg.solve factors its matrix on every call
        # ... and each call is dispatched on its own: one solve of all right-hand sides also ends the device's idle
        # time between the calls
        idle = float(program.step.get("device_idle_percent") or 0.0)
        stake = min(stake + idle, 100.0)
        change = (f"factor the matrix once and solve every right-hand side with that factorisation at "
                  f"{line or 'the line that solves'}: lu = jax.scipy.linalg.lu_factor(a) outside the loop (or "
                  "c = jax.scipy.linalg.cho_factor(a) for a symmetric positive-definite a), then "
                  "jax.scipy.linalg.lu_solve(lu, B) (cho_solve(c, B)) with the right-hand sides as the columns of B, "
                  "instead of jnp.linalg.solve(a, b) per right-hand side")
    else:
        return []  # one factorisation per step, used once: nothing factored twice
    return [Match(
        "linear_algebra", stake,
        f"{len(ops)} ops of JAX's linear-algebra routines ({', '.join(named[:5])}: library custom calls and matmuls "
        f"for LU/Cholesky factorisation and triangular solves, not a kernel of the program's own) hold "
        f"{ops_share:g}% of "
        f"the step" + (f", in {calls_per_step:.3g} calls of {module.split('(')[0]} per step, the device idle "
                       f"{program.step.get('device_idle_percent')}% of it between them" if calls_per_step > 1.5
                       else "") + (", in a loop that rebuilds the matrix from its state every trip" if rebuilt
                                   else "") + (f", from {line}" if line else ""),
        module=module, ops=ops[:16], line=line, function=function,
        params={"change": change, "routines": named},
        facts={"routines_ms": {r: round(v, 3) for r, v in routines.items()}, "op_count": len(ops),
               "rebuilt_each_trip": rebuilt})]


TINY_ORDER_MAX = 4
"""Matrices this small have a closed-form inverse, determinant and factors: a few multiply-adds per matrix."""
TINY_BATCH_MIN = 1024
"""At least this many stacked matrices: the decomposition's per-matrix blocks, not its one launch, hold the time."""


def tiny_matrix_stack(graph: Graph, site: Site) -> tuple[int, int] | None:
    """(n, matrices) where a linear-algebra op (a library custom call, a triangular solve, a Cholesky) reads a stack
    of at least TINY_BATCH_MIN n × n matrices with n ≤ TINY_ORDER_MAX; None otherwise."""
    ins = site.instruction
    if ins.opcode not in ("custom-call", "triangular-solve", "cholesky") or not routines_of(ins.op_name) & PRIMITIVES:
        return None
    for index in range(len(ins.operands)):
        operand = graph.operand(site, index)
        dims = operand.instruction.dims if operand is not None else ()
        if len(dims) >= 3 and dims[-1] == dims[-2] <= TINY_ORDER_MAX and elements(dims[:-2]) >= TINY_BATCH_MIN:
            return dims[-1], elements(dims[:-2])
    return None


CLOSED_FORMS = {
    2: "for [[a, b], [c, d]] the inverse is [[d, -b], [-c, a]] / (a * d - b * c) (for a symmetric [[a, b], [b, c]]: "
       "det = a * c - b * b, entries c / det, -b / det, a / det), elementwise over the stack",
    3: "for rows r0, r1, r2 the inverse's columns are jnp.cross(r1, r2), jnp.cross(r2, r0), jnp.cross(r0, r1) over "
       "det = jnp.sum(r0 * jnp.cross(r1, r2), -1) (the cofactors), elementwise over the stack",
    4: "the 4 × 4 cofactors written out (or two 2 × 2 blocks by the Schur complement), elementwise over the stack; "
       "its premise is that the matrices are well conditioned, as no pivoting guards it",
}


@idiom("tiny_matrix_decomposition", "op_identity",
       "A decomposition runs over a stack of tiny matrices that a closed form inverts",
       "write the {order}×{order} inverse (or solve) in closed form at {line} instead of {routines} over the "
       "stacked matrices: {closed_form}",
       "a batched LU, Cholesky or triangular solve runs as blocked library kernels sized for large matrices, each "
       "tiny matrix one padded block of its loop; its closed form is a few multiply-adds per matrix, fused with the "
       "ops around it",
       gain=(0.95, 1.0), measured="docs/reference/measurements.md#tiny-matrix-decomposition",
       alternatives=("for the eigenvalues of a symmetric 2×2 [[a, b], [b, c]], mid ± jnp.sqrt(mid * mid - "
                     "(a * c - b * b)) with mid = (a + c) / 2, elementwise",))
def tiny_matrix_decomposition(program: Program) -> list[Match]:
    cache = program.__dict__.setdefault("tiny_matrix_decomposition", {})
    if "matches" in cache:  # linear_algebra asks too: read once
        return cache["matches"]
    found: list[Match] = []
    for graph in program.graphs:
        key = program.module_key(graph.module)
        stacks: dict[tuple[str, str], tuple[int, int]] = {}
        called: dict[tuple[str, str], str] = {}
        for site in graph.sites():
            stack = tiny_matrix_stack(graph, site)
            if stack is not None:  # the outermost routine its path names is the one the user called
                called[program.line_of(graph, site)] = ROUTINES.findall(site.instruction.op_name)[0]
                stacks[program.line_of(graph, site)] = max(stack, stacks.get(program.line_of(graph, site), (0, 0)))
        if not stacks:
            continue
        # the routines' ops at the stacks' lines: the decomposition, its pivots' gathers and the solves after it
        ops: dict[str, float] = {}
        routines: dict[str, float] = {}
        for site in graph.sites():
            named = routines_of(site.instruction.op_name)
            timed = graph.timed_op(site)
            if not named & PRIMITIVES or (key, timed) not in program.op_ms or \
                    program.line_of(graph, site) not in stacks:
                continue
            ms = ops.setdefault(timed, program.op_ms[(key, timed)])
            for routine in named - {"lu_pivots_to_permutation"}:
                routines[routine] = routines.get(routine, 0.0) + ms
        stake = program.step_percent(sum(ops.values()))
        if stake < MIN_STAKE_PERCENT:
            continue
        line, function = max(stacks, key=lambda k: stacks[k][1])
        order, matrices = stacks[(line, function)]
        named = sorted(routines, key=lambda r: -routines[r])
        user = called[(line, function)]
        found.append(Match(
            "tiny_matrix_decomposition", stake,
            f"JAX's {', '.join(named[:5])} over a stack of {matrices:,} {order}×{order} matrices ({len(ops)} ops: "
            f"library custom calls and triangular solves) hold {stake:g}% of the step"
            + (f", from {line}" if line else ""),
            module=key, ops=sorted(ops, key=lambda op: -ops[op])[:16], line=line, function=function,
            params={"order": order, "routines": ("jax.lax.linalg." if user in PRIMITIVES else "jnp.linalg.") + user,
                    "closed_form": CLOSED_FORMS[order]},
            facts={"matrices": matrices, "order": order, "op_count": len(ops)}))
    cache["matches"] = found
    return found


PROMOTED_MIN_BYTES = 1 << 20
"""f32 weights smaller than this cost little to read at twice the width."""


@idiom("promoted_matmul", "memory_numerics",
       "bfloat16 activations meet float32 weights, so the matmuls run in float32",
       "{change}",
       "JAX promotes bf16 @ f32 to f32: the weights are read at 4 bytes an element and the matrix units run "
       "float32 passes; in bfloat16 the same product reads half the bytes, and accumulation can stay float32",
       gain=(0.6, 1.0),
       alternatives=("where the weights must stay float32 for the optimizer, cast them per call inside the step "
                     "(w.astype(jnp.bfloat16)), which XLA fuses into the read",))
def promoted_matmul(program: Program) -> list[Match]:
    rows = {(r["module"], r["op"]): r for r in program.rows}
    found: dict[str, Match] = {}
    halved: dict[str, float] = {}  # per program: the ms per capture half its float32 weights' bytes take to read
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        products = [site for site in graph.sites() if site.instruction.opcode in ("dot", "convolution")
                    and len(site.instruction.operands) >= 2
                    and (site.instruction.opcode == "dot" or site.instruction.conv_is_matrix_product)]
        # bfloat16 data in the program itself: a bf16 argument, or an astype to bf16 the program wrote (XLA:TPU's
        # own bf16 passes over float32 matmuls are no sign of it: they carry no convert_element_type of JAX's)
        narrow = any(i.dtype == "bf16" and (i.opcode == "parameter" and c.name == graph.module.entry
                                            or i.op_name.endswith("convert_element_type"))
                     for c in graph.module.computations.values() for i in c.instructions)
        if not narrow:
            continue
        for site in products:
            # the matmul reads the float32 array itself (not a bf16 copy XLA converts it to)
            weights = [graph.origin(graph.operand(site, k)) for k in (0, 1)
                       if graph.operand(site, k) is not None and graph.operand(site, k).instruction.dtype == "f32"]
            held = [w for w in weights if w is not None and w.instruction.dtype == "f32"
                    and w.instruction.opcode in ("parameter", "get-tuple-element")
                    and nbytes(w.instruction) >= PROMOTED_MIN_BYTES]
            timed = graph.timed_op(site)
            if not held or (module_key, timed) not in program.op_ms:
                continue
            line, function = program.line_of(graph, site)
            match = found.setdefault(module_key, Match(
                "promoted_matmul", 0.0, "", module=module_key, line=line, function=function,
                facts={"weights": held[0].instruction.shape_text.split("{")[0]}))
            if timed not in match.ops:
                match.ops.append(timed)
                ms = program.op_ms[(module_key, timed)]
                match.stake_percent = min(match.stake_percent + program.step_percent(ms), 100.0)
                # bfloat16 weights remove half the weights' bytes: their share of what the op reads and writes
                row = rows.get((module_key, timed)) or {}
                op_bytes = row.get("hbm_bytes_per_run") or row.get("bytes_per_run") or 0
                share = min(sum(nbytes(w.instruction) for w in held) / op_bytes, 1.0) if op_bytes else 1.0
                halved[module_key] = halved.get(module_key, 0.0) + ms * share / 2
    out = []
    for module_key, match in found.items():
        if match.stake_percent < MIN_STAKE_PERCENT:
            continue
        # at most half the weights' share of these matmuls' time is what bfloat16 weights remove
        match.needed_percent = round(match.stake_percent - program.step_percent(halved[module_key]), 2)
        match.what = (f"{len(match.ops)} matmuls multiply activations converted up from bfloat16 by float32 weights "
                      f"(such as {match.facts['weights']}), so they run in float32"
                      + (f", at {match.line}" if match.line else "") + f": {match.stake_percent:g}% of the step")
        match.params["change"] = (f"cast the float32 weights to bfloat16 once, where they are loaded or before the "
                                  f"step (params = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)), so the "
                                  f"matmuls at {match.line or 'their line'} read bfloat16; pass "
                                  "preferred_element_type=jnp.float32 to jnp.dot where the sum must stay float32")
        out.append(match)
    return out


@dataclass
class Held:
    """The timed ops of one program that hold an instruction a test picks: their time over the capture, the user's
    lines by that time, and the picked instruction whose op takes the most (a matmul, convolution or reduction
    before others at a tie: what is computed)."""

    graph: Graph
    ops: list[str] = field(default_factory=list)
    ms: float = 0.0
    lines: dict[tuple[str, str], float] = field(default_factory=dict)
    example: Site | None = None
    example_ms: float = 0.0

    @property
    def line(self) -> tuple[str, str]:
        return max(self.lines, key=self.lines.get) if self.lines else ("", "")


def ops_holding(program: Program, test: Callable[[Graph, Site], bool]) -> dict[str, Held]:
    """Per program (its module key), the timed ops holding an instruction `test` picks (an op of a fusion included)."""
    out: dict[str, Held] = {}
    for graph in program.graphs:
        key = program.module_key(graph.module)
        for site in graph.sites():
            if not test(graph, site):
                continue
            timed = graph.timed_op(site)
            ms = program.op_ms.get((key, timed), 0.0)
            if ms <= 0:
                continue
            held = out.setdefault(key, Held(graph))
            if held.example is None or ms > held.example_ms or ms == held.example_ms and (site.instruction.opcode in (
                    "dot", "convolution", "reduce") or held.example.instruction.dtype == "pred"):  # a value, not a test
                held.example, held.example_ms = site, ms
            line = program.line_of(graph, site)
            if line[0]:
                held.lines[line] = held.lines.get(line, 0.0) + ms
            if timed not in held.ops:
                held.ops.append(timed)
                held.ms += ms
    return out


F64_SLOWDOWN = {"TPU": 100.0, "GPU": 2.0, "CPU": 2.0}
"""How many times longer an op takes in float64 than in float32, by platform. A TPU has no float64 units: XLA:TPU
rewrites the program to hold no 64-bit element types, each float64 value a pair of float32 words (custom calls
X64SplitHigh and X64SplitLow make the pair from a float64 argument, X64Combine a float64 result from it) and each
float64 op many 32-bit ops on the pair; a training step whose every op ran in float64 took 313x its float32 time on
a TPU v5e (docs/reference/measurements.md#float64-on-accelerator), one program's measurement, of which 100x is kept.
A GPU reads twice the bytes and, on data-centre parts, runs float64 at half float32's rate or less (consumer parts:
1/32-1/64), so 2x is the floor: a premise until a trial measures it. A CPU runs float64 at about half float32's
vector rate, a cost its users usually accept for the precision: the idiom is offered on accelerators only
(`platforms`)."""
F64_MIN_STAKE_PERCENT = 2.0
X64_SPLIT = ("X64SplitHigh", "X64SplitLow")
X64_COMBINE = "X64Combine"
"""The custom calls XLA:TPU's float64 rewrite leaves where a float64 argument enters and a float64 result leaves."""
F64_TYPES = frozenset({"f64", "c128"})
"""Types whose values are float64 (complex128: a pair of them); complex64 is a pair of float32."""


def _is_f64(instruction) -> bool:
    return instruction.dtype == "f64" or any(t == "f64" for t, _ in instruction.tuple_shapes)


LOOP_OPCODES = ("while", "conditional", "call")
"""Ops whose called computations' ops the profile times one by one (a fusion's, a reduction's, are timed as it)."""


def _holds_two_sum(computation, ins) -> bool:
    """Whether an instruction is the second step of the float32 pair sum XLA:TPU's float64 rewrite emits (Knuth's
    TwoSum: s = a + b, then s - a recovers b's rounded part): a float32 subtract whose first operand is an add of its
    second operand."""
    if ins.opcode != "subtract" or ins.dtype != "f32" or len(ins.operands) != 2:
        return False
    first = computation.by_name.get(ins.operands[0])
    return first is not None and first.opcode == "add" and first.dtype == "f32" and ins.operands[1] in first.operands


def _splits_f64(computation, ins) -> bool:
    """Whether an instruction is XLA:TPU's split of a float64 value into float32 words (the same rewrite splits a
    complex64 value into its float32 real and imaginary parts: no float64 there)."""
    return ins.opcode == "custom-call" and ins.custom_call_target in X64_SPLIT and any(
        computation.by_name[o].dtype in F64_TYPES for o in ins.operands if o in computation.by_name)


def _emulating_f64(graph: Graph) -> Callable[[Graph, Site], bool]:
    """The instructions of a program XLA:TPU rewrote from float64 that compute on float32 pairs: the ops (a fusion, a
    loop body's op) that sum pairs (TwoSum) or split a float64 value (X64Split), and every op reading their results
    in the same computation, into a loop's body through the elements of its carry they reach; float32 work beside
    them in a loop (the random bits a float64 simulation draws in float32) is not."""
    module = graph.module
    entry = module.computations.get(module.entry)
    if entry is None:
        return lambda g, site: False
    splits = [site for site in graph.sites() if _splits_f64(site.computation, site.instruction)]
    if not splits and not any(i.opcode == "custom-call" and i.custom_call_target == X64_COMBINE
                              and i.dtype in F64_TYPES for i in entry.instructions):
        return lambda g, site: False

    def level(site: Site) -> Site:
        """The op the site belongs to in the computation whose ops are timed one by one (the entry, a loop body)."""
        seen = set()
        while site.computation.name not in seen:
            seen.add(site.computation.name)
            caller = graph.callers.get(site.computation.name)
            if caller is None or caller.instruction.opcode in LOOP_OPCODES:
                return site
            site = caller
        return site

    seeds: dict[str, set[str]] = {}
    for site in splits + [site for site in graph.sites() if _holds_two_sum(site.computation, site.instruction)]:
        at = level(site)
        seeds.setdefault(at.computation.name, set()).add(at.instruction.name)
    tainted: dict[str, set[str]] = {}
    carried: dict[str, set[int]] = {}  # loop body -> the carry's elements that hold pairs
    pending = list(seeds)
    while pending:
        name = pending.pop()
        computation = module.computations.get(name)
        if computation is None:
            continue
        reached = tainted.setdefault(name, set())
        parameters = {i.name for i in computation.instructions if i.opcode == "parameter"}
        frontier = [n for n in seeds.get(name, ()) if n not in reached]
        frontier += [i.name for i in computation.instructions if i.opcode == "get-tuple-element"
                     and i.operands and i.operands[0] in parameters and i.tuple_index in carried.get(name, ())
                     and i.name not in reached]
        while frontier:
            current = frontier.pop()
            if current in reached:
                continue
            reached.add(current)
            frontier.extend(u.name for u in computation.users.get(current, []))
        root = computation.by_name.get(computation.root)
        caller = graph.callers.get(name)
        if root is not None and root.opcode == "tuple" and caller is not None and caller.instruction.opcode == "while":
            back = {k for k, operand in enumerate(root.operands) if operand in reached} - carried.get(name, set())
            if back:  # the next trip's carry
                carried.setdefault(name, set()).update(back)
                pending.append(name)
        for ins in computation.instructions:
            if ins.opcode != "while" or ins.name not in reached or len(ins.called) < 2 or not ins.operands:
                continue
            body = ins.called[0]  # a while calls (body, condition)
            operand = computation.by_name.get(ins.operands[0])
            elements = ({k for k, o in enumerate(operand.operands) if o in reached} if operand is not None
                        and operand.opcode == "tuple" else set(range(len(ins.tuple_shapes))))
            if body and elements - carried.get(body, set()):
                carried.setdefault(body, set()).update(elements)
                pending.append(body)
    for name, reached in tainted.items():  # a carried pair's first value, written out for the loop (zeros)
        computation = module.computations[name]
        for ins in computation.instructions:
            operand = computation.by_name.get(ins.operands[0]) if ins.opcode == "while" and ins.operands else None
            if operand is not None and operand.opcode == "tuple" and ins.called:
                reached.update(o for k, o in enumerate(operand.operands) if k in carried.get(ins.called[0], ())
                               and o in computation.by_name and computation.by_name[o].opcode in SHAPE_ONLY)

    def test(g: Graph, site: Site) -> bool:
        if site.instruction.opcode in ("parameter", "get-tuple-element", "tuple", "constant", "custom-call"):
            return False
        at = level(site)  # a loop's own op is its trips' bookkeeping: its body's ops are judged one by one
        return at.instruction.opcode != "while" and at.instruction.name in tainted.get(at.computation.name, ())
    return test


@idiom("float64_on_accelerator", "memory_numerics",
       "The program computes in float64, which an accelerator runs at a fraction of float32's speed",
       "keep float32 at {line}: pass float32 arrays where NumPy data enters (x.astype(np.float32), or "
       "jnp.asarray(x, dtype=jnp.float32)), create arrays with dtype=jnp.float32, and drop "
       "jax.config.update(\"jax_enable_x64\", True) (or JAX_ENABLE_X64=1); where a part needs 64-bit floats, keep "
       "64-bit types on but make only that part's inputs float64 and every other array float32",
       "a TPU has no float64 units and emulates each float64 op with several float32 ops; a GPU runs float64 at "
       "half float32's rate or less and reads twice the bytes; in float32 the same ops run at the device's rate",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#float64-on-accelerator", platforms=("TPU", "GPU"))
def float64_on_accelerator(program: Program) -> list[Match]:
    """The timed ops whose HLO computes a float64 value (an op of a fusion included), summed per program."""
    slowdown = F64_SLOWDOWN.get(program.platform, 2.0)
    emulating = {id(graph): _emulating_f64(graph) for graph in program.graphs}

    def computes_f64(graph: Graph, site: Site) -> bool:
        return (_is_f64(site.instruction) and site.instruction.opcode not in (
            "parameter", "get-tuple-element", "tuple", "constant")) or emulating[id(graph)](graph, site)
    out = []
    for key, held in ops_holding(program, computes_f64).items():
        stake = program.step_percent(held.ms)
        if stake < F64_MIN_STAKE_PERCENT:
            continue
        module = held.graph.module
        arguments = [i for i in module.computations[module.entry].instructions
                     if i.opcode == "parameter" and i.dtype == "f64"] if module.entry in module.computations else []
        args = [a.shape_text.split("{")[0] for a in arguments[:4]]
        example = f"{opcode_name(held.example.instruction)} {held.example.instruction.shape_text.split('{')[0]}"
        line, function = held.line
        out.append(Match(
            "float64_on_accelerator", stake,
            f"{len(held.ops)} ops compute in float64 (such as {example}"
            + (", a float64 value as a pair of float32 words: XLA:TPU's float64 rewrite, its X64Split and X64Combine "
               "calls at the program's edges" if held.example is not None
               and emulating[id(held.graph)](held.graph, held.example) else "") + ")"
            + (f", the program's arguments float64 ({', '.join(args)}"
               + (f" and {len(arguments) - len(args)} more" if len(arguments) > len(args) else "") + ")"
               if args else "")
            + (f", most of their time at {line}" if line else "")
            + f": {stake:g}% of the step on a {program.platform}, where float64 is "
            + ("measured over" if program.platform == "TPU" else "assumed") + f" {slowdown:g}x slower than float32",
            module=key, ops=held.ops, line=line, function=function,
            # in float32 the same ops take 1/slowdown of their float64 time: that is what the result needs
            needed_percent=stake / slowdown, work_ratio=slowdown,
            facts={"f64_arguments": args, "f64_argument_count": len(arguments), "example": example,
                   "example_ms": round(held.example_ms, 3), "assumed_slowdown": slowdown}))
    return out


COMPLEX_NAMES = {"c64": "complex64", "c128": "complex128"}
COMPLEX_TYPES = frozenset(COMPLEX_NAMES)
COMPLEX_MIN_STAKE_PERCENT = 5.0
REAL_PRODUCTS_NEEDED = 2
"""Real matmuls a complex product needs where one operand is real (A @ v.real and A @ v.imag) or purely imaginary."""


def _complex_part(graph: Graph, site: Site | None) -> tuple[HloInstruction, str] | None:
    """(complex value, "real part" / "imaginary part" / "sum of parts") where a matmul operand is XLA:TPU's split of a
    complex64/complex128 value (X64SplitLow/High) or the sum of its two parts, else None."""
    site = graph.origin(site)
    if site is None:
        return None
    ins = site.instruction
    if ins.opcode == "custom-call" and ins.custom_call_target in X64_SPLIT and ins.operands:
        source = site.computation.by_name.get(ins.operands[0])
        if source is not None and source.dtype in COMPLEX_TYPES:
            return source, "real part" if ins.custom_call_target == "X64SplitLow" else "imaginary part"
    if ins.opcode == "add" and len(ins.operands) == 2:
        parts = [_complex_part(graph, graph.operand(site, k)) for k in (0, 1)]
        if all(parts) and parts[0][0] is parts[1][0] and parts[0][1] != parts[1][1]:
            return parts[0][0], "sum of parts"
    return None


def _is_matmul(site: Site) -> bool:
    ins = site.instruction
    return ins.opcode == "dot" or ins.opcode == "convolution" and ins.conv_is_matrix_product


@idiom("complex_matmul", "op_identity",
       "A complex matmul runs as several real ones, where one operand may be real or purely imaginary",
       "{change}",
       "a matrix unit multiplies real numbers: a complex × complex product is 4 real matmuls (XLA:TPU runs 3, the "
       "Gauss form: re·re, im·im and (re + im)·(re + im), and reads both parts of each operand); where one operand "
       "is real (or purely imaginary: i times a real matrix), 2 real matmuls of the same size give the product. The "
       "premise is that operand: a real matrix made complex (a Hamiltonian times -1j * dt, a real kernel cast to "
       "complex64) is one; the profile cannot tell a complex matrix whose imaginary part is zero from any other",
       gain=(0.85, 1.0), measured="docs/reference/measurements.md#a-complex-matmul-with-a-real-operand",
       alternatives=("one real matmul on the stacked parts, the same FLOPs in a single product: r = a @ "
                     "jnp.concatenate([v.real, v.imag], axis=1); jax.lax.complex(r[:, :n], r[:, n:]) for v of n "
                     "columns (on a TPU v5e it took 47% off the step where the two products took 57%)",))
def complex_matmul(program: Program) -> list[Match]:
    """Complex matmuls: dots of complex64/complex128 values (as XLA:CPU and XLA:GPU keep them), or on a TPU the real
    matmuls of XLA's Gauss form, found by the sum of a complex value's two parts feeding a matmul (a product with a
    real operand forms no such sum), with every matmul reading that value's parts."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        matmuls = [s for s in graph.sites() if _is_matmul(s)]
        parts = {(s.computation.name, s.instruction.name): [p for p in (
            _complex_part(graph, graph.operand(s, k)) for k in (0, 1)) if p] for s in matmuls}
        gauss = {id(value): value for found in parts.values() for value, part in found if part == "sum of parts"}
        split = [s for s in matmuls if any(id(v) in gauss for v, _ in parts[(s.computation.name, s.instruction.name)])]
        native = [s for s in matmuls if s.instruction.dtype in COMPLEX_TYPES and len(s.instruction.operands) == 2
                  and all((o := graph.operand(s, k)) is not None and o.instruction.dtype in COMPLEX_TYPES
                          for k in (0, 1))]
        sites = split or native
        ops, stake = timed_stake(program, graph, sites)
        if not sites or stake < COMPLEX_MIN_STAKE_PERCENT:
            continue
        runs = {id(s): program.runs.get((module_key, graph.timed_op(s)), 1) for s in sites}
        if split:  # each complex product: 3 real matmuls of the same size
            real_products = 3
            products = max(round(len(split) / real_products), 1)
            real_flops = sum(matmul_flops(graph, s) * runs[id(s)] for s in split)
            needed_flops = real_flops * REAL_PRODUCTS_NEEDED / real_products
            values = sorted(gauss.values(), key=lambda v: -elements(v.dims))[:2]
            shapes = " × ".join(v.shape_text.split("{")[0] for v in values)
            value = values[0]
        else:  # a complex multiply-add is 4 real ones
            real_products = 4
            products = len(native)
            needed_flops = sum(matmul_flops(graph, s) * runs[id(s)] for s in native) * REAL_PRODUCTS_NEEDED
            example = max(native, key=lambda s: matmul_flops(graph, s))
            shapes = " × ".join(graph.operand(example, k).instruction.shape_text.split("{")[0] for k in (0, 1))
        roof = program.roof_ms(flops=needed_flops)
        # without the device's peaks, the 2 real products take their share of the time the products take now
        needed = program.step_percent(roof) if roof is not None else stake * REAL_PRODUCTS_NEEDED / real_products
        line, function = _busiest_line(program, graph, module_key, sites)
        at = line or "the line that multiplies"
        change = (f"if one operand of the product at {at} is real (or purely imaginary), keep it real and multiply "
                  "the other's real and imaginary parts by it: for a real matrix a (a.dtype float32), "
                  "jax.lax.complex(a @ v.real, a @ v.imag) instead of a.astype(jnp.complex64) @ v; for i times a "
                  "real b, jax.lax.complex(-(b @ v.imag), b @ v.real) (for -i times b, jax.lax.complex(b @ v.imag, "
                  "-(b @ v.real))): 2 real matmuls per product instead of "
                  + ("XLA:TPU's 3" if split else "4"))
        out.append(Match(
            "complex_matmul", stake,
            f"{products} complex matmul{'s' if products != 1 else ''} ({shapes}, "
            f"{COMPLEX_NAMES.get(value.dtype if split else example.instruction.dtype, 'complex')})"
            + (f", which XLA:TPU runs as {len(split)} real matmuls: {real_products} per product" if split else
               f", each {real_products} real matmuls' work") + (f", at {line}" if line else "")
            + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            needed_percent=needed, work_ratio=real_products / REAL_PRODUCTS_NEEDED,
            params={"change": change, "real_products": real_products},
            facts={"complex_products": products, "real_products_each": real_products,
                   "real_matmuls": len(split) if split else products * real_products,
                   "needed_tflop_per_step": round(needed_flops / 1e12 / max(float(program.step.get("steps") or 1),
                                                                            1.0), 3)}))
    return out


MEMBERSHIP_MIN_STAKE_PERCENT = 5.0
ANY_ALL = {"or": "any", "and": "all"}
"""A reduction of compares that keeps whether any (or every) pair matched: membership (or its negation)."""


def _reducer(graph: Graph, site: Site) -> str:
    """"any" or "all" where a reduce or reduce-window combines by or/and; else ""."""
    ins = site.instruction
    if ins.opcode not in ("reduce", "reduce-window") or not ins.called:
        return ""
    called = graph.module.computations.get(ins.called[0])
    root = called.by_name.get(called.root) if called is not None else None
    return ANY_ALL.get(root.opcode, "") if root is not None else ""


def _all_pairs_compare(graph: Graph, compare: Site) -> tuple[list[Site], int, int, str] | None:
    """Where an EQ/NE compare of two arrays broadcast against each other (N elements against K values to N×K) is
    reduced by or/and until the K are gone (in one reduce, or as XLA:CPU splits it, a reduce-window then a reduce):
    (the reductions, N, K, "any"/"all"); else None."""
    ins = compare.instruction
    if ins.opcode != "compare" or ins.comparison not in ("EQ", "NE"):
        return None
    made = elements(ins.dims)
    sides = [graph.origin(graph.operand(compare, k)) for k in (0, 1)]
    if any(side is None for side in sides):
        return None
    a, b = (elements(side.instruction.dims) for side in sides)
    if not (1 < a < made and 1 < b < made and a * b == made):
        return None
    chain, current = [], compare
    for _ in range(3):
        reduction = next((u for u in value_readers(graph, current) if _reducer(graph, u)), None)
        if reduction is None:
            return None
        chain.append(reduction)
        kept = elements(reduction.instruction.dims)
        if kept in (a, b):
            return chain, kept, made // kept, _reducer(graph, reduction)
        current = reduction
    return None


@idiom("membership_all_pairs", "op_identity",
       "A membership test compares every element with every listed value",
       "look each id up in a table of the listed values at {line}, as a matmul on the matrix unit: for ids below a "
       "vocabulary size V, rows = -(-V // 128); table = jnp.zeros((rows * 128,), jnp.bfloat16).at[values].set(1)"
       ".reshape(rows, 128); picked = jax.nn.one_hot(x // 128, rows, dtype=jnp.bfloat16) @ table; flagged = "
       "jnp.sum(jnp.where(x[..., None] % 128 == jnp.arange(128), picked, 0), -1) > 0 (each id's 128-wide row of the "
       "table picked by a one-hot matmul, its lane by a compare), instead of jnp.isin(x, values){negated}",
       "jnp.isin's default method compares each element with each listed value, N × K compares on the vector units "
       "and a reduction of them; a table of the listed values answers each element with one look-up. On a TPU, a "
       "gather from a table of V booleans (or of int32), and jnp.isin's sort and binary_search methods, measured no "
       "faster than the compares; the one-hot matmul over 128-wide rows runs on the matrix unit, N × V "
       "multiply-adds. The premise is a known bound V on the ids (a vocabulary), the one-hot matmul's width",
       gain=(0.8, 0.95), measured="docs/reference/measurements.md#membership-by-all-pairs",
       variants=(Variant((("platform", ("GPU", "CPU")),),
                         "look each id up in a table of the listed values at {line}: for ids below a vocabulary size "
                         "V, flagged = jnp.zeros((V,), bool).at[values].set(True)[x] instead of jnp.isin(x, "
                         "values){negated}: N reads of a table instead of N × K compares"),))
def membership_all_pairs(program: Program) -> list[Match]:
    """Reductions by any/all of an EQ/NE compare of N elements against K values broadcast to N×K (jnp.isin's
    default method, or x[:, None] == values[None, :] written out), summed per program."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        found = [(site, pair) for site in graph.sites() if (pair := _all_pairs_compare(graph, site)) is not None]
        if not found:
            continue
        sites = [s for site, (chain, *_) in found for s in [site, *chain]]
        ops, stake = timed_stake(program, graph, sites)
        if stake < MEMBERSHIP_MIN_STAKE_PERCENT:
            continue
        compare, (_, n, k, reducer) = max(found, key=lambda f: elements(f[0].instruction.dims))
        sides = [graph.origin(graph.operand(compare, j)) for j in (0, 1)]
        elements_side, values_side = sorted(sides, key=lambda side: -elements(side.instruction.dims))
        isin = "_in1d" in compare.instruction.op_name or "isin" in compare.instruction.op_name
        negated = reducer == "all" and compare.instruction.comparison == "NE"
        line, function = _busiest_line(program, graph, module_key, sites)
        runs = program.runs.get((module_key, graph.timed_op(compare)), 0)
        out.append(Match(
            "membership_all_pairs", stake,
            ("jnp.isin" if isin else "a broadcast compare")
            + f" compares each of {n:,} elements ({elements_side.instruction.shape_text.split('{')[0]}) with each "
            f"of {k:,} listed values ({values_side.instruction.shape_text.split('{')[0]}): {n * k:.3g} compares "
            f"({compare.instruction.comparison}) a run, reduced by {reducer}"
            + (f", at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"negated": " (its negation for invert=True: ~flagged)" if negated else ""},
            facts={"elements": n, "listed_values": k, "compares_per_run": n * k, "runs": runs,
                   "reduced_by": reducer}))
    return out


PRECISION_PASSES = {"TPU": 6.0, "GPU": 3.0}
"""How many times longer a float32 matmul takes at precision HIGHEST than at the default, by platform. XLA:TPU runs
it as 6 bfloat16 passes on the matrix unit (the default runs 1); a GPU runs it on its float32 units instead of its
TF32 tensor cores, about 3-8x slower by the parts' peaks (3 assumed: a premise). A CPU has no faster mode: the idiom
is offered on accelerators only."""


def _highest_f32(graph, site) -> bool:
    """A matmul or convolution of the program's own that asks for precision HIGHEST and reads float32 operands (on
    bfloat16 operands HIGHEST costs nothing more)."""
    ins = site.instruction
    if ins.opcode not in ("dot", "convolution") or not ins.operand_precision or max(ins.operand_precision) < 2:
        return False
    if routines_of(ins.op_name) or LEAST_SQUARES.search(ins.op_name or ""):
        return False  # the precision JAX's linear-algebra routines choose for their own products
    if FFT_LOWERING.search(ins.op_name or ""):
        return False  # XLA:TPU's lowering of an FFT runs its matmuls at HIGHEST: no precision the program set
    operands = [graph.operand(site, k) for k in range(min(len(ins.operands), 2))]
    return any(o is not None and o.instruction.dtype == "f32" for o in operands)


@idiom("precision_highest_matmul", "memory_numerics",
       "float32 matmuls ask for precision HIGHEST, several passes where the default runs one",
       "let the matmuls at {line} run at the default precision: drop precision=jax.lax.Precision.HIGHEST there and "
       "any jax.config.update(\"jax_default_matmul_precision\", \"highest\") (or jax.default_matmul_precision("
       "\"highest\") around the step) the program sets; f32 accumulation is kept",
       "at precision HIGHEST a TPU computes a float32 matmul as 6 bfloat16 passes on its matrix unit and a GPU skips "
       "its TF32 tensor cores; at the default precision the same product is one pass",
       gain=(0.6, 1.0), measured="docs/reference/measurements.md#precision-highest", lever="matmul_precision",
       alternatives=("where the default's bfloat16 rounding is too coarse, precision=\"bfloat16_3x\" "
                     "(jax.lax.Precision.HIGH: 3 passes on a TPU, TF32 on a GPU) at the same line",
                     "bfloat16 operands with preferred_element_type=jnp.float32 in jnp.dot, where the inputs "
                     "tolerate bfloat16"),
       platforms=("TPU", "GPU"))
def precision_highest_matmul(program: Program) -> list[Match]:
    """The timed ops that hold a float32 matmul at precision HIGHEST, summed per program."""
    passes = PRECISION_PASSES.get(program.platform, PRECISION_PASSES["TPU"])
    out = []
    for key, held in ops_holding(program, _highest_f32).items():
        stake = program.step_percent(held.ms)
        if stake < MIN_STAKE_PERCENT:
            continue
        operands = " × ".join(o.instruction.shape_text.split("{")[0] for o in (
            held.graph.operand(held.example, k) for k in (0, 1)) if o is not None)
        example = f"{opcode_name(held.example.instruction)} {operands}"
        line, function = held.line
        out.append(Match(
            "precision_highest_matmul", stake,
            f"{len(held.ops)} float32 matmul{'s' if len(held.ops) > 1 else ''} at precision HIGHEST (such as "
            f"{example})" + (f", most of their time at {line}" if line else "")
            + f": {stake:g}% of the step on a {program.platform}, where HIGHEST is assumed {passes:g}x the default's "
            "work",
            module=key, ops=held.ops, line=line, function=function,
            needed_percent=stake / passes, work_ratio=passes,  # one pass at the default precision
            facts={"example": example, "example_ms": round(held.example_ms, 3), "precision": "HIGHEST",
                   "assumed_passes": passes}))
    return out


RANDOM_SCOPE = re.compile(r"jit\((_threefry\w*|_random_bits|_bits|_uniform|_bernoulli|_normal\w*|_truncated_normal|"
                          r"_randint|_gumbel|_categorical|_exponential|_choice|_permutation|_shuffle)\)")
"""The jax.random functions an op's framework path names: where the ops that make random numbers come from."""
HASH_XORS = 4
"""A timed op holding this many xors of 32-bit words from jax.random is the threefry hash's rounds (4 per unrolled
block on a CPU, all 20 rounds on an accelerator); turning bits into floats holds one."""
RANDOM_MIN_ELEMENTS = 1024
"""Bits for fewer elements (splitting or folding a key) cost nothing worth a change."""
RANDOM_MIN_STAKE_PERCENT = 5.0


def _random_scope(graph, site) -> str:
    """The jax.random path an instruction is traced from: its own, or (an op XLA made inside a loop, a copy of the
    loop's state) its loop's; "" where neither names a jax.random function."""
    name = site.instruction.op_name
    if not name:
        loop = graph.loop_of(site.computation)
        name = loop.op_name if loop is not None else ""
    return name if RANDOM_SCOPE.search(name) and "rng_bit_generator" not in name else ""


def _hash_ops(graph) -> tuple[set[str], set[str], dict[str, str]]:
    """The timed ops that compute threefry's rounds on 32-bit words (xors of jax.random's paths, or JAX's threefry
    kernel on a GPU), the jax.random loops that hold them, and the jax.random path of each."""
    xors: dict[str, int] = {}
    scope: dict[str, str] = {}
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode == "custom-call" and "threefry" in ins.custom_call_target:
            xors[graph.timed_op(site)] = HASH_XORS
            scope.setdefault(graph.timed_op(site), ins.op_name)
            continue
        if ins.opcode != "xor" or ins.dtype != "u32" or elements(ins.dims) < RANDOM_MIN_ELEMENTS:
            continue
        path = _random_scope(graph, site)
        if path:
            timed = graph.timed_op(site)
            xors[timed] = xors.get(timed, 0) + 1
            scope.setdefault(timed, path)
    hashes = {op for op, n in xors.items() if n >= HASH_XORS}
    loops = set()
    for site in graph.sites():
        loop = graph.loop_of(site.computation)
        # the hash's own rolled rounds; a loop of the program's that draws bits each trip does other work beside them
        if site.instruction.name in hashes and loop is not None and RANDOM_SCOPE.search(loop.op_name):
            loops.add(loop.name)
    return hashes, loops, scope


def _fused_matmul_roof_ms(program: Program, graph: Graph, op: str) -> float:
    """The time the matmuls fused into a timed op need over the capture at the device's peaks (FLOPs, and the bytes
    of their operands and result); 0 where the op holds none or the profile records no peaks."""
    runs = program.runs.get((program.module_key(graph.module), op), 0)
    total = 0.0
    for site in graph.sites():
        if site.instruction.opcode in ("dot", "convolution") and graph.timed_op(site) == op:
            operands = [graph.operand(site, k) for k in range(len(site.instruction.operands))]
            moved = nbytes(site.instruction) + sum(nbytes(o.instruction) for o in operands if o is not None)
            total += (program.roof_ms(flops=matmul_flops(graph, site), hbm_bytes=moved) or 0.0) * runs
    return total


@idiom("threefry_random_bits", "op_identity",
       "Random bits from the threefry hash hold a large share of the step",
       "make the random bits with the rbg generator: jax.config.update(\"jax_default_prng_impl\", \"rbg\") at the "
       "start of the program, before any key is made (or jax.random.key(seed, impl=\"rbg\") where the key for "
       "{calls} is made); the calls at {line} stay as written",
       "JAX's default generator computes 20 rounds of the threefry2x32 hash in 32-bit integer ops for every two "
       "words of random bits, on the vector units; rbg draws the bits with XLA's RngBitGenerator, which an "
       "accelerator runs at a fraction of that cost. Its bits differ from threefry's for the same seed (results "
       "change, not their statistics), and rbg's keys split and fold in by the threefry hash still",
       gain=(0.7, 0.95), measured="docs/reference/measurements.md#threefry-random-bits",
       alternatives=("jax.random.key(seed, impl=\"unsafe_rbg\") for masks and noise only: its split and fold_in are "
                     "cheaper still, their streams without threefry's guarantee of independence",
                     "draw fewer bits: one jax.random.bits call for a mask reused where the program draws the same "
                     "shape several times"),
       platforms=("TPU", "GPU"))
def threefry_random_bits(program: Program) -> list[Match]:
    out = []
    for graph in program.graphs:
        hashes, loops, scope = _hash_ops(graph)
        if not hashes:
            continue
        ops: list[str] = list(hashes)
        for site in graph.sites():  # the copies of a rolled hash loop's state are its work too
            loop = graph.loop_of(site.computation)
            if loop is not None and loop.name in loops and site.instruction.opcode not in (
                    "parameter", "tuple", "get-tuple-element") and graph.timed_op(site) not in ops:
                ops.append(graph.timed_op(site))
        module_key = program.module_key(graph.module)
        ops = [op for op in ops if program.op_ms.get((module_key, op), 0.0) > 0]
        # XLA:TPU recomputes the bits inside each matmul fusion that reads a mask: the hash holds what such an op
        # takes beyond its matmul's own time at the device's roof
        hash_ms = sum(max(program.op_ms[(module_key, op)] - _fused_matmul_roof_ms(program, graph, op), 0.0)
                      for op in ops)
        stake = program.step_percent(hash_ms)
        if stake < RANDOM_MIN_STAKE_PERCENT:
            continue
        calls = sorted({name.lstrip("_") for op in hashes if op in scope
                        for name in RANDOM_SCOPE.findall(scope[op]) if not name.startswith("_threefry")})
        sites = [s for s in graph.sites() if s.instruction.name in hashes or (
            s.instruction.opcode == "xor" and graph.timed_op(s) in hashes)]
        line, function = _busiest_line(program, graph, module_key, sites)
        words = max((elements(s.instruction.dims) for s in sites if s.instruction.opcode == "xor"), default=0)
        named = ", ".join(f"jax.random.{c}" for c in calls) or "jax.random"
        out.append(Match(
            "threefry_random_bits", stake,
            f"{len(ops)} ops compute the threefry2x32 hash (xors, shifts and adds of 32-bit words, up to {words:,} "
            f"words per op) for {named}" + (f" at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"calls": named},
            facts={"hash_ops": len(hashes), "words_per_op": words, "random_calls": calls,
                   "rolled_loop": bool(loops)}))
    return out


TINY_LOOP_MIN_TRIPS = 1024
"""A loop this long pays its per-trip cost (the trip's condition, its counter, one launch per op) this many times."""
UNROLLED_TRIPS = 512
"""The trips the change leaves: it unrolls by the power of two (8 to 128) that brings the loop to at most this many."""
TINY_TRIP_MAX_US = 20.0
"""A trip shorter than this on an accelerator is mostly that per-trip cost: a few ops' fixed latency."""
TINY_LOOP_MIN_STAKE_PERCENT = 10.0
HEAVY_OPS = frozenset({"dot", "convolution", "custom-call", "while", "sort", "scatter", "gather"})
"""Ops whose work in a trip can outweigh the trip's fixed cost (a recurrence's matmul is the latency-bound loop's
own finding)."""


def _loop_time_ms(program: Program, graph, loop_site) -> tuple[float, list[str]]:
    """The time of a while loop over the capture, and the ops that hold it: its trips' ops (body and condition), the
    loop op itself, or the op that calls the loop's computation where the trips are not timed one by one."""
    module_key = program.module_key(graph.module)
    called = set(loop_site.instruction.called)
    ops = [graph.timed_op(s) for s in graph.sites() if s.computation.name in called or (
        graph.loop_of(s.computation) is loop_site.instruction)]
    ops = list(dict.fromkeys(op for op in ops + [loop_site.instruction.name] if (module_key, op) in program.op_ms))
    if not ops:  # the loop runs inside one timed call (XLA:CPU compiles a small loop into one kernel)
        caller = graph.callers.get(loop_site.computation.name)
        if caller is not None and caller.instruction.opcode == "call":
            ops = [name for name in [graph.timed_op(caller)] if (module_key, name) in program.op_ms]
    return sum(program.op_ms[(module_key, op)] for op in ops), ops


_AFFINE_SUMS = frozenset({"add", "subtract"})
_AFFINE_SCALES = frozenset({"multiply", "divide"})


def _affine_in_state(graph: Graph, site: Site | None, body, index: int, seen: dict, depth: int = 64):
    """How a value of a loop body depends on element `index` of the state the trip found: (depends, scaled) where it
    is an affine function of it (sums, products and quotients by values that do not depend on it, selects between
    such values), None where it is not affine in it. Through fusions, their parameters and results, and ops that only
    re-shape or re-type a value."""
    if site is None or depth <= 0:
        return None
    key = (site.computation.name, site.instruction.name)
    if key in seen:
        return seen[key]
    seen[key] = None  # a cycle is no affine expression
    ins = site.instruction
    result = None
    if ins.opcode == "get-tuple-element" and site.computation is body and ins.operands and \
            body.by_name.get(ins.operands[0]) is not None and body.by_name[ins.operands[0]].opcode == "parameter":
        result = (ins.tuple_index == index, False)
    elif ins.opcode == "get-tuple-element" and ins.operands:
        made = graph.operand(site, 0)
        called = graph.module.computations.get(made.instruction.called[0]) \
            if made is not None and made.instruction.opcode == "fusion" and made.instruction.called else None
        root = called.by_name.get(called.root) if called is not None else None
        if root is not None and root.opcode == "tuple" and ins.tuple_index < len(root.operands):
            result = _affine_in_state(graph, Site(called, called.by_name[root.operands[ins.tuple_index]]), body,
                                      index, seen, depth - 1)
        else:
            result = _independent(graph, site, body, index, seen, depth)
    elif graph.producer(site) is not None:
        result = _affine_in_state(graph, graph.producer(site), body, index, seen, depth - 1)
    elif ins.opcode in _AFFINE_SUMS or ins.opcode in _AFFINE_SCALES or ins.opcode in ("select", "negate"):
        parts = [_affine_in_state(graph, graph.operand(site, k), body, index, seen, depth - 1)
                 for k in range(len(ins.operands))]
        if all(p is not None for p in parts):
            depends = [p[0] for p in parts]
            if ins.opcode == "select":
                result = None if depends[0] else (any(depends[1:]), any(p[1] for p in parts[1:]))
            elif ins.opcode in _AFFINE_SCALES:
                # a product of two values that both depend on the state, or a state in a divisor, is not affine
                result = None if all(depends) or (ins.opcode == "divide" and depends[1]) else \
                    (any(depends), any(depends) or any(p[1] for p in parts))
            else:
                result = (any(depends), any(p[1] for p in parts))
    else:
        result = _independent(graph, site, body, index, seen, depth)
    seen[key] = result
    return result


def _independent(graph: Graph, site: Site, body, index: int, seen: dict, depth: int):
    """(False, False) where no operand of the op depends on the state element (a constant term of the
    recurrence), else None."""
    for k in range(len(site.instruction.operands)):
        part = _affine_in_state(graph, graph.operand(site, k), body, index, seen, depth - 1)
        if part is None or part[0]:
            return None
    return (False, False)


def linear_recurrence(graph: Graph, body) -> bool:
    """Whether a loop carries one array from trip to trip, and the value it passes on is the one it found multiplied
    by something and added to something (h = a * h + b, read from the HLO): an associative scan's recurrence."""
    carried = graph.carried(body)
    root = body.by_name.get(body.root)
    if len(carried) != 1 or root is None or root.opcode != "tuple":
        return False
    (index,) = carried
    found = _affine_in_state(graph, Site(body, body.by_name[root.operands[index]]), body, index, {})
    return found == (True, True)


LINEAR_RECURRENCE = ("where the recurrence is linear (h = a * h + b), jax.lax.associative_scan over the whole "
                     "sequence: log2(n) vectorised passes instead of n trips")
"""The change for a linear recurrence, whichever way its loop is written; on a TPU the withheld unroll's finding
names the chip's measurement of it (the recogniser cannot tell a linear recurrence from the HLO: no gain predicted)."""


@idiom("scan_tiny_body", "op_identity",
       "A loop runs thousands of trips whose bodies are so small that each trip's fixed cost sets the time",
       "{change}",
       "each trip of a while loop (lax.scan, lax.fori_loop) pays a fixed cost on an accelerator: its condition and "
       "counter, and on a GPU one launch per op of its body, a few microseconds whatever the body's size; unrolled k "
       "times the loop pays it once per k steps and XLA can fuse the k bodies, and a loop whose trips are "
       "independent needs no loop at all",
       gain=(0.3, 0.8), lever="scan_unroll",
       alternatives=(LINEAR_RECURRENCE,),
       platforms=("TPU", "GPU"),
       variants=(Variant((("linear", (True,)),), gain=(0.9, 1.0),
                         measured="docs/reference/measurements.md#scan-linear-recurrence"),
                 Variant((("platform", ("TPU",)), ("independent", (False,)), ("linear", (False,))),
                         withheld="on a TPU v5e unrolling such a loop made it slower: a moving average of 16 "
                                  "channels, jax.lax.scan over 65,536 trips of about 0.1 µs each, took 5.99 ms a step "
                                  "as written and 9.47 ms with unroll=128 "
                                  "(docs/reference/measurements.md#scan-tiny-body-on-a-tpu; one program measured): "
                                  "a TPU runs the trips on the chip, with no launch per op for unrolling to save. The "
                                  "change to time instead, before and after: " + LINEAR_RECURRENCE + " (on the "
                                  "chip it took that moving average from 5.99 to 0.577 ms a step)"),))
def scan_tiny_body(program: Program) -> list[Match]:
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for loop_site in graph.sites():
            loop = loop_site.instruction
            if loop.opcode != "while" or loop.trip_count < TINY_LOOP_MIN_TRIPS or not loop.called or \
                    loop.op_name.rsplit("/", 1)[-1] != "while":  # JAX's loops, not one XLA makes (of a scatter)
                continue
            body = graph.module.computations.get(loop.called[0])
            inner = [s for s in graph.sites() if s.computation.name in loop.called or
                     graph.loop_of(s.computation) is loop]
            if body is None or any(s.instruction.opcode in HEAVY_OPS for s in inner):
                continue
            ms, ops = _loop_time_ms(program, graph, loop_site)
            if not ops:
                continue
            # the loop's executions: the runs of the op that times it whole, else its trips' runs over its trips
            whole = ops[0] if len(ops) == 1 and ops[0] not in {s.instruction.name for s in inner} else ""
            runs = program.runs.get((module_key, whole), 0) if whole else \
                max(program.runs.get((module_key, op), 0) for op in ops) // loop.trip_count
            trip_us = 1e3 * ms / (max(runs, 1) * loop.trip_count)
            stake = program.step_percent(ms)
            if trip_us > TINY_TRIP_MAX_US or stake < TINY_LOOP_MIN_STAKE_PERCENT:
                continue
            line, function = program.line_of(graph, loop_site)
            independent = not graph.carried(body)
            # what a trip computes on: its values, not the stacked outputs it writes one slice of
            per_trip = [s for s in inner if s.computation.name == body.name and s.instruction.opcode not in (
                "parameter", "tuple", "get-tuple-element", "constant")]
            largest = max((nbytes(s.instruction) for s in per_trip if s.instruction.dtype != "tuple" and (
                graph.origin(s) is None or graph.origin(s).instruction.opcode != "dynamic-update-slice")), default=0)
            at = line or "the line that runs the loop"
            unroll = min(max(8, 1 << max(-(-loop.trip_count // UNROLLED_TRIPS) - 1, 0).bit_length()), 128)
            linear = not independent and linear_recurrence(graph, body)
            same = next((m for m in out if m.module == module_key and m.line and m.line == line
                         and m.params["linear"] == linear), None)
            if same is not None:  # the same scan again: its gradient's loop, run backwards, or another layer's
                same.ops.extend(op for op in ops if op not in same.ops)
                same.stake_percent = min(round(same.stake_percent + stake, 2), 100.0)
                same.facts["loops"] += 1
                same.what = same.what.split("; with ")[0] + (
                    f"; with {same.facts['loops'] - 1} more such loop(s) of the same line (its gradient's, run "
                    f"backwards, or another call's): {same.stake_percent:g}% of the step together")
                continue
            change = (f"drop the loop at {at}: its trips read nothing an earlier trip computed, so one vectorised "
                      "op does them all (jax.vmap(body)(xs), or the body written on the whole arrays)"
                      if independent else
                      f"evaluate the recurrence at {at} by jax.lax.associative_scan over the whole sequence instead "
                      "of jax.lax.scan: each trip multiplies the state it carries by one value and adds another (h "
                      "= a * h + b), and such steps compose associatively, so with combine = lambda x, y: (y[0] * "
                      "x[0], y[0] * x[1] + y[1]), hs = jax.lax.associative_scan(combine, (a, b), axis=<the time "
                      f"axis>)[1] computes all {loop.trip_count:,} states in log2(n) vectorised passes (jax.grad "
                      "differentiates it the same way); unrolling the scan instead recovers less, and on a TPU v5e "
                      "unroll=128 made a 65,536-trip moving average slower (5.99 to 9.47 ms a step) where the "
                      "associative scan took it to 0.577 ms, and unroll=16 shortened a 4,096-trip recurrence's "
                      "training step 45.3% where the associative scan shortened it 78.7% "
                      "(docs/reference/measurements.md#scan-linear-recurrence)" if linear else
                      f"unroll the loop at {at}: jax.lax.scan(body, carry, xs, unroll={unroll}) (jax.lax.fori_loop("
                      f"lower, upper, body, init, unroll={unroll})), so each trip runs {unroll} steps and the loop "
                      f"{-(-loop.trip_count // unroll):,} trips")
            out.append(Match(
                "scan_tiny_body", stake,
                f"a while loop of {loop.trip_count:,} trips per execution"
                + (f" at {line}" if line else "") + f" runs {len(per_trip)} ops per trip on arrays of at most "
                f"{largest:,} bytes, {trip_us:.3g} µs a trip: {stake:g}% of the step"
                + ("; no trip reads what an earlier one computed" if independent else ""),
                module=module_key, ops=ops[:16], line=line, function=function,
                params={"change": change, "trips": loop.trip_count, "unroll": unroll, "independent": independent,
                        "linear": linear},
                facts={"trips": loop.trip_count, "trip_us": round(trip_us, 3), "largest_bytes": largest,
                       "independent_trips": independent, "linear_recurrence": linear, "loops": 1}))
    return out


SCATTER_MIN_STAKE_PERCENT = 10.0
ONE_HOT_MAX_SEGMENTS = 1024
"""Up to this many segments a one-hot matmul (segments × rows × width multiply-adds on the matrix unit) is a
plausible stand-in for the scatter."""


def _adds(graph, site) -> bool:
    """A scatter whose update combines by addition (its to_apply computation's root is an add)."""
    called = graph.module.computations.get(site.instruction.called[0]) if site.instruction.called else None
    root = called.by_name.get(called.root) if called is not None else None
    return root is not None and root.opcode == "add"


def _sorted_for(graph: Graph, scatter: Site) -> Site | None:
    """The sort XLA adds before a scatter whose indices are not declared sorted (XLA:TPU sorts them on every run,
    then scatters them as sorted): the sort its indices come from, made for the same framework op, where the program
    wrote the scatter (not autodiff's, the gradient of a gather: transpose(...)) and its indices are a constant of
    the program, so that sorting them once, outside the step, is the change (ids made per call XLA sorts anyway)."""
    made = graph.origin(graph.operand(scatter, 1))
    if made is None or made.instruction.opcode != "get-tuple-element" or "transpose(" in scatter.instruction.op_name:
        return None
    sort = graph.operand(made, 0)
    if sort is None or sort.instruction.opcode != "sort" or sort.instruction.op_name != scatter.instruction.op_name:
        return None
    keys = graph.origin(graph.operand(sort, 0))
    return sort if keys is not None and keys.instruction.opcode == "constant" else None


@idiom("scatter_unsorted_indices", "op_identity",
       "A scatter-add whose indices are not declared sorted holds the step",
       "sort the segment ids once where the data is prepared (order = jnp.argsort(ids); ids, rows = ids[order], "
       "rows[order], outside the step when the ids are fixed) and declare it at {line}: "
       "jax.ops.segment_sum(rows, ids, num_segments={segments}, indices_are_sorted=True) (or "
       "x.at[ids].add(rows, indices_are_sorted=True))",
       "XLA runs a scatter-add whose indices may come in any order as updates that can collide anywhere in the "
       "output, serialised or made atomic; with the indices sorted and declared so, the updates to one row are "
       "contiguous and can be summed before they are written. That a sort per call, where the ids change every "
       "step, costs less than it saves is a premise",
       gain=(0.2, 0.6), measured="docs/reference/measurements.md#scatter-unsorted-indices",
       alternatives=(f"for at most {ONE_HOT_MAX_SEGMENTS} segments, a one-hot matmul on the matrix unit: "
                     "jax.nn.one_hot(ids, num_segments, dtype=rows.dtype).T @ rows (its premise: segments × rows × "
                     "width multiply-adds cost less than the scatter)",))
def scatter_unsorted_indices(program: Program) -> list[Match]:
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        sites, sorts = [], []
        for site in graph.sites():
            if site.instruction.opcode != "scatter" or not _adds(graph, site) or \
                    (module_key, graph.timed_op(site)) not in program.op_ms:
                continue
            sort = _sorted_for(graph, site)
            if not site.instruction.indices_are_sorted or sort is not None:
                sites.append(site)
                sorts += [sort] if sort is not None else []
        if not sites:
            continue
        ops = list(dict.fromkeys(graph.timed_op(s) for s in sites + sorts))
        stake = program.step_percent(program.time_ms(graph.module, ops))
        if stake < SCATTER_MIN_STAKE_PERCENT:
            continue
        top = max(sites, key=lambda s: program.op_ms[(module_key, graph.timed_op(s))])
        scatters, sorted_by = len({graph.timed_op(s) for s in sites}), len({s.instruction.name for s in sorts})
        indices, updates = graph.operand(top, 1), graph.operand(top, 2)
        line, function = program.line_of(graph, top)
        segments = top.instruction.dims[0] if top.instruction.dims else 0
        shape = lambda s: s.instruction.shape_text.split("{")[0] if s is not None else "?"  # noqa: E731
        out.append(Match(
            "scatter_unsorted_indices", stake,
            f"{scatters} scatter-add{'s' if scatters > 1 else ''} (such as {shape(updates)} added into "
            f"{shape(top)} at {shape(indices)} indices, "
            + (f"not declared sorted: XLA sorts them on every run, {sorted_by} sort{'s' if sorted_by > 1 else ''})"
               if sorts else "indices_are_sorted=false)")
            + (f" at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"segments": segments or "n"},
            facts={"segments": segments, "indices": shape(indices), "updates": shape(updates),
                   "one_hot_plausible": 0 < segments <= ONE_HOT_MAX_SEGMENTS}))
    return out


LEAST_SQUARES = re.compile(r"(?:^|[/(])_?(pinv|lstsq)(?=[)/]|$)")
"""jax.numpy.linalg's solvers that compute a singular value decomposition: the pseudo-inverse and least squares."""
SVD_MIN_STAKE_PERCENT = 10.0


@idiom("svd_for_least_squares", "op_identity",
       "A singular value decomposition is computed to solve a least-squares system",
       "solve at {line} with a factorisation that costs a fraction of an SVD: for a matrix of full column rank, "
       "q, r = jnp.linalg.qr(a) and x = jax.scipy.linalg.solve_triangular(r, q.T @ b) instead of "
       "jnp.linalg.{routine}(a{rest}",
       "jnp.linalg.pinv and jnp.linalg.lstsq compute a full singular value decomposition, an iterative eigen-solver "
       "many times the cost of a QR or Cholesky factorisation of the same matrix (on a TPU, several times more "
       "again); a matrix of full column rank needs no singular values to be solved. The premise is that rank: a "
       "rank-deficient or near-singular matrix is what the SVD's cut-off is for",
       gain=(0.5, 0.9), measured="docs/reference/measurements.md#svd-for-least-squares",
       alternatives=("for a well-conditioned a, the normal equations: c = jax.scipy.linalg.cho_factor(a.T @ a); "
                     "x = jax.scipy.linalg.cho_solve(c, a.T @ b) (they square the condition number)",))
def svd_for_least_squares(program: Program) -> list[Match]:
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        routines: dict[str, float] = {}
        ops: list[str] = []
        lines: dict[tuple[str, str], float] = {}
        for site in graph.sites():
            found = LEAST_SQUARES.findall(site.instruction.op_name or "")
            timed = graph.timed_op(site)
            if not found or not routines_of(site.instruction.op_name) & {"svd", "eigh"} or \
                    (module_key, timed) not in program.op_ms:
                continue
            ms = program.op_ms[(module_key, timed)] if timed not in ops else 0.0
            if timed not in ops:
                ops.append(timed)
            routines[found[-1]] = routines.get(found[-1], 0.0) + ms
            line = program.line_of(graph, site)
            if line[0]:
                lines[line] = lines.get(line, 0.0) + ms
        stake = program.step_percent(program.time_ms(graph.module, ops))
        if not ops or stake < SVD_MIN_STAKE_PERCENT:
            continue
        routine = max(routines, key=routines.get)
        line, function = max(lines, key=lines.get) if lines else ("", "")
        out.append(Match(
            "svd_for_least_squares", stake,
            f"{len(ops)} ops of the singular value decomposition jnp.linalg.{routine} computes"
            + (f" at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"routine": routine, "rest": ") @ b" if routine == "pinv" else ", b)"},
            facts={"routines_ms": {r: round(v, 3) for r, v in routines.items()}}))
    return out


INTEGER_MATMUL_MIN_STAKE_PERCENT = 1.0
"""An integer matmul holding less of the step than this is noise."""
INTEGER_TYPES = frozenset({"s16", "u16", "s32", "u32", "s64", "u64"})
"""Integer types no matrix unit takes (TPU MXUs take bfloat16 and int8, GPU tensor cores 8-bit integers)."""


@idiom("integer_matmul", "op_identity",
       "A matmul multiplies 32- or 64-bit integers, which the matrix unit does not take",
       "multiply in floating point at {line}: jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)).astype("
       "{dtype_name}) (exact while every sum stays below 2**24: counts, 0/1 indicators); for 0/1 or small values, "
       "bfloat16 operands with preferred_element_type=jnp.float32, or int8 ones with "
       "preferred_element_type=jnp.int32",
       "the matrix units multiply bfloat16 (and int8) operands; a matmul of wider integers is lowered to multiplies "
       "and adds on the vector units, at a small fraction of the matrix unit's rate",
       gain=(0.5, 0.9), measured="docs/reference/measurements.md#integer-matmul")
def integer_matmul(program: Program) -> list[Match]:
    """Dots whose operands are 16-, 32- or 64-bit integers (not int8, which TPU and GPU matrix units take)."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            # XLA:TPU writes a dot as a convolution that is a matrix product
            if not (ins.opcode == "dot" or ins.opcode == "convolution" and ins.conv_is_matrix_product) \
                    or len(ins.operands) != 2:
                continue
            operands = [graph.operand(site, k) for k in (0, 1)]
            if any(o is None or o.instruction.dtype not in INTEGER_TYPES for o in operands):
                continue
            lhs, rhs = (o.instruction for o in operands)
            flops = matmul_flops(graph, site)
            line, function = program.line_of(graph, site)
            ops, stake = timed_stake(program, graph, [site])
            if not ops or stake < INTEGER_MATMUL_MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            out[(module_key, line or ops[0])] = Match(
                "integer_matmul", stake,
                f"{opcode_name(ins)} {lhs.shape_text.split('{')[0]} × {rhs.shape_text.split('{')[0]} → "
                f"{ins.shape_text.split('{')[0]} ({flops / 1e9:.3g} GFLOP a run) multiplies {lhs.dtype} integers"
                + (f" at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                params={"dtype": lhs.dtype, "dtype_name": f"jnp.{_NUMPY_NAMES.get(ins.dtype, 'int32')}"},
                facts={"dtype": lhs.dtype, "flops_per_run": flops,
                       "runs": program.runs.get((module_key, ops[0]), 0)})
    return list(out.values())


_NUMPY_NAMES = {"s16": "int16", "u16": "uint16", "s32": "int32", "u32": "uint32", "s64": "int64", "u64": "uint64"}


DECOMPOSITIONS = frozenset({"svd", "eigh"})
"""lax.linalg's full decompositions whose values a program may read only at their extremes."""
EXTREME_READERS = {"maximum": "largest", "minimum": "smallest"}
DECOMPOSITION_MIN_STAKE_PERCENT = 10.0
PASSING = frozenset({"reverse", "tuple", "get-tuple-element", "parameter", "constant", "copy", "copy-start",
                     "copy-done",
                     "bitcast", "reshape", "convert", "broadcast", "transpose", "while", "conditional", "call",
                     "fusion", "async-start", "async-done"})
"""Ops that hold or pass a value on (XLA's own, often with no framework op of their own): no reader of it."""


def _source(graph: Graph, site: Site | None) -> Site | None:
    """Where a value is made, through ops that only re-shape or re-order it (a reverse: svd sorts its values)."""
    site = graph.origin(site)
    while site is not None and site.instruction.opcode == "reverse" and site.instruction.operands:
        site = graph.origin(graph.operand(site, 0))
    return site


def _inside(instruction) -> bool:
    return bool(routines_of(instruction.op_name) & DECOMPOSITIONS)


def _extreme(graph: Graph, reader: Site, value: Site) -> str:
    """What a reader of a decomposition's values keeps: 'largest' or 'smallest' (a max or min reduction, or a slice
    or gather of at most two values per matrix), else ''."""
    ins = reader.instruction
    if ins.opcode in ("reduce", "reduce-window") and ins.called:
        called = graph.module.computations.get(ins.called[0])
        root = called.by_name.get(called.root) if called is not None else None
        return EXTREME_READERS.get(root.opcode, "") if root is not None else ""
    source = value.instruction
    if ins.opcode in ("slice", "dynamic-slice", "gather") and source.dims and \
            elements(ins.dims) <= 2 * elements(source.dims) // source.dims[-1]:
        return "extreme"
    return ""


@idiom("decomposition_for_one_value", "op_identity",
       "A full matrix decomposition is computed to read one extreme value",
       "{change}",
       "jnp.linalg.svd and eigh (and norm(ord=2), cond, eigvalsh, which call them) compute every singular value or "
       "eigenvalue with an iterative solver (on a TPU, QDWH and Jacobi rounds of QR and Cholesky factorisations), "
       "hundreds of matrix products' worth of work; the largest value alone is the limit of repeated matrix-vector "
       "products. The premise is a gap between the largest value and the next: the iteration converges as their "
       "ratio to the power of the rounds, so the rounds set the accuracy",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#a-decomposition-for-its-largest-value",
       alternatives=("for the k largest eigenvalues of a symmetric matrix (or of w.T @ w), "
                     "jax.experimental.sparse.linalg.lobpcg_standard(a, x0) with x0 of k columns (its premise: "
                     "k much smaller than the matrix, at most a fifth of it)",
                     "in a training loop, keep the power-iteration vector between steps and run one round a step, as "
                     "spectral normalisation layers do (the weights change little from step to step)"),
       variants=(Variant((("extreme", ("smallest",)),),
                         withheld="the smallest singular value or eigenvalue is no limit of matrix-vector products of "
                                  "the matrix itself (inverse iteration needs a factorisation of it), and no "
                                  "cheaper way to it has been timed"),))
def decomposition_for_one_value(program: Program) -> list[Match]:
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        inside = [s for s in graph.sites() if _inside(s.instruction)]
        if not inside:
            continue
        ops = list(dict.fromkeys(op for op in (graph.timed_op(s) for s in inside) if (module_key, op) in program.op_ms))
        stake = program.step_percent(program.time_ms(graph.module, ops))
        if stake < DECOMPOSITION_MIN_STAKE_PERCENT:
            continue
        # every op outside the decomposition that reads one of its values keeps only an extreme one of them
        kept: set[str] = set()
        others = False
        for site in graph.sites():
            ins = site.instruction
            # XLA's own ops carry no framework op (a reduction split in two, as XLA:CPU splits a max, keeps its kind)
            if _inside(ins) or ins.opcode in PASSING or not ins.op_name and ins.opcode != "reduce-window":
                continue
            for k in range(len(ins.operands)):
                value = _source(graph, graph.operand(site, k))
                if value is None or not _inside(value.instruction):
                    continue
                extreme = _extreme(graph, site, value)
                if extreme:
                    kept.add(extreme)
                others = others or not extreme
        if not kept or others or _returned(graph):
            continue
        routine = "svd" if any("svd" in routines_of(s.instruction.op_name) for s in inside) else "eigh"
        line, function = _busiest_line(program, graph, module_key, inside)
        extreme = next(iter(kept)) if len(kept) == 1 else "extreme"
        at = line or "the line that decomposes the matrix"
        change = (f"find the largest singular value at {at} by power iteration instead of a full "
                  f"{'singular value' if routine == 'svd' else 'eigen'} decomposition: v = jnp.ones(n) / "
                  "jnp.sqrt(n); v = jax.lax.fori_loop(0, 40, lambda _, v: (u := w.T @ (w @ v)) / jnp.linalg.norm(u), "
                  "v); sigma = jnp.linalg.norm(w @ v) (for a symmetric matrix a, the largest |eigenvalue|: v = a @ v "
                  "per round, then jnp.linalg.norm(a @ v)); instead of jnp.linalg.norm(w, 2), "
                  "jnp.linalg.svd(w, compute_uv=False)[0] or jnp.linalg.eigvalsh(a)[-1]")
        out.append(Match(
            "decomposition_for_one_value", stake,
            f"{len(ops)} ops of the {'singular value' if routine == 'svd' else 'eigen'} decomposition JAX's "
            f"{routine} computes" + (f" at {line}" if line else "")
            + f" hold {stake:g}% of the step, and the program reads only "
            + {"largest": "the largest of the values it returns (a max reduction)",
               "smallest": "the smallest of the values it returns (a min reduction)"}.get(
                extreme, "one or two of the values it returns (a slice)"),
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"change": change, "routine": routine, "extreme": extreme},
            facts={"routine": routine, "op_count": len(ops), "reads": sorted(kept)}))
    return out


def _returned(graph: Graph) -> bool:
    """Whether a decomposition's values are the program's own outputs: then they are read whole."""
    return any((value := _source(graph, output)) is not None and _inside(value.instruction)
               for output in graph.outputs())


def _busiest_line(program: Program, graph: Graph, module_key: str, sites: Iterable[Site]) -> tuple[str, str]:
    """The user's (line, function) that holds the most op time among these sites; ("", "") where none has a line."""
    by_line: dict[tuple[str, str], float] = {}
    for site in sites:
        line = program.line_of(graph, site)
        if line[0]:
            by_line[line] = by_line.get(line, 0.0) + program.op_ms.get((module_key, graph.timed_op(site)), 0.0)
    return max(by_line, key=by_line.get) if by_line else ("", "")


SOLVE_READERS = {"dot": "product", "convolution": "product", "multiply": "product", "divide": "divide", "log": "log"}
"""What a solve and a log-determinant do with an eigendecomposition's outputs: the vectors multiplied with a vector
(V.T @ y, then V @ z: a matmul, or XLA's multiply and reduce), the values divided into it and their logs summed."""


def _eigh_readers(graph: Graph, inside: list[Site]) -> tuple[set[str], list[Site], list[Site]]:
    """What the program's own ops outside eigh do with its outputs (SOLVE_READERS' kinds, "other" for anything else),
    those ops, and the decomposition's ops whose values they read (its outputs)."""
    kinds: set[str] = set()
    readers: list[Site] = []
    outputs: list[Site] = []
    for site in inside:
        if all(_inside(user) for user in site.computation.users.get(site.instruction.name, [])):
            continue  # read only inside the decomposition
        for reader in graph.users(site):
            ins = reader.instruction
            if _inside(ins) or ins.opcode in PASSING or not ins.op_name:
                continue  # XLA's own ops carry no framework op
            kinds.add(SOLVE_READERS.get(ins.opcode, "other"))
            readers.append(reader)
            outputs.append(site)
    return kinds, readers, outputs


def _eigh_matrices(outputs: list[Site]) -> tuple[int, int]:
    """(order, how many matrices) of the eigenvectors an eigh returns: the largest float array of shape (..., n, n)
    among its outputs; (0, 0) where none is."""
    shapes = [dims for site in outputs for dtype, dims in (site.instruction.tuple_shapes or (
        (site.instruction.dtype, site.instruction.dims),)) if dtype.startswith(("f", "c")) and len(dims) >= 2
        and dims[-1] == dims[-2]]
    if not shapes:
        return 0, 0
    dims = max(shapes, key=elements)
    return dims[-1], elements(dims[:-2])


@idiom("eigendecomposition_for_solve", "op_identity",
       "A full eigendecomposition is computed to solve a system and take its log-determinant",
       "{change}",
       "jnp.linalg.eigh computes every eigenvalue and eigenvector with an iterative solver (on a TPU, QDWH and "
       "Jacobi rounds of QR and Cholesky factorisations), hundreds of matrix products' worth of work; a solve and a "
       "log-determinant need one Cholesky factorisation, n³/3 multiply-adds, and two triangular solves. The premise is "
       "a symmetric positive-definite matrix (a kernel or covariance matrix with noise on its diagonal), which the log "
       "of its eigenvalues already assumes",
       gain=(0.97, 1.0), measured="docs/reference/measurements.md#eigendecomposition-for-solve",
       alternatives=("jnp.linalg.slogdet(k)[1] and jnp.linalg.solve(k, y) at the same line: an LU factorisation with "
                     "pivoting, with no premise that the matrix is positive definite (on a TPU v5e 97.4% faster than "
                     "eigh where the Cholesky factor was 99.2%)",))
def eigendecomposition_for_solve(program: Program) -> list[Match]:
    """Symmetric eigendecompositions whose outputs the program reads only to solve a system and sum the logs of the
    eigenvalues: the vectors in products with a vector, the values divided into them and their logs summed."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        inside = [s for s in graph.sites() if "eigh" in routines_of(s.instruction.op_name)]
        if not inside:
            continue
        ops, stake = timed_stake(program, graph, inside)
        if stake < DECOMPOSITION_MIN_STAKE_PERCENT:
            continue
        kinds, readers, outputs = _eigh_readers(graph, inside)
        solves, logdet = {"product", "divide"} <= kinds, "log" in kinds
        if not (solves or logdet) or "other" in kinds or _returned(graph):
            continue
        order, matrices = _eigh_matrices(outputs)
        line, function = _busiest_line(program, graph, module_key, inside)
        at = line or "the line that decomposes the matrix"
        steps = ["chol = jnp.linalg.cholesky(k)"]
        replaced = ["w, v = jnp.linalg.eigh(k)"]
        if solves:
            steps.append("alpha = jax.scipy.linalg.cho_solve((chol, True), y)")
            replaced.append("v @ ((v.T @ y) / w)")
        if logdet:
            steps.append("logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))")
            replaced.append("jnp.sum(jnp.log(w))")
        change = (f"factor the matrix by Cholesky at {at} instead of decomposing it with jnp.linalg.eigh: "
                  f"{'; '.join(steps)}, in place of {', '.join(replaced[:-1])} and {replaced[-1]}"
                  + (" (jnp.diagonal(chol, axis1=-2, axis2=-1) for a stack of matrices)" if logdet else ""))
        uses = " and ".join(
            (["its eigenvectors only in products with a vector and its eigenvalues divided into them (a solve)"]
             if solves else []) + (["the sum of its eigenvalues' logs (a log-determinant)"] if logdet else []))
        out.append(Match(
            "eigendecomposition_for_solve", stake,
            f"{len(ops):,} ops of the eigendecomposition JAX's eigh computes" + (f" at {line}" if line else "")
            + (f", of {matrices:,} matri{'x' if matrices == 1 else 'ces'} of order {order:,}," if order else "")
            + f" hold {stake:g}% of the step, and the program reads {uses}",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"change": change, "solves": solves, "logdet": logdet},
            facts={"op_count": len(ops), "order": order, "matrices": matrices,
                   "readers": sorted({reader.instruction.opcode for reader in readers})}))
    return out


LONG_WINDOW_MIN_TAPS = 512
"""A convolution window this long or longer is one an FFT does faster (n·log n per channel against n·taps): on the
chip, 8 sequences of 2,048 steps in 256 channels filtered directly took 0.151, 0.244, 1.766 and 6.446 ms at 16, 64,
256 and 512 taps, by FFT 1.79-1.85 ms at each (docs/reference/measurements.md#long-window-convolution): even at 256
taps, faster from 512; at 2,048 taps in a whole program the FFT took 0.7% of the direct convolution's time."""
GROUPED_MAX_FEATURES = 16
"""At most this many input features per group (1: depthwise): each output reads so few values per tap that the
matrix unit has almost nothing to contract, and the taps run as multiply-adds on the vector units."""
LONG_WINDOW_MIN_STAKE_PERCENT = 5.0


def _long_grouped_window(graph: Graph, site: Site) -> tuple[int, int, int] | None:
    """A convolution that slides a window of at least LONG_WINDOW_MIN_TAPS taps, each output reading at most
    GROUPED_MAX_FEATURES input features per tap: (taps, input features per group, output channels); else None."""
    ins = site.instruction
    if ins.opcode != "convolution" or ins.conv_is_matrix_product or len(ins.conv_kernel_dims) < 2:
        return None
    kernel = graph.operand(site, 1)
    if kernel is None or max(ins.conv_kernel_dims) >= len(kernel.instruction.dims):
        return None
    dims = kernel.instruction.dims
    per_group = dims[ins.conv_kernel_dims[0]]
    window = tuple(dims[d] for d in ins.conv_kernel_dims[1:])
    if len(ins.conv_output_spatial) == len(window) and all(
            slides < size for slides, size in zip(ins.conv_output_spatial, window)):
        # The window spans the input and slides over a few positions: the gradient of a small kernel (XLA writes
        # dL/dw of a 3x3 convolution as the activations convolved with the output's gradient, whose spatial extent
        # is the window, into a 3x3 result), not a long filter the program applies.
        return None
    taps = elements(window)
    channels = elements(tuple(n for d, n in enumerate(dims) if d not in ins.conv_kernel_dims))
    if taps < LONG_WINDOW_MIN_TAPS or per_group > GROUPED_MAX_FEATURES or channels <= per_group:
        return None
    return taps, per_group, channels


@idiom("long_window_convolution", "op_identity",
       "A grouped convolution slides a long window: every tap a multiply-add per output",
       "convolve by FFT at {line}: with n the signal's length and L >= n + {taps} - 1 (a power of two), y = "
       "jnp.fft.irfft(jnp.fft.rfft(x, n=L, axis=-1) * jnp.fft.rfft(h, n=L, axis=-1), n=L, axis=-1)[..., :n] along "
       "the time axis, h each channel's filter (jax.lax.conv_general_dilated correlates: h is its kernel reversed "
       "along the window), instead of the convolution with feature_group_count",
       "a grouped (depthwise) convolution with a window of k taps does channels × length × k multiply-adds, each "
       "output reading only a few input features per tap, which the matrix unit cannot batch into a matmul; by FFT "
       "each channel's filter is two real FFTs, a product and an inverse, O(n log n) instead of O(n·k). The premise "
       "is a long window: on a TPU v5e the FFT took 0.7% of the direct convolution's time at 2,048 taps and 28% at "
       "512; at 256 taps the two were even, and the direct convolution was 7-12× faster at 16 and 64",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#long-window-convolution",
       alternatives=("jax.scipy.signal.fftconvolve(x, h, mode=\"full\", axes=(-1,))[..., :n] at the same line (on a "
                     "TPU v5e 94% shorter where the rfft product was 99%: it pads to n + k - 1, no power of two)",))
def long_window_convolution(program: Program) -> list[Match]:
    """Convolutions whose windows are long and whose groups are narrow (depthwise), summed per program."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        found = [(site, shape) for site in graph.sites() if (shape := _long_grouped_window(graph, site)) is not None]
        if not found:
            continue
        ops, stake = timed_stake(program, graph, [site for site, _ in found])
        if stake < LONG_WINDOW_MIN_STAKE_PERCENT:
            continue
        example, (taps, per_group, channels) = max(found, key=lambda f: program.op_ms.get(
            (module_key, graph.timed_op(f[0])), 0.0))
        macs = elements(example.instruction.dims) * per_group * taps
        line, function = _busiest_line(program, graph, module_key, [site for site, _ in found])
        if not line:  # XLA:CPU keeps no metadata on the convolution it rewrites: the op reading it names the line
            line, function = _busiest_line(program, graph, module_key, [
                Site(site.computation, user) for site, _ in found
                for user in site.computation.users.get(site.instruction.name, [])])
        out.append(Match(
            "long_window_convolution", stake,
            f"{len(found)} convolution{'s' if len(found) > 1 else ''} with a window of {taps:,} taps over "
            f"{channels:,} channels, {per_group} input feature{'s' if per_group > 1 else ''} per group (such as "
            f"{graph.computes(example).replace('a matmul of', 'a convolution of', 1)}): {macs:.3g} multiply-adds a "
            "run" + (f", at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"taps": taps},
            facts={"taps": taps, "features_per_group": per_group, "channels": channels, "multiply_adds_per_run": macs}))
    return out


SELECTION_KERNEL_MAX_OPS = 64
"""How many ops a walk back from a convolution's kernel follows: an identity of the window's taps broadcast over the
input's features and re-laid out (forward, or reversed for the gradient) is a few dozen."""
PATCHES_MIN_STAKE_PERCENT = 5.0
SPECS = {1: ("NWC", "WIO", "NCW"), 2: ("NHWC", "HWIO", "NCHW"), 3: ("NDHWC", "DHWIO", "NCDHW")}
"""Per window rank: the channels-last input spec, the kernel spec of a (window..., in, out) kernel, the channels-first
input spec."""


def _selection_kernel(graph: Graph, site: Site) -> bool:
    """Whether a convolution's kernel is built inside the program from iotas compared equal and constants alone, from
    no argument: a one-hot kernel that only moves each input element to an output channel (the identity of a window's
    taps that jax.lax.conv_general_dilated_patches convolves with, and its reverse in the gradient)."""
    frontier, seen, compared = [graph.operand(site, 1)], set(), False
    while frontier:
        current = frontier.pop()
        if current is None or len(seen) > SELECTION_KERNEL_MAX_OPS:
            return False
        ins = current.instruction
        if (current.computation.name, ins.name) in seen:
            continue
        seen.add((current.computation.name, ins.name))
        if ins.opcode == "parameter":  # a fusion's: its caller's operand; any other: an argument or a loop's state
            caller = graph.callers.get(current.computation.name)
            if caller is None or caller.instruction.opcode != "fusion":
                return False
            frontier.append(graph.operand(caller, ins.parameter_number))
        elif ins.opcode == "fusion":
            frontier.append(graph.producer(current))
        elif ins.opcode not in ("iota", "constant"):
            operands = [graph.operand(current, k) for k in range(len(ins.operands))]
            compared = compared or ins.opcode == "compare" and ins.comparison == "EQ" and any(
                (origin := graph.origin(o)) is not None and origin.instruction.opcode == "iota" for o in operands)
            frontier.extend(operands)
    return compared


def _sliding(site: Site) -> bool:
    ins = site.instruction
    return ins.opcode == "convolution" and not ins.conv_is_matrix_product and len(ins.conv_kernel_dims) >= 2


def _patches_shape(graph: Graph, site: Site) -> dict | None:
    """The window, input features and layout of a convolution that makes patches: its output features are its
    input's times the window's taps (each output channel one tap of one input feature); None otherwise."""
    kernel, lhs = graph.operand(site, 1), graph.operand(site, 0)
    if kernel is None or lhs is None:
        return None
    dims, kernel_dims = kernel.instruction.dims, site.instruction.conv_kernel_dims
    if max(kernel_dims) >= len(dims):
        return None
    window = tuple(dims[d] for d in kernel_dims[1:])
    taps = elements(window)
    outputs = elements(tuple(n for d, n in enumerate(dims) if d not in kernel_dims))
    features = outputs // taps if taps > 1 and outputs % taps == 0 else 0
    inputs, made = lhs.instruction.dims, site.instruction.dims
    if not features or dims[kernel_dims[0]] not in (1, features) or len(inputs) != len(made):
        return None
    position = next((k for k in range(len(made)) if made[k] == outputs and inputs[k] == features), None)
    if position is None or position not in (1, len(made) - 1):
        return None
    spatial = [(a, b) for k, (a, b) in enumerate(zip(inputs, made)) if k not in (0, position)]
    if len(spatial) != len(window) or len(window) not in SPECS:
        return None
    padding = ('"SAME"' if all(a == b for a, b in spatial) else
               '"VALID"' if all(b == a - k + 1 for (a, b), k in zip(spatial, window)) else "")
    return {"window": window, "features": features, "channels_last": position == len(made) - 1,
            "padding": padding, "patches": made}


@idiom("convolution_as_patches_matmul", "op_identity",
       "A convolution is written as image patches and a matmul with the flattened kernel",
       "convolve with the kernel itself at {line}: {call}, w the kernel as {kernel}, instead of "
       "jax.lax.conv_general_dilated_patches(x, {window}, ...) and a matmul of the patches with the kernel flattened "
       "to ({rows}, {out})",
       "jax.lax.conv_general_dilated_patches is itself a convolution, one group per input feature, with a constant "
       "one-hot kernel: it writes a patch tensor as many times the input's size as the window has taps (XLA:TPU runs it as a dense convolution "
       "against that kernel), the matmul reads it back, and its gradient is another such convolution over a "
       "patch-sized gradient; one convolution with the kernel reads the input once and writes only its output",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#convolution-as-patches-matmul",
       alternatives=("a sum of matmuls of shifted slices of the padded input, one per tap of the window "
                     "(sum(xp[:, i:i + h, j:j + w] @ w[i, j] for i in range(3) for j in range(3)) for a 3 × 3 window, "
                     "xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))): no patch tensor, but every slice copied and "
                     "one narrow matmul per tap (on a TPU v5e 91.5% faster than the patches where one convolution "
                     "was 95.3%)",))
def convolution_as_patches_matmul(program: Program) -> list[Match]:
    """Convolutions with a constant one-hot kernel whose patches a matmul reads, with the gradient's convolutions of
    the same kind, per program: staked by every op on their lines and the matmuls' (the lines the change rewrites)."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        selecting = [site for site in graph.sites() if _sliding(site) and _selection_kernel(graph, site)]
        patches: list[tuple[Site, dict, list[Site]]] = []
        for site in selecting:
            shape = _patches_shape(graph, site)
            if shape is None:
                continue
            made = site  # the op that holds the patches: the conv, or the fusion it is the result of
            while (caller := graph.callers.get(made.computation.name)) is not None and \
                    caller.instruction.opcode == "fusion" and made.instruction.name == made.computation.root:
                made = caller
            readers = [r for r in graph.users(made) if r.instruction.opcode in MATMUL_OPCODES and
                       (r.instruction.opcode == "dot" or r.instruction.conv_is_matrix_product)]
            if readers:
                patches.append((site, shape, readers))
        if not patches:
            continue
        lines = {program.line_of(graph, s) for s, _, readers in patches for s in (s, *readers)} - {("", "")}
        staked = [s for s in graph.sites() if program.line_of(graph, s) in lines] if lines else \
            selecting + [r for _, _, readers in patches for r in readers]
        ops, stake = timed_stake(program, graph, [s for s in staked if (module_key, graph.timed_op(s)) in program.op_ms])
        if stake < PATCHES_MIN_STAKE_PERCENT:
            continue
        site, shape, readers = max(patches, key=lambda p: elements(p[1]["patches"]))
        window, features = shape["window"], shape["features"]
        last = shape["channels_last"]
        channels = readers[0].instruction.dims[-1 if last else 1]
        spec, kernel_spec, first = SPECS[len(window)]
        dn = (spec, kernel_spec, spec) if last else (first, kernel_spec, first)
        strides = "(" + ", ".join("1" for _ in window) + ("," if len(window) == 1 else "") + ")"
        window_text = "(" + ", ".join(map(str, window)) + ("," if len(window) == 1 else "") + ")"
        call = (f"jax.lax.conv_general_dilated(x, w, {strides}, {shape['padding']}, dimension_numbers="
                f"({', '.join(repr(s).replace(chr(39), chr(34)) for s in dn)}))" if shape["padding"] else
                f"jax.lax.conv_general_dilated(x, w, window_strides, padding, dimension_numbers=("
                f"{', '.join(repr(s).replace(chr(39), chr(34)) for s in dn)})) with the patches call's own window "
                "strides and padding")
        line, function = program.line_of(graph, site)
        matmul_line = program.line_of(graph, readers[0])[0]
        backward = len(selecting) - len(patches)
        taps = elements(window)
        out.append(Match(
            "convolution_as_patches_matmul", stake,
            f"{len(patches)} convolution{'s' if len(patches) > 1 else ''} with a constant one-hot kernel (one output "
            f"channel per tap of a {' × '.join(map(str, window))} window and input feature) write{'' if len(patches) > 1 else 's'} image patches, such as "
            f"{graph.operand(site, 0).instruction.shape_text.split('{')[0]} → {site.instruction.shape_text.split('{')[0]}"
            + (f" at {line}" if line else "") + ", read by a matmul with the flattened kernel"
            + (f" at {matmul_line}" if matmul_line and matmul_line != line else "")
            + (f", and {backward} more such convolution{'s' if backward > 1 else ''} in the gradient" if backward > 0
               else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"call": call, "window": window_text, "taps": taps, "rows": taps * features, "out": channels,
                    "kernel": "(" + ", ".join(map(str, (*window, features, channels))) + ")"},
            facts={"patch_convolutions": len(patches), "gradient_convolutions": max(backward, 0),
                   "window": list(window), "features": features, "patches": list(shape["patches"])}))
    return out


SEARCHSORTED_SCAN = "_searchsorted_scan_impl"
"""The function of jnp.searchsorted's default method ("scan"), which its ops' framework paths name: a binary search
as a while loop of dependent gathers."""
COMPARE_ALL_MAX_TABLE = 4096
"""Up to this many sorted entries method="compare_all" (each query compared with every entry, one vectorised pass)
is the change: on the chip it was the fastest method at 255, 1,024 and 4,096 entries (16 features of 16,384 values:
0.153, 0.509 and 1.835 ms, against 21.0-34.2 ms for the default scan and 3.1-3.4 ms for "sort"; in a whole program
at 255 entries 38.3 ms against 372.7); its compares grow with the table, so past the longest measured method="sort"
is named instead (a premise)."""
SEARCHSORTED_MIN_STAKE_PERCENT = 5.0


@idiom("searchsorted_binary_search", "op_identity",
       "jnp.searchsorted's default binary search runs as a loop of dependent gathers",
       "{change}",
       "jnp.searchsorted's default method (\"scan\") is a binary search written as a while loop of log2(n) trips, "
       "each a gather from the sorted table that waits for the previous one; on an accelerator gathers from scattered "
       "addresses are slow and the trips run in series. method=\"compare_all\" compares each query with every entry "
       "in one vectorised op (n compares a query: the premise is a short table); method=\"sort\" co-sorts the "
       "queries with the table",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#searchsorted-binary-search",
       platforms=("TPU", "GPU"),
       variants=(Variant((("short_table", (False,)),),
                         "search with method=\"sort\" at {line}: jnp.searchsorted(table, x, side=..., method="
                         "\"sort\") co-sorts the {queries:,} queries with the {table:,} entries in one sort, instead "
                         "of the default method's {trips} trips of dependent gathers (compare_all would compare each "
                         "query with every entry)"),))
def searchsorted_binary_search(program: Program) -> list[Match]:
    """The while loops jnp.searchsorted's scan method makes, with what their trips gather from, per program."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        loops = [site for site in graph.sites() if site.instruction.opcode == "while"
                 and SEARCHSORTED_SCAN in site.instruction.op_name]
        if not loops:
            continue
        ms, ops = 0.0, []
        for loop in loops:
            loop_ms, loop_ops = _loop_time_ms(program, graph, loop)
            ms, ops = ms + loop_ms, ops + loop_ops
        stake = program.step_percent(ms)
        if stake < SEARCHSORTED_MIN_STAKE_PERCENT:
            continue
        inside = {name for loop in loops for name in loop.instruction.called}
        gathers = [site for site in graph.sites() if site.instruction.opcode == "gather" and (
            site.computation.name in inside or graph.loop_of(site.computation) in [lp.instruction for lp in loops])]
        tables = [graph.origin(graph.operand(site, 0)) or graph.operand(site, 0) for site in gathers]
        table = max((t.instruction.dims[-1] for t in tables if t is not None and t.instruction.dims), default=0)
        queries = max((elements(site.instruction.dims) for site in gathers), default=0)
        trips = max(loop.instruction.trip_count for loop in loops)
        line, function = _busiest_line(program, graph, module_key, loops)
        at = line or "the line that calls it"
        change = (f"search with method=\"compare_all\" at {at}: jnp.searchsorted(table, x, side=..., method="
                  f"\"compare_all\") compares each of the {queries:,} queries with all {table:,} entries of the "
                  "sorted table in one vectorised op, instead of the default method's "
                  f"{trips or 'log2(n)'} trips of dependent gathers (for tables past {COMPARE_ALL_MAX_TABLE:,} "
                  "entries, method=\"sort\")")
        out.append(Match(
            "searchsorted_binary_search", stake,
            f"jnp.searchsorted's default method: {len(loops)} while loop{'s' if len(loops) > 1 else ''} of "
            f"{trips:,} trips, each gathering {queries:,} entries from a sorted table of {table:,}"
            + (f" at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            params={"change": change, "short_table": 0 < table <= COMPARE_ALL_MAX_TABLE, "table": table,
                    "queries": queries, "trips": trips},
            facts={"table_entries": table, "queries": queries, "trips": trips}))
    return out


FFT_MIN_STAKE_PERCENT = 10.0
FFT_MATMUL_MAX_POINTS = 1024
"""Transforms up to this many points are taken as matmuls with tables: on the chip two HIGHEST matmuls took 53-55%
less time than jnp.fft.rfft at 256 and 1,024 points (40,960 frames: 0.913 against 1.960 ms; 3.189 against 7.010),
17% less at 2,048 and 62% more at 4,096, where the table's n² coefficients outgrow the n log n transform; in a whole
program of 1,024-point spectra, 57.4% shorter."""


def _fft_points(graph: Graph, matmuls: list[Site]) -> int:
    """The transform's length from XLA:TPU's lowering: it runs an n-point FFT as stages of square matmuls (f × f
    tables), one per factor of n laid along the input's minor dimensions (1,024 as 128 × 8)."""
    factors = {k.instruction.dims[0] for site in matmuls if (k := graph.operand(site, 1)) is not None
               and len(k.instruction.dims) >= 2 and k.instruction.dims[0] == k.instruction.dims[1]}
    points = 0
    for site in matmuls:
        lhs = graph.operand(site, 0)
        dims = lhs.instruction.dims if lhs is not None else ()
        minor = [d for d in dims[-2:] if d in factors] if len(dims) >= 3 else list(dims[-1:])
        points = max(points, elements(tuple(minor)) if minor else 0)
    return points


@idiom("fft_lowered_to_matmuls", "op_identity",
       "An FFT runs as XLA:TPU's chain of small HIGHEST-precision matmuls and relayouts",
       "take the spectrum at {line} as two matmuls with cosine and sine tables of its {points:,} points, made once "
       "with NumPy: n = {points}; k = np.arange(n)[:, None] * np.arange(n // 2 + 1)[None, :] % n; cos_t = "
       "np.cos(2 * np.pi * k / n).astype(np.float32); sin_t = -np.sin(2 * np.pi * k / n).astype(np.float32); re = "
       "jnp.matmul(x, cos_t, precision=jax.lax.Precision.HIGHEST); im = jnp.matmul(x, sin_t, "
       "precision=jax.lax.Precision.HIGHEST) "
       "(the real and imaginary parts of jnp.fft.rfft(x, axis=-1)), instead of the jnp.fft call",
       "XLA:TPU lowers a transform into stages of small matmuls (a few to 128 wide) at precision HIGHEST with "
       "relayout copies between them; one dense matmul with a table of n × (n/2 + 1) coefficients does more "
       "multiply-adds but runs as one wide pass. The premise is a short transform of real input: on a TPU v5e a step "
       "of 1,024-point spectra took 57.4% less time with two matmuls, and jnp.fft.rfft in place of fft saved nothing; "
       "the table's n² outgrows an n log n transform for long ones",
       gain=(0.8, 0.9), measured="docs/reference/measurements.md#fft-lowered-to-matmuls",
       alternatives=("the same matmuls at the default precision (drop precision=HIGHEST) where the spectrum "
                     "tolerates bfloat16 rounding of the input: one pass instead of six (not timed)",),
       platforms=("TPU",))
def fft_lowered_to_matmuls(program: Program) -> list[Match]:
    """The timed ops of jnp.fft's lowering (matmuls and the copies between them), per program."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        sites = [site for site in graph.sites() if FFT_LOWERING.search(site.instruction.op_name or "")]
        matmuls = [site for site in sites if site.instruction.opcode in ("dot", "convolution")]
        if not matmuls:
            continue
        ops, stake = timed_stake(program, graph, sites)
        if stake < FFT_MIN_STAKE_PERCENT:
            continue
        points = _fft_points(graph, matmuls)
        if not 0 < points <= FFT_MATMUL_MAX_POINTS:
            continue
        matmul_ops = {graph.timed_op(site) for site in matmuls}
        example = max(matmuls, key=lambda s: program.op_ms.get((module_key, graph.timed_op(s)), 0.0))
        line, function = _busiest_line(program, graph, module_key, sites)
        out.append(Match(
            "fft_lowered_to_matmuls", stake,
            f"a {points:,}-point FFT lowered to {len(matmul_ops)} matmul ops (such as {graph.computes(example)}) and "
            f"{len(ops) - len(matmul_ops)} other ops, copies between its stages among them"
            + (f", at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function, params={"points": points},
            facts={"points": points, "matmul_ops": len(matmul_ops), "other_ops": len(ops) - len(matmul_ops)}))
    return out
