"""Idioms of differentiation that computes more than the result needs (the "work the result does not need" pattern):

- full_jacobian_for_products: a whole Jacobian or Hessian built over an identity basis of n tangents (jax.jacfwd,
  jax.jacrev, jax.hessian) and read only by products with vectors, where one Jacobian-vector or Hessian-vector
  product (jax.jvp, jax.vjp) computes the same numbers with one tangent.
- gradient_by_forward_mode: the Jacobian of a scalar function (a gradient) taken by forward mode (jax.jacfwd): one
  tangent per input element, n of them batched, each giving one scalar, where one reverse pass (jax.grad,
  jax.value_and_grad) gives all n with the function's value besides.
- masked_frozen_gradients: weight gradients computed through the backward pass and then multiplied by a scalar the
  program passes per parameter leaf (a 0/1 "trainable" flag) before the update, so the gradients of leaves whose flag
  is 0 are thrown away, where jax.lax.stop_gradient on the frozen part's output never computes them.

- dense_lookup_gradient: a large table (an embedding) differentiated through a lookup of a few of its rows, so
  its gradient is a dense array of the table's shape (zeros with the rows' gradients scatter-added in) and the
  update then reads and writes the whole table, where the gradient of the looked-up rows, added into the donated
  table in place, touches only those rows.
- repeated_call_in_gradient: one function called twice on the same inputs inside what jax.grad differentiates (a
  loss written as two helper terms that each call the encoder): XLA merges the forward, but each call has its own
  backward pass, where calling it once and passing its result to both gives one.

Each reads the HLO's shapes, what feeds what, and the transformation each op's name records (vmap, jvp, transpose).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from xdiag.analysis.source_lines import Frame
from xdiag.idioms.catalogue import Match, Variant, idiom
from xdiag.idioms.hlo_graph import MATMUL_OPCODES, PLUMBING, Graph, Site, elements, nbytes, plain_shape
from xdiag.idioms.op_identity import _adds
from xdiag.idioms.program import Program
from xdiag.idioms.work_not_needed import (MIN_STAKE_PERCENT, _from_iotas_only, _holds_matmul, _matmul_sites,
                                         timed_stake)
from xdiag.profile.space import HloComputation, HloInstruction

MIN_TANGENTS = 32
"""An identity basis of fewer tangents leaves too little batched work to remove."""
BACKWARD = "transpose("
"""What JAX writes into the name of every op of a reverse-mode (vjp) pass: transpose(jvp(...))."""


def _top_level(graph: Graph, site: Site) -> Site | None:
    """The timed op of the computation that is not a fusion's (the entry or a loop body) that runs this instruction."""
    name = graph.timed_op(site)
    for computation in graph.module.computations.values():
        if computation.name in graph.callers and graph.callers[computation.name].instruction.opcode == "fusion":
            continue
        found = computation.by_name.get(name)
        if found is not None:
            return Site(computation, found)
    return None


def _reachable(computation: HloComputation, start: str, forward: bool) -> set[str]:
    """The instructions of one computation that read `start`'s value (forward) or that it is computed from."""
    seen, frontier = set(), [start]
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        if forward:
            frontier.extend(u.name for u in computation.users.get(name, []))
        else:
            ins = computation.by_name.get(name)
            frontier.extend(ins.operands if ins is not None else ())
    return seen


def _identity_bases(graph: Graph) -> Iterable[tuple[Site, int]]:
    """Where a graph builds an identity basis: an equality of iota-made indices, (n, ...) with n the number of
    elements after the first dimension (jnp.eye(n) as jax.jacfwd's and jax.jacrev's tangents, reshaped to the
    argument's shape), and its n."""
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode != "compare" or ins.comparison != "EQ" or len(ins.dims) < 2 or len(ins.operands) != 2:
            continue
        n = ins.dims[0]
        if n < MIN_TANGENTS or elements(ins.dims[1:]) != n:
            continue
        operands = [graph.operand(site, k) for k in (0, 1)]
        if all(o is not None and _from_iotas_only(graph, o) for o in operands):
            yield site, n


