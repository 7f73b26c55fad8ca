"""Idioms of several patterns, each read from the HLO's opcodes, shapes and dtypes and the ops' measured times:

- contraction_as_multiply_reduce (work_not_needed): a batched contraction written as a broadcast multiply and a sum,
  (x[..., :, :, None] * y[..., None, :, :]).sum(-2), built element by element on the vector units where one batched
  matmul runs on the matrix unit (the unbatched case, x[:, None] * y[None], is pairwise_broadcast_reduce's).
- weights_tiled_per_example (work_not_needed): a weight matrix broadcast along the batch (jnp.tile, jnp.repeat,
  jnp.broadcast_to, or jax.vmap over copies of it) into a batched matmul, so each example reads its own copy of the
  weights, where one matmul over the unbatched weights reads them once.
- integer_matmul (op_identity): a matmul of 32- or 64-bit integers, which the matrix units (bfloat16, int8) do not
  take: it runs on the vector units, where the same counts in floating point run on the matrix unit.
- large_constant_in_program (memory_numerics): an array a jitted function closes over, baked into the compiled
  program as a constant: every compile embeds (and may constant-fold) it and every program keeps its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdiag.idioms.catalogue import Match, idiom
from xdiag.idioms.hlo_graph import DEPTH, Graph, Site, elements, nbytes
from xdiag.idioms.program import Program
from xdiag.idioms.work_not_needed import _needed_percent, _reducer, _timed_stake

MIN_STAKE_PERCENT = 1.0
"""A match staking less of the step than this is noise."""


def _itemsize(ins) -> float:
    return nbytes(ins) / max(elements(ins.dims), 1)


@idiom("contraction_as_multiply_reduce", "work_not_needed",
       "A batched matmul is written as a broadcast multiply and a sum",
       "contract at {line} with one batched matmul: jnp.einsum('bnk,bkm->bnm', x, y) (or jnp.matmul(x, y)) instead "
       "of (x[..., :, :, None] * y[..., None, :, :]).sum(-2), so the {built} products are never formed and the "
       "work runs on the matrix unit",
       "the broadcast multiply makes B·N·K·M elementwise products on the vector units before the sum over K keeps "
       "B·N·M of them; a batched matmul computes the same sums on the matrix unit reading B·N·K + B·K·M and writing "
       "B·N·M elements",
       gain=(0.6, 1.0))
def contraction_as_multiply_reduce(program: Program) -> list[Match]:
    """A sum over K of the products of a (B, N, K) and a (B, K, M) array broadcast against each other to B×N×K×M
    (in any order of dimensions): the counts say which, B ≥ 2 (with B = 1 it is pairwise_broadcast_reduce's)."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "reduce" or len(ins.operands) != 2 or _reducer(graph, ins) != "add":
                continue
            product = graph.origin(graph.operand(site, 0))
            if product is None or product.instruction.opcode != "multiply" or \
                    len(product.instruction.operands) != 2:
                continue
            made = elements(product.instruction.dims)
            reduced = elements(tuple(product.instruction.dims[d] for d in ins.dimensions
                                     if d < len(product.instruction.dims)))
            left, right = (graph.origin(graph.operand(product, k)) for k in (0, 1))
            if left is None or right is None or reduced < 2:
                continue
            a, b = elements(left.instruction.dims), elements(right.instruction.dims)
            # a = B·N·K and b = B·K·M, both broadcast up to made = B·N·K·M: a·b = made·K·B
            if not (a < made and b < made) or (a * b) % (made * reduced):
                continue
            batch = a * b // (made * reduced)
            if batch < 2 or a % (batch * reduced) or b % (batch * reduced):
                continue
            n, m = a // (batch * reduced), b // (batch * reduced)
            if n < 2 or m < 2 or batch * n * m < 4096:
                continue
            line, function = program.line_of(graph, product)
            ops, stake = _timed_stake(program, graph, [site, product])
            if not ops or stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            needed_elements = a + b + batch * n * m
            built = f"{product.instruction.dtype}[{batch},{n},{reduced},{m}]"
            out[(module_key, line or ops[0])] = Match(
                "contraction_as_multiply_reduce", stake,
                f"a product of two arrays broadcast against each other, ({batch}, {n}, {reduced}) and ({batch}, "
                f"{reduced}, {m}), to {made:,} elements ({built}), then summed over the {reduced} → "
                f"{ins.shape_text.split('{')[0]}: a batched matmul of {batch} × ({n}×{reduced}) · ({reduced}×{m}) "
                f"computed elementwise, {made / needed_elements:.3g}× the {needed_elements:,} elements a matmul "
                "reads and writes" + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                needed_percent=_needed_percent(program, graph, ops[0], flops=2.0 * made,
                                               hbm_bytes=needed_elements * _itemsize(product.instruction)),
                work_ratio=round(made / needed_elements, 1), params={"built": built},
                facts={"batch": batch, "broadcast_elements": made, "matmul_elements": needed_elements})
    return list(out.values())


def _broadcast_into(graph: Graph, site: Site | None, depth: int = DEPTH) -> Site | None:
    """The broadcast a matmul operand is made by, through fusion boundaries and ops that only re-shape or re-type
    it (a tile is a broadcast and a reshape); None where it is made otherwise."""
    while site is not None and depth > 0:
        depth -= 1
        if site.instruction.opcode == "broadcast":
            return site
        site = graph.producer(site)
    return None


@dataclass(frozen=True)
class BroadcastOperand:
    """A batched dot one of whose operands is a broadcast of a smaller array (the other is not): the dot, the
    operand's position, the operand, the broadcast, the array broadcast, the dot's batch size and the copies made."""

    dot: Site
    position: int
    operand: Site
    broadcast: Site
    source: Site
    batch: int
    copies: int


def _broadcast_operands(graph: Graph):
    """Every batched dot's operand made by broadcasting a smaller array whole a number of times."""
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode != "dot" or len(ins.operands) != 2 or not ins.lhs_batch:
            continue
        lhs = graph.operand(site, 0)
        if lhs is None:
            continue
        batch = elements(tuple(lhs.instruction.dims[d] for d in ins.lhs_batch if d < len(lhs.instruction.dims)))
        for position in (0, 1):
            operand = graph.operand(site, position)
            made = _broadcast_into(graph, operand)
            if operand is None or made is None or _broadcast_into(graph, graph.operand(site, 1 - position)):
                continue
            source = graph.operand(made, 0)
            size = elements(source.instruction.dims) if source is not None else 0
            if size and elements(operand.instruction.dims) % size == 0:
                yield BroadcastOperand(site, position, operand, made, source, batch,
                                       elements(operand.instruction.dims) // size)


@idiom("weights_tiled_per_example", "work_not_needed",
       "Weights are copied along the batch so each example reads its own copy",
       "share the weights at {line}: jnp.einsum('{spec}', x, w) with w unbatched (x @ w broadcasts over x's batch "
       "only) instead of tiling w to the batch (jnp.tile, jnp.repeat or jnp.broadcast_to to {tiled}); under "
       "jax.vmap pass the weights with in_axes=None, so one matmul reads {weights} once",
       "a batched matmul reads its weight operand once per batch element: tiled B times, the same weights are read "
       "(and written, where the tile is materialised) B times, where a matmul over the unbatched weights reads them "
       "once and gives the matrix unit one large matmul instead of B small ones",
       gain=(0.5, 0.95),
       alternatives=("where each example does need its own weights (per-example adapters), keep them batched and "
                     "grouped: jax.lax.ragged_dot or a grouped matmul over the distinct copies only",))
def weights_tiled_per_example(program: Program) -> list[Match]:
    """A dot with batch dimensions whose one operand is a broadcast of a smaller array along them (the same
    weights for every batch element), the other a per-example array."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for found in _broadcast_operands(graph):
            site, position, operand, tiled, source, batch = (found.dot, found.position, found.operand,
                                                              found.broadcast, found.source, found.batch)
            ins = site.instruction
            if batch < 2 or found.copies != batch:
                continue  # broadcast along more (or other) than the whole batch: not one copy per example
            weight_bytes = nbytes(source.instruction)
            if weight_bytes < 1 << 16:
                continue  # small weights cost little whatever copies them
            line, function = program.line_of(graph, site)
            ops, stake = _timed_stake(program, graph, [site, tiled])
            if stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            x = graph.operand(site, 1 - position)
            x_bytes = nbytes(x.instruction) if x is not None else 0
            done = x_bytes + weight_bytes * batch + nbytes(ins)
            needed = x_bytes + weight_bytes + nbytes(ins)
            weights = source.instruction.shape_text.split("{")[0]
            spec = "bnk,km->bnm" if position == 1 else "km,bmn->bkn"
            out[(module_key, line or ops[0])] = Match(
                "weights_tiled_per_example", stake,
                f"{ins.opcode} {graph.operand(site, 0).instruction.shape_text.split('{')[0]} × "
                f"{graph.operand(site, 1).instruction.shape_text.split('{')[0]} with {len(ins.lhs_batch)} batch "
                f"dimension(s) of {batch}, whose {'rhs' if position else 'lhs'} is {weights} "
                f"({weight_bytes / 2**20:.3g} MiB) broadcast {batch} times along the batch: the same weights "
                f"read once per example, {done / needed:.3g}× the bytes the matmul needs"
                + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                needed_percent=_needed_percent(program, graph, ops[0], flops=0.0, hbm_bytes=needed),
                work_ratio=round(done / needed, 1),
                params={"spec": spec, "weights": weights, "batch": batch,
                        "tiled": operand.instruction.shape_text.split("{")[0]},
                facts={"batch": batch, "weight_bytes": weight_bytes, "tiled_bytes": weight_bytes * batch})
    return list(out.values())


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
       gain=(0.5, 0.9))
def integer_matmul(program: Program) -> list[Match]:
    """Dots whose operands are 16-, 32- or 64-bit integers (not int8, which TPU and GPU matrix units take)."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "dot" or len(ins.operands) != 2:
                continue
            operands = [graph.operand(site, k) for k in (0, 1)]
            if any(o is None or o.instruction.dtype not in INTEGER_TYPES for o in operands):
                continue
            lhs, rhs = (o.instruction for o in operands)
            contracted = elements(tuple(lhs.dims[d] for d in ins.lhs_contracting if d < len(lhs.dims)))
            flops = 2.0 * elements(ins.dims) * contracted
            line, function = program.line_of(graph, site)
            ops, stake = _timed_stake(program, graph, [site])
            if not ops or stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            out[(module_key, line or ops[0])] = Match(
                "integer_matmul", stake,
                f"dot {lhs.shape_text.split('{')[0]} × {rhs.shape_text.split('{')[0]} → "
                f"{ins.shape_text.split('{')[0]} ({flops / 1e9:.3g} GFLOP a run) multiplies {lhs.dtype} integers"
                + (f" at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                params={"dtype": lhs.dtype, "dtype_name": f"jnp.{_NUMPY_NAMES.get(ins.dtype, 'int32')}"},
                facts={"dtype": lhs.dtype, "flops_per_run": flops,
                       "runs": program.runs.get((module_key, ops[0]), 0)})
    return list(out.values())


_NUMPY_NAMES = {"s16": "int16", "u16": "uint16", "s32": "int32", "u32": "uint32", "s64": "int64", "u64": "uint64"}

LARGE_CONSTANT_BYTES = 1 << 20
"""A constant this large is an array the program closed over, not a literal XLA made: below it, embedding is cheap."""


@idiom("large_constant_in_program", "memory_numerics",
       "An array the jitted function closes over is baked into the program as a constant",
       "pass {constants} to the jitted function as an argument at {line} (jax.jit(f)(x, table) with "
       "def f(x, table), instead of f closing over a global or captured array), so the compiled program reads it "
       "from the device instead of holding a {mib:.3g} MiB copy",
       "an array a jitted function closes over is a compile-time constant: each compile serialises it into the "
       "program (and XLA may constant-fold ops on it, which can take minutes), and every program that holds it keeps "
       "its own copy in the device's memory; an argument costs none of that and the program runs the same",
       gain=(0.5, 1.0),
       alternatives=("where the array is truly fixed and small enough to specialise on (inference with baked-in "
                     "weights), keep it, and cache the compiled program (jax.config.update("
                     "'jax_compilation_cache_dir', ...)) so the compile is paid once",))
def large_constant_in_program(program: Program) -> list[Match]:
    """HLO constants of at least 1 MiB in the programs the steps run. Their cost is at compile time: the stake is
    the share of the steps the capture's compiles take (none in a capture of steady steps, where the match still
    names the constants and their bytes)."""
    out: list[Match] = []
    ran = {module for module, _ in program.op_ms}
    compile_percent = float(program.step.get("compile_percent") or 0.0)
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        if module_key not in ran:
            continue
        constants = [s for s in graph.sites() if s.instruction.opcode == "constant" and
                     nbytes(s.instruction) >= LARGE_CONSTANT_BYTES]
        if not constants:
            continue
        total = sum(nbytes(s.instruction) for s in constants)
        line, function = "", ""
        for constant in constants:
            for user in graph.users(constant):
                line, function = program.line_of(graph, user)
                if line:
                    break
            if line:
                break
        shapes = sorted({s.instruction.shape_text.split("{")[0] for s in constants})
        out.append(Match(
            "large_constant_in_program", round(min(compile_percent, 100.0), 2),
            f"the program {module_key} holds {len(constants)} constant(s) of {total / 2**20:.3g} MiB "
            f"({', '.join(shapes[:4])}) compiled into it" + (f", read at {line}" if line else "")
            + (f"; the capture's compiles take {compile_percent:g}% of the step" if compile_percent else
               "; its cost is at compile time, which this capture does not hold"),
            module=module_key, line=line, function=function,
            params={"constants": "the array" if len(constants) == 1 else f"the {len(constants)} arrays",
                    "mib": total / 2**20},
            facts={"constants": len(constants), "constant_bytes": total, "shapes": shapes[:8],
                   "compile_percent": compile_percent}))
    return out


@idiom("repeated_kv_heads", "work_not_needed",
       "Key and value heads are repeated to the query heads before attention (grouped-query attention)",
       "contract the grouped heads at {line} without repeating them: reshape the queries to (batch, seq, "
       "kv_heads, {repeat}, head_dim) and jnp.einsum('bqgrd,bkgd->bgrqk', q, k) (and 'bgrqk,bkgd->bqgrd' with "
       "the values) instead of jnp.repeat(k, {repeat}, axis=2) before the attention einsum, so each key and value "
       "head is read once for its {repeat} query heads",
       "repeating the key and value heads writes (and the attention matmuls then read) a copy of the keys and "
       "values for every query head of a group; a grouped einsum reads each key and value head once, and the "
       "matmul is the same size",
       gain=(0.4, 0.9),
       alternatives=("jax.nn.dot_product_attention(q, k, v) takes fewer key/value heads than query heads (a "
                     "multiple) without repeating them",))
def repeated_kv_heads(program: Program) -> list[Match]:
    """Batched dots one of whose operands is a broadcast of a smaller array along part of the batch dimensions
    (r copies, 2 ≤ r < the batch): keys or values repeated to the query heads of their group. A broadcast along the
    whole batch is weights_tiled_per_example's."""
    out: dict[str, Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for found in _broadcast_operands(graph):
            repeat, operand, source = found.copies, found.operand, found.source
            if not 2 <= repeat < found.batch or found.batch % repeat or nbytes(operand.instruction) < 1 << 20:
                continue
            ops, _ = _timed_stake(program, graph, [found.dot, found.broadcast])
            line, function = program.line_of(graph, found.broadcast)
            match = out.get(module_key)
            if match is None:
                match = out[module_key] = Match(
                    "repeated_kv_heads", 0.0, "", module=module_key, line=line, function=function,
                    params={"repeat": repeat}, facts={"repeat": repeat, "repeated": [], "copy_bytes": 0})
            fresh = [op for op in ops if op not in match.ops]
            match.ops.extend(fresh)
            match.stake_percent = min(match.stake_percent + program.step_percent(
                program.time_ms(graph.module, fresh)), 100.0)
            match.facts["repeated"].append(
                f"{source.instruction.shape_text.split('{')[0]} → {operand.instruction.shape_text.split('{')[0]}")
            match.facts["copy_bytes"] += nbytes(operand.instruction)
    matches = []
    for match in out.values():
        if match.stake_percent < MIN_STAKE_PERCENT:
            continue
        repeat = match.params["repeat"]
        match.work_ratio = float(repeat)
        match.what = (f"{len(match.facts['repeated'])} operand(s) of batched attention matmuls repeated {repeat} "
                      f"times along a batch dimension ({'; '.join(match.facts['repeated'][:2])}): "
                      f"{match.facts['copy_bytes'] / 2**20:.3g} MiB of copies of key/value heads, each head read "
                      f"{repeat}× where once does" + (f", at {match.line}" if match.line else ""))
        matches.append(match)
    return matches


STACK_READERS = ("while", "dot", "convolution", "dynamic-slice")
"""What reads stacked weights: a scan over the layers (a while loop slicing one per trip), or a batched matmul."""


def _argument(graph: Graph, site: Site | None, entry: str) -> bool:
    """Whether a value is one of the program's arguments: an entry parameter, or an element of a tupled one."""
    if site is None or site.computation.name != entry:
        return False
    if site.instruction.opcode == "get-tuple-element":
        site = graph.operand(site, 0)
    return site is not None and site.instruction.opcode == "parameter"


def _reads_stack(graph: Graph, user: Site) -> bool:
    """A reader of stacked weights, or the tuple of a while loop's state that carries them into the loop."""
    if user.instruction.opcode == "tuple":
        return any(u.opcode == "while" for u in user.computation.users.get(user.instruction.name, []))
    return user.instruction.opcode in STACK_READERS


def _top_level(graph: Graph, site: Site) -> Site:
    """The op of the module's own computations that holds an instruction (the fusion around a fused one)."""
    seen = set()
    while site.computation.name in graph.top_level and site.computation.name not in seen:
        seen.add(site.computation.name)
        caller = graph.callers.get(site.computation.name)
        if caller is None:
            break
        site = caller
    return site


@idiom("params_stacked_each_step", "memory_numerics",
       "The step stacks separate parameter arrays into one on every call",
       "keep the parameters stacked at {line}: build the stacked arrays once, outside the jitted step (params = "
       "jax.tree.map(lambda *ws: jnp.stack(ws), *layers)), pass them and let the optimizer update them stacked, "
       "instead of jnp.stack / jnp.concatenate of the {count} arrays inside the step; flax.linen.scan or "
       "nnx.scan (or a vmap-ed init) makes them stacked from the start",
       "an array stacked inside the jitted step is a new buffer each call: every parameter is copied into it, and "
       "its gradient is sliced back apart, on every step; stacked once, the step reads the parameters in place",
       gain=(0.6, 1.0))
def params_stacked_each_step(program: Program) -> list[Match]:
    """Concatenates (jnp.stack, jnp.concatenate) whose every operand is one of the program's own arguments: arrays
    the caller passes separately and the step joins on every call."""
    out: list[Match] = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        entry = graph.module.entry
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "concatenate" or len(ins.operands) < 2 or nbytes(ins) < 1 << 20:
                continue
            sources = [graph.origin(graph.operand(site, k)) for k in range(len(ins.operands))]
            if not all(_argument(graph, s, entry) for s in sources):
                continue
            if not any(_reads_stack(graph, u) for u in graph.users(_top_level(graph, site))):
                continue  # arrays joined for another use than layers' weights (a batch assembled from parts)
            ops, stake = _timed_stake(program, graph, [site])
            if not ops or stake < MIN_STAKE_PERCENT:
                continue
            line, function = program.line_of(graph, site)
            shapes = sorted({s.instruction.shape_text.split("{")[0] for s in sources})
            out.append(Match(
                "params_stacked_each_step", stake,
                f"concatenate of {len(sources)} of the program's arguments ({', '.join(shapes[:3])}) into "
                f"{ins.shape_text.split('{')[0]} ({nbytes(ins) / 2**20:.3g} MiB) on every call"
                + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function, params={"count": len(sources)},
                facts={"stacked_arrays": len(sources), "stacked_bytes": nbytes(ins),
                       "runs": program.runs.get((module_key, ops[0]), 0)}))
    return out