def _contracts_with_vectors(computation: HloComputation, matrix: HloInstruction) -> bool:
    """Whether every op that reads the matrix (past ops that only re-shape it) multiplies it by vectors: each reads,
    besides the matrix, only arrays of at most one matrix side's length, at least one of that length, and writes no
    more than that many elements (a matrix-vector product, a quadratic form)."""
    side = max(matrix.dims)
    readers, frontier, seen = [], [matrix.name], set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for user in computation.users.get(name, []):
            if user.opcode in ("reshape", "bitcast", "copy", "transpose"):
                frontier.append(user.name)
            else:
                readers.append((user, name))
    if not readers:
        return False
    for user, name in readers:
        others = [computation.by_name.get(o) for o in user.operands if o != name]
        if user.opcode in ("tuple", "parameter") or any(o is None for o in others) or \
                elements(user.dims) > side or any(elements(o.dims) > side for o in others) or \
                not any(elements(o.dims) in matrix.dims for o in others):
            return False
    return True


@idiom("full_jacobian_for_products", "work_not_needed",
       "A full Jacobian or Hessian is built only to multiply it by vectors",
       "{change}",
       "jax.jacfwd, jax.jacrev and jax.hessian push one tangent per element of an identity basis through the "
       "function (n of them, batched by vmap); a product of the matrix with a vector is the same linear map applied "
       "to one tangent, which jax.jvp or jax.vjp computes for about the cost of one gradient",
       gain=(0.8, 0.95), measured="docs/reference/measurements.md#full-jacobian-for-products",
       variants=(Variant((("order", ("jacobian",)),),
                         "at {line}, take the product of the Jacobian of {function} with the vector directly: "
                         "jax.jvp({function}, (x,), (v,))[1] for J @ v, jax.vjp({function}, x)[1](u)[0] for u @ J, "
                         "instead of building jax.jacfwd/jax.jacrev({function})(x) ({matrix}) and multiplying it; "
                         "the {tangents} tangents of the identity basis become one"),))
def full_jacobian_for_products(program: Program) -> list[Match]:
    """A matrix whose every reader multiplies it by vectors (a matrix-vector product, a quadratic form), computed
    from an identity basis of n tangents with n one of its sides: the ops between the basis and the matrix that carry
    the n tangents are the stake; one Jacobian- or Hessian-vector product needs one tangent of them."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        bases = [(top, n, basis) for basis, n in _identity_bases(graph)
                 if (top := _top_level(graph, basis)) is not None]
        for top, n, basis in bases:
            computation = top.computation
            downstream = _reachable(computation, top.instruction.name, forward=True)
            for name in downstream:
                matrix = computation.by_name[name]
                if len(matrix.dims) != 2 or n not in matrix.dims or min(matrix.dims) < MIN_TANGENTS or \
                        not _contracts_with_vectors(computation, matrix):
                    continue
                batched = [computation.by_name[k] for k in
                           sorted(downstream & _reachable(computation, name, forward=False))]
                sites = [Site(computation, i) for i in batched
                         if n in _all_dims(i) and i.opcode != "get-tuple-element"]
                ops, stake = timed_stake(program, graph, sites)
                if stake < MIN_STAKE_PERCENT:
                    continue
                names = " ".join(i.op_name for i in batched)
                order = "hessian" if "jvp(" in names and BACKWARD in names else "jacobian"
                reader = next(u for u in computation.users.get(name, []) or [matrix])
                line, _ = program.line_of(graph, _inner_site(graph, Site(computation, reader)))
                heaviest = max(sites, key=lambda s: program.time_ms(graph.module, [s.instruction.name]))
                function = _function_of(program, graph, heaviest) or "f"
                built_at, _ = program.line_of(graph, _inner_site(graph, top))
                shape = matrix.shape_text.split("{")[0]
                change = (f"at {line or 'the line that multiplies the matrix'}, take the curvature along the vector "
                          f"as one Hessian-vector product: jnp.vdot(d, jax.jvp(jax.grad({function}), (x,), (d,))[1]) "
                          f"instead of d @ jax.hessian({function})(x) @ d ({shape} built from {n} tangents); for "
                          f"H @ d alone, jax.jvp(jax.grad({function}), (x,), (d,))[1]")
                work_ratio = float(n)  # n tangents pushed through where the product needs one
                match = Match(
                    "full_jacobian_for_products", stake,
                    f"{'a Hessian (forward-over-reverse)' if order == 'hessian' else 'a Jacobian'} {shape} built by "
                    f"{len(ops)} ops batched over an identity basis of {n} tangents "
                    f"({basis.instruction.shape_text.split('{')[0]}, an equality of iotas), read only by products "
                    f"with vectors" + (f" at {line}" if line else "") + (f" (the basis made at {built_at})" if built_at and
                                                               built_at != line else ""),
                    module=module_key, ops=ops, line=line, function=function,
                    needed_percent=round(stake / work_ratio, 2), work_ratio=work_ratio,
                    params={"change": change, "order": order, "function": function, "matrix": shape, "tangents": n},
                    facts={"tangents": n, "matrix": shape, "batched_ops": len(ops)})
                key = (module_key, name)
                if key not in out or out[key].stake_percent < stake:
                    out[key] = match
    # one match per matrix: a basis whose tangents reach several matrices stakes each; the largest stake per line
    best: dict[tuple[str, str], Match] = {}
    for match in out.values():
        key = (match.module, match.line or match.ops[0])
        if key not in best or best[key].stake_percent < match.stake_percent:
            best[key] = match
    return list(best.values())


@idiom("gradient_by_forward_mode", "work_not_needed",
       "A gradient is taken by forward mode, one tangent per input element",
       "{change}",
       "jax.jacfwd pushes one tangent per input element through the function (n of them, batched by vmap); for a "
       "scalar function each tangent yields one number of the gradient, where one reverse pass (jax.grad) yields "
       "all n for about the cost of one more evaluation, and jax.value_and_grad returns the value with it",
       gain=(0.9, 0.97), measured="docs/reference/measurements.md#gradient-by-forward-mode")
def gradient_by_forward_mode(program: Program) -> list[Match]:
    """A vector of n numbers, one per tangent of an identity basis of n (the argument's elements), computed by
    forward-mode (jvp) ops that carry the n tangents: the Jacobian of a scalar function, a gradient. The ops between
    the basis and the vector that carry the n tangents are the stake; one reverse pass needs about two of them."""
    best: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for basis, n in _identity_bases(graph):
            top = _top_level(graph, basis)
            if top is None:
                continue
            computation = top.computation
            downstream = _reachable(computation, top.instruction.name, forward=True)
            for name in downstream:
                gradient = computation.by_name[name]
                if gradient.tuple_shapes or tuple(gradient.dims) != (n,):
                    continue
                batched = [computation.by_name[k] for k in
                           sorted(downstream & _reachable(computation, name, forward=False))]
                sites = [Site(computation, i) for i in batched
                         if n in _all_dims(i) and i.opcode != "get-tuple-element"]
                names = " ".join(i.op_name for i in batched)
                # forward mode only (jax.jacrev of a scalar has no basis of n; a Hessian's output is n x n), and
                # tangents that carry work: some op holds more than one number per tangent
                if "jvp(" not in names or BACKWARD in names or \
                        not any(elements(i.dims) > n for i in batched if not i.tuple_shapes):
                    continue
                ops, stake = timed_stake(program, graph, sites)
                if stake < MIN_STAKE_PERCENT:
                    continue
                line, _ = program.line_of(graph, _inner_site(graph, top))
                heaviest = max(sites, key=lambda s: program.time_ms(graph.module, [s.instruction.name]))
                function = _function_of(program, graph, heaviest) or "f"
                basis_shape = basis.instruction.shape_text.split("{")[0]
                change = (f"at {line or 'the line that calls jax.jacfwd'}, take the gradient of the scalar "
                          f"{function} in one reverse pass: value, grad = jax.value_and_grad({function})(x) instead "
                          f"of jax.jacfwd({function})(x), and use value where {function}(x) is evaluated again; the "
                          f"{n} forward tangents become one backward pass")
                match = Match(
                    "gradient_by_forward_mode", stake,
                    f"a gradient f32[{n}] (one number per tangent) built by {len(ops)} forward-mode ops batched over "
                    f"an identity basis of {n} tangents ({basis_shape}, an equality of iotas)"
                    + (f" at {line}" if line else ""),
                    module=module_key, ops=ops, line=line, function=function,
                    needed_percent=round(2 * stake / n, 2), work_ratio=n / 2,
                    params={"change": change, "function": function, "tangents": n},
                    facts={"tangents": n, "basis": basis_shape, "batched_ops": len(ops)})
                key = (module_key, line or ops[0])
                if key not in best or best[key].stake_percent < stake:
                    best[key] = match
    return list(best.values())


def _all_dims(ins: HloInstruction) -> set[int]:
    return set(ins.dims) | {d for _, dims in ins.tuple_shapes for d in dims}


def _inner_site(graph: Graph, site: Site) -> Site:
    """The fusion's root (its Python line is the user's), else the op itself."""
    ins = site.instruction
    if ins.opcode == "fusion" and ins.called:
        called = graph.module.computations.get(ins.called[0])
        if called is not None and called.root in called.by_name:
            return Site(called, called.by_name[called.root])
    return site


def _function_of(program: Program, graph: Graph, site: Site) -> str:
    """The user's function most of a fusion's instructions were traced from (the differentiated function), or ""."""
    ins = site.instruction
    called = graph.module.computations.get(ins.called[0]) if ins.opcode == "fusion" and ins.called else None
    inner = called.instructions if called is not None else [ins]
    counts: dict[str, int] = {}
    for instruction in inner:
        _, function = program.line_of(graph, Site(called or site.computation, instruction))
        if function:
            counts[function] = counts.get(function, 0) + 1
    return max(counts, key=counts.get) if counts else ""


def _flag(graph: Graph, site: Site | None, depth: int = 4) -> HloInstruction | None:
    """The scalar argument of the program a scalar value is made from, alone or times constants (lr * flag): the
    entry parameter, else None."""
    site = graph.origin(site)
    if site is None or site.instruction.dims or depth <= 0:
        return None
    ins = site.instruction
    entry = graph.module.entry_computation
    if ins.opcode == "parameter" and site.computation is entry and ins.dtype.startswith(("f", "bf")):
        return ins
    if ins.opcode in ("multiply", "divide", "convert"):
        found = [_flag(graph, graph.operand(site, k), depth - 1) for k in range(len(ins.operands))]
        constants = [graph.origin(graph.operand(site, k)) for k in range(len(ins.operands))]
        params = [f for f in found if f is not None]
        rest = [c for f, c in zip(found, constants) if f is None]
        if len(params) == 1 and all(c is not None and c.instruction.opcode == "constant" for c in rest):
            return params[0]
    return None


def _flagged_update(graph: Graph, gradient: Site) -> tuple[HloInstruction, HloInstruction] | None:
    """Where a gradient is multiplied by a scalar argument and the product subtracted from (or added to) an argument
    of the same size (p - lr * flag * g): (the flag's parameter, the updated parameter), else None."""
    for user in graph.users(gradient):
        ins = user.instruction
        if ins.opcode != "multiply" or len(ins.operands) != 2:
            continue
        for k in (0, 1):
            flag = _flag(graph, graph.operand(user, k))
            if flag is None:
                continue
            for update in graph.users(user):
                if update.instruction.opcode not in ("subtract", "add"):
                    continue
                for j in range(2):
                    param = _argument_of(graph, graph.operand(update, j), elements(gradient.instruction.dims))
                    if param is not None:
                        return flag, param
    return None


def _argument_of(graph: Graph, site: Site | None, size: int, depth: int = 6) -> HloInstruction | None:
    """The one argument of the program of `size` elements a value is, or is re-assembled from (XLA:TPU copies a
    large argument in slices and joins them again: async slices into a custom call): its entry parameter, else
    None."""
    entry = graph.module.entry_computation
    frontier, found = [site], set()
    while frontier and depth > 0:
        depth -= 1
        nxt = []
        for current in frontier:
            current = graph.origin(current)
            if current is None:
                continue
            ins = current.instruction
            if ins.opcode == "parameter" and current.computation is entry:
                if elements(ins.dims) == size:
                    found.add(ins.name)
                continue
            if ins.opcode in ("custom-call", "async-done", "async-start", "concatenate", "slice"):
                nxt.extend(graph.operand(current, k) for k in range(len(ins.operands)))
        frontier = nxt
    return entry.by_name[found.pop()] if len(found) == 1 else None


def _label(ins: HloInstruction) -> str:
    return ins.op_name or ins.name


@idiom("masked_frozen_gradients", "work_not_needed",
       "Frozen parameters' gradients are computed, then multiplied by a per-leaf flag",
       "if the flags of {frozen} are 0 (a frozen part), cut that part out of differentiation where its output "
       "enters the trained layers, at {line}: h = jax.lax.stop_gradient(h) on the features the frozen layers "
       "compute, so jax.grad returns zeros for them without their backward pass; the flags can stay for the "
       "trained leaves",
       "JAX differentiates every leaf passed to jax.grad: a 0/1 flag multiplied into the update after the backward "
       "pass zeroes the frozen leaves' gradients only after computing them, and XLA cannot drop work a runtime value "
       "zeroes; stop_gradient (or differentiating only the trained leaves) removes that backward pass from the "
       "program. The premise, which the profile cannot show, is that those flags are 0 on these steps",
       gain=(0.85, 1.0), measured="docs/reference/measurements.md#masked-frozen-gradients",
       alternatives=(
           "differentiate only the trained leaves: jax.grad(lambda trained: loss_fn(dict(params, **trained), x, y))"
           "(trained), with the frozen leaves closed over (the same saving, a larger edit of the step)",
           "where the freeze never changes between steps, pass the flags as Python floats (a static argument of "
           "jax.jit) so XLA can drop the products by zero and the work behind them (one compile per freeze "
           "schedule)"))
def masked_frozen_gradients(program: Program) -> list[Match]:
    """Matmuls of a reverse-mode pass (their ops' names hold transpose()) whose results reach the update only
    multiplied by a scalar argument of the program, one argument per leaf (at least two distinct ones: a shared
    learning rate is not a per-leaf flag). The leaves whose gradient needs no other matmul of the backward pass
    (the layer the loss reads) are taken as the trained part; the stake is every backward op that serves only the other
    leaves' gradients: what stop_gradient on the trained part's input removes if their flags are 0."""
    found = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        flagged: list[tuple[Site, HloInstruction, HloInstruction]] = []
        for site in _matmul_sites(graph):
            if BACKWARD not in site.instruction.op_name:
                continue
            update = _flagged_update(graph, site)
            if update is not None:
                flagged.append((site, *update))
        if len({flag.name for _, flag, _ in flagged}) < 2:
            continue
        entry = graph.module.entry_computation
        backward_of: dict[str, set[str]] = {}
        for site, _, _ in flagged:
            top = _top_level(graph, site)
            if top is None or top.computation is not entry:
                continue
            ancestors = _reachable(entry, top.instruction.name, forward=False)
            backward_of[site.instruction.name] = {a for a in ancestors if a == top.instruction.name or
                                                  BACKWARD in entry.by_name[a].op_name}
        if not backward_of:
            continue
        # the layer the loss reads: its gradient's backward ops hold no matmul but its own
        near = {k for k, ops in backward_of.items()
                if sum(_holds_matmul(graph, entry.by_name[op]) for op in ops) == 1}
        far = [(s, flag, param) for s, flag, param in flagged if s.instruction.name in backward_of and
               s.instruction.name not in near]
        if not near or not far:
            continue
        kept = set().union(*(backward_of[k] for k in near))
        removed = set().union(*(backward_of[s.instruction.name] for s, _, _ in far)) - kept
        ops, stake = timed_stake(program, graph, [Site(entry, entry.by_name[k]) for k in sorted(removed)
                                                  if entry.by_name[k].opcode != "get-tuple-element"])
        if stake < MIN_STAKE_PERCENT:
            continue
        near_site = next(s for s, _, _ in flagged if s.instruction.name in near)
        line, function = program.line_of(graph, near_site)
        frozen = sorted(dict.fromkeys(_label(param) for _, _, param in far))
        flags = sorted(dict.fromkeys(_label(flag) for _, flag, _ in far))
        trained = list(dict.fromkeys(_label(param) for s, _, param in flagged if s.instruction.name in near))
        named = ", ".join(frozen[:3]) + (f" and {len(frozen) - 3} more" if len(frozen) > 3 else "")
        found.append(Match(
            "masked_frozen_gradients", stake,
            f"{len(far)} weight gradients of the backward pass ({named}) reach the update only multiplied by a scalar "
            f"argument each ({', '.join(flags[:3])}{' …' if len(flags) > 3 else ''}: one per leaf, "
            f"{len({f.name for _, f, _ in flagged})} in all), after {len(ops)} backward ops that no gradient of "
            f"{', '.join(trained)} needs" + (f"; the trained layer is read at {line}" if line else ""),
            module=module_key, ops=ops, line=line, function=function,
            params={"frozen": named, "trained": ", ".join(trained)},
            facts={"flagged_gradients": len(flagged), "frozen_candidates": frozen, "flags": flags,
                   "trained": trained}))
    return found


FORWARD = "jvp("
"""What JAX writes into the name of every op it differentiates; the reverse pass's ops hold BACKWARD as well."""
TWIN_SHARE_MIN = 0.8
"""The share of a repeated call's backward matmuls that must match the kept call's, shape for shape: the same
function called on other data (another layer's weights at another line) matches few of them."""
Stack = tuple[tuple[str, int, str], ...]


def _call_pairs(stacks: Iterable[Stack]) -> dict[tuple[tuple[str, str], Stack], set[tuple[str, int, str]]]:
    """(callee's file and function, the frames above its callers) -> the frames that call it: where two stacks of the
    reverse pass differ in one frame only, below which they run the same function (the same function called from two
    places of one caller's code, or from two helpers that one caller calls)."""
    stacks = list(stacks)
    out: dict[tuple[tuple[str, str], Stack], set[tuple[str, int, str]]] = {}
    for i, a in enumerate(stacks):
        for b in stacks[i + 1:]:
            if len(a) != len(b):
                continue
            differ = [k for k in range(len(a)) if a[k] != b[k]]
            if len(differ) != 1 or differ[0] == 0:
                continue
            k = differ[0]
            callee = (a[k - 1][0], a[k - 1][2])
            if (b[k - 1][0], b[k - 1][2]) == callee:
                out.setdefault((callee, a[k + 1:]), set()).update({a[k], b[k]})
    return out


def _matmul_signature(graph: Graph, site: Site) -> tuple:
    """A matmul's or convolution's dimensions, of its result and operands (not their types: XLA:TPU stores one
    call's operand in bfloat16 where it keeps the other's in float32)."""
    operands = [graph.operand(site, k) for k in range(2)]
    return (site.instruction.opcode, site.instruction.dims, *(o.instruction.dims if o is not None else None
                                                              for o in operands))


@idiom("repeated_call_in_gradient", "work_not_needed",
       "A function is called twice on the same inputs inside what is differentiated: its backward pass runs twice",
       "call {callee} once and pass its result to both places that use it: {calls} each call {callee} on the same "
       "arguments; in {outer} (at {outer_line}) compute out = {callee}(...) once, before them, and give out to both "
       "in place of their own call",
       "XLA merges the two calls' identical forward ops into one, but reverse-mode differentiation has already given "
       "each call its own backward pass, and the two passes' matmuls read different cotangents, which no compiler "
       "pass adds together: the backward work is done twice. One call gets one backward pass, its cotangent the sum "
       "of both uses'",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#repeated-call-in-gradient")
def repeated_call_in_gradient(program: Program) -> list[Match]:
    """The reverse pass's matmuls and convolutions traced from one function called at two places (their Python stacks
    differ in the calling frame only), shape for shape the same under both calls, where the forward ops of one call
    are gone: XLA merged them into the other call's, so the calls computed the same values. The stake is the time of
    the reverse-pass ops of the calls whose forward was merged away (one copy of the backward pass)."""
    found = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        traced: list[tuple[Site, Stack, bool]] = []
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode in PLUMBING or FORWARD not in ins.op_name:
                continue
            stack = tuple(graph.module.stack(ins))
            if stack:
                traced.append((site, stack, BACKWARD in ins.op_name))
        backward_stacks = {stack for _, stack, backward in traced if backward}
        for (callee, outer), calls in _call_pairs(backward_stacks).items():
            depth = len(outer)

            def call_of(stack: Stack) -> tuple[str, int, str] | None:
                k = len(stack) - depth - 1
                if k < 1 or stack[k + 1:] != outer or (stack[k - 1][0], stack[k - 1][2]) != callee:
                    return None
                return stack[k] if stack[k] in calls else None
            forward: dict[tuple, int] = {}
            signatures: dict[tuple, list[tuple]] = {}
            heavy: dict[str, set] = {}
            light: dict[str, set] = {}
            for site, stack, backward in traced:
                call = call_of(stack)
                if call is None:
                    continue
                is_matmul = site.instruction.opcode in MATMUL_OPCODES
                if not backward:  # its elementwise ops' linearisation may stay apart; its matmuls are what merge
                    forward[call] = forward.get(call, 0) + is_matmul
                    continue
                if is_matmul:
                    signatures.setdefault(call, []).append(_matmul_signature(graph, site))
                (heavy if is_matmul else light).setdefault(graph.timed_op(site), set()).add(call)
            kept = [c for c in calls if forward.get(c)]
            repeated = [c for c in calls if not forward.get(c) and signatures.get(c)]
            if not kept or not repeated:
                continue
            reference = Counter(signatures.get(kept[0], []))
            if any(sum((Counter(signatures[c]) & reference).values()) < TWIN_SHARE_MIN * len(signatures[c])
                   for c in repeated):
                continue
            ops = [op for op in dict.fromkeys([*heavy, *light])
                   if len(heavy.get(op) or light[op]) == 1 and (heavy.get(op) or light[op]) <= set(repeated)]
            ms = sum(program.op_ms.get((module_key, op), 0.0) for op in ops)
            stake = program.step_percent(ms)
            if stake < MIN_STAKE_PERCENT:
                continue
            matmuls = sum(len(signatures[c]) for c in repeated)
            sites = sorted(calls, key=lambda c: c[1])
            lines = [Frame(file, line, function).short for file, line, function in sites]
            outer_line = Frame(*outer[0]).short if outer else ""
            example = max((site for site, stack, backward in traced if backward and call_of(stack) in repeated
                           and site.instruction.opcode in MATMUL_OPCODES),
                          key=lambda s: program.op_ms.get((module_key, graph.timed_op(s)), 0.0))
            first = next(c for c in repeated)
            found.append(Match(
                "repeated_call_in_gradient", stake,
                f"{callee[1]} is called at {' and '.join(lines)} ({', '.join(f for _, _, f in sites)}) on the same "
                f"inputs: XLA kept one forward pass of it, but its reverse pass runs once per call, {matmuls} "
                f"matmuls and convolutions again with the same shapes (such as {graph.computes(example)}): "
                f"{stake:g}% of the step",
                module=module_key, ops=ops, line=Frame(*first).short, function=first[2],
                needed_percent=None, work_ratio=None,
                params={"callee": callee[1], "calls": " and ".join(f"{f} (at {line})" for (_, _, f), line
                                                                   in zip(sites, lines)),
                        "outer": outer[0][2] if outer else "the caller", "outer_line": outer_line},
                facts={"calls": len(calls), "repeated_matmuls": matmuls, "call_lines": lines}))
    return found


DENSE_GRADIENT_MIN_BYTES = 16 << 20
"""A parameter this large makes a pass over all of it, to update rows a lookup touched, worth its finding."""


def _dense_gradient_update(graph: Graph, scatter: Site) -> tuple[Site, Site, Site] | None:
    """Where a reverse-pass scatter-add writes into a broadcast constant of a large shape (the gradient of a gather:
    zeros of the table's shape, the looked-up rows' gradients added in): (the timed op of the scatter, the timed op
    that reads its result beside an array of the same shape and type, the optimizer's pass, and that array, the
    parameter it updates); else None."""
    ins = scatter.instruction
    if ins.opcode != "scatter" or BACKWARD not in ins.op_name or nbytes(ins) < DENSE_GRADIENT_MIN_BYTES or \
            len(ins.operands) != 3 or not _adds(graph, scatter):
        return None
    base, rows = graph.origin(graph.operand(scatter, 0)), graph.operand(scatter, 2)
    if base is None or base.instruction.opcode != "constant" or base.instruction.dims or rows is None or \
            elements(rows.instruction.dims) >= elements(ins.dims):
        return None
    made = _top_level(graph, scatter)
    if made is None:
        return None
    for user in graph.users(made):
        update = _top_level(graph, user)
        if update is None or update.instruction.name == made.instruction.name or \
                update.instruction.opcode == "scatter" or _holds_matmul(graph, update.instruction):
            continue
        for k in range(len(update.instruction.operands)):
            table = graph.origin(graph.operand(update, k))
            if table is not None and table.instruction.opcode in ("parameter", "get-tuple-element") and \
                    table.instruction.dims == ins.dims and table.instruction.dtype == ins.dtype and \
                    (table.computation.name != graph.module.entry or table.instruction.opcode != "parameter"
                     or graph.updated_by_step(table.instruction)):
                return made, update, table
    return None


@idiom("dense_lookup_gradient", "work_not_needed",
       "A large table looked up by a few rows is differentiated whole: its gradient and its update are dense",
       "differentiate with respect to the looked-up rows, not the table: look them up before the differentiated "
       "function, emb = table[ids] (the lookup at {line}, the table {table}, {shape}), pass emb to it in the "
       "table's place and take the gradient for emb beside the other parameters (jax.value_and_grad(loss, "
       "argnums=(0, 1))(other_params, emb, ...)), then update only those rows in place: table.at[ids].add(-lr * "
       "g_emb), with the table donated to the jitted step (jax.jit(step, donate_argnums=...) naming the argument "
       "that holds it) and the table the step returns used in its place; the dense {shape} gradient and the pass "
       "over the whole table{update_at} are gone",
       "the gradient of a lookup table[ids] with respect to the table is an array of the table's shape: XLA fills "
       "it with zeros and scatter-adds the looked-up rows' gradients into it, and the optimizer's update then reads "
       "the whole table and that gradient and writes a new table, every row through memory for the few the batch "
       "touched; the rows' gradient added into the donated table writes those rows only",
       gain=(0.6, 0.9), measured="docs/reference/measurements.md#dense-lookup-gradient",
       alternatives=("where the table cannot be donated (the caller reads the old one after the step), the same "
                     "row update without donation: XLA then copies the whole table before the scatter on every "
                     "step, which on a TPU v5e kept most of the time (2.6% shorter steps where donated saved 20%)",
                     "with an optimizer that keeps state per parameter (momentum, Adam) the dense update moves "
                     "every row by design; updating only the looked-up rows of the table and of that state (a "
                     "lazy update) changes the arithmetic of the rows not looked up: its premise that the model "
                     "tolerates that"))
def dense_lookup_gradient(program: Program) -> list[Match]:
    """Per program, a reverse-pass scatter-add into a broadcast zero of a large parameter's shape whose result an
    elementwise op reads beside that parameter (the update of the whole table); the stake is that update's time,
    the pass over every row the change removes (the scatter stays: the change adds the same rows into the table)."""
    found = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        seen: set[str] = set()
        for site in graph.sites():
            dense = _dense_gradient_update(graph, site)
            if dense is None or dense[1].instruction.name in seen:
                continue
            made, update, table = dense
            seen.add(update.instruction.name)
            ops, stake = timed_stake(program, graph, [update])
            if stake < MIN_STAKE_PERCENT:
                continue
            scatter = site.instruction
            rows = graph.operand(site, 2).instruction
            line, function = program.line_of(graph, site)
            update_line = program.line_of(graph, update)[0]
            name = table.instruction.op_name or table.instruction.name
            shape = plain_shape(table.instruction)
            scattered = program.step_percent(program.time_ms(graph.module, [graph.timed_op(site)]))
            looked_up = elements(rows.dims) // max(elements(scatter.dims[1:]), 1)
            found.append(Match(
                "dense_lookup_gradient", stake,
                f"the reverse pass scatter-adds {looked_up:,} looked-up rows ({plain_shape(rows)}) into a "
                f"broadcast zero of {shape} ({nbytes(scatter) / 2**20:,.0f} MiB): the gradient of {name} as a "
                f"dense array, {scattered:g}% of the step" + (f", from the lookup at {line}" if line else "")
                + f"; an elementwise pass then reads {name} and that gradient and writes the whole table"
                + (f" at {update_line}" if update_line else "") + f": {stake:g}% of the step",
                module=module_key, ops=ops, line=line, function=function,
                work_ratio=round(elements(scatter.dims) / elements(rows.dims), 1),
                params={"table": name, "shape": shape, "update_at": f" at {update_line}" if update_line else ""},
                facts={"table_shape": shape, "looked_up_rows": looked_up, "dense_gradient_mib":
                       round(nbytes(scatter) / 2**20, 1), "scatter_percent": scattered},
                cites=[graph.timed_op(site)]))
    return found
