"""Idioms of memory, precision and layout: data moved or widened where the result does not need it."""

from __future__ import annotations

import re
from math import prod
from typing import Any

from xdiag.analysis.categories import STRUCTURAL_OPCODES
from xdiag.analysis.executed_ops import ExecutedInstruction, executed_instructions
from xdiag.analysis.recompute import rematerialised_time
from xdiag.analysis.xprof.common import natural_order
from xdiag.cost.hlo import shape_bytes
from xdiag.idioms.catalogue import Match, Variant, idiom
from xdiag.idioms.hlo_graph import DTYPE_BYTES, MATMUL_OPCODES, Graph, Site, elements, nbytes, plain_shape
from xdiag.idioms.op_identity import promoted_matmul
from xdiag.idioms.program import Program, jitted_function
from xdiag.idioms.work_not_needed import loop_invariant_compute, timed_stake
from xdiag.profile.space import HloInstruction

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
        chains = [(output, *_moved_output(graph, output)) for output in graph.outputs()]
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


ARGUMENT_COPIES_MIN_PERCENT = 10.0
"""Copies of arguments that are not donated holding this share of op time are a finding (as the HLO checks' ops)."""


def argument_copies_of(program: Program) -> dict[str, Any] | None:
    """The copies XLA makes of a program's arguments because they are not donated: a `copy` whose operand is an
    entry parameter no output aliases (share_of_op_time_percent, ops, arguments, argument_count, shape, programs),
    at any share; None where none runs. An argument the program updates (a KV cache written with .at[].set) must
    stay intact for the caller, so the program first copies all of it; donated, the update happens in place."""
    session, stats = program.session, program.stats
    total_ps = sum(s.total_ps for s in stats)
    ops, arguments, programs, shape, copied_ps = [], [], [], "", 0
    for s in stats:
        module = session.module(s.module) if s.name.startswith("copy") else None
        found = module.find(s.name) if module is not None else None
        if not found or found[0].name != module.entry or found[1].opcode != "copy" or not found[1].operands:
            continue
        operand = found[0].by_name.get(found[1].operands[0])
        if operand is None or operand.opcode != "parameter" or operand.name in module.donated_parameters:
            continue
        copied_ps += s.total_ps
        ops.append(s.name)
        arguments.append(re.sub(r"\.\d+$", "", operand.name))
        shape = shape or found[1].shape_text.split("{")[0]
        if module.name not in programs:
            programs.append(module.name)
    if not ops or not total_ps:
        return None
    distinct = sorted(set(arguments), key=natural_order)
    return {"share_of_op_time_percent": round(100 * copied_ps / total_ps, 2), "ops": ops[:12],
            "arguments": distinct[:12], "argument_count": len(distinct), "shape": shape, "programs": programs}


@idiom("argument_copies", "memory_numerics",
       "The step copies arguments it could update in place: they are not donated",
       "donate the arguments of {program} that hold {arguments}: their positions in donate_argnums (or their names in "
       "donate_argnames) of the jax.jit that compiles it (nnx.jit(..., donate_argnums=...) in Flax NNX), and use the "
       "arrays it returns in their place (the donated ones are deleted), so XLA updates them in place instead of "
       "copying them first; donate only what the step replaces: an argument the caller still reads after the call "
       "must keep its copy",
       "a jitted function may not write into an argument its caller still holds, so XLA copies each whole array it "
       "updates first, leaving the caller's intact; a donated argument's buffer is the output's, updated in place",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#argument-copies")
def argument_copies(program: Program) -> list[Match]:
    copies = argument_copies_of(program)
    share = (copies or {}).get("share_of_op_time_percent") or 0.0
    if copies is None or share < ARGUMENT_COPIES_MIN_PERCENT:
        return []
    arguments, count = copies["arguments"], copies["argument_count"]
    named = ", ".join(arguments[:4]) + (f" and {count - 4} more" if count > 4 else "")
    module = re.sub(r"\(\d+\)$", "", copies["programs"][0])
    # The stake as the step's other device-time findings count it: the copies' share of op time of the computing share
    stake = share * float(program.step.get("compute_percent") or 0.0) / 100
    return [Match(
        "argument_copies", stake,
        f"{len(copies['ops'])} copies of the program's arguments ({named}; each {copies['shape']}) take {share:g}% of "
        f"op time: no output of {module} aliases these arguments (they are not donated)",
        module=module, ops=copies["ops"],
        params={"program": jitted_function(module), "arguments": ", ".join(arguments)},
        facts={"share_of_op_time_percent": share, "arguments": ", ".join(arguments),
               "argument_count": count, "shape": copies["shape"]})]


LAYOUT_COPIES_MIN_PERCENT = 10.0
"""Ops that only change layout holding this share of op time are a finding (as the other HLO checks' ops)."""


def layout_change(ins: HloInstruction, operand: HloInstruction | None) -> str | None:
    """Why `ins` only moves data into another layout, or None when it does more."""
    if ins.opcode == "transpose":
        return "transpose: same elements, permuted dimensions"
    if ins.opcode == "copy" and operand is not None and operand.dims and prod(operand.dims) == prod(ins.dims):
        if operand.layout and ins.layout and operand.layout != ins.layout:
            return f"copy from layout {{{','.join(map(str, operand.layout))}}} to {{{','.join(map(str, ins.layout))}}}"
        if sorted(operand.dims) == sorted(ins.dims) and operand.dims != ins.dims:
            return "copy into permuted dimensions"
    return None  # a same-layout copy moves data but changes no layout: detect_unfused_reshapes reports it


def _is_convolution(ins: HloInstruction, module) -> bool:
    if ins.opcode == "convolution":
        return True
    if ins.opcode == "custom-call":
        return "conv" in ins.custom_call_target.lower()
    return ins.opcode == "fusion" and "convolution" in module.fused_opcodes.get(ins.name, [])


def _next_to_convolution(e: ExecutedInstruction) -> bool:
    """Whether the op reads a convolution's result or feeds a convolution (through tuple plumbing)."""
    by_name = e.computation.by_name
    near = [by_name[o] for o in e.instruction.operands if o in by_name]
    near += [u for u in e.computation.instructions if e.instruction.name in u.operands]
    for _ in range(2):  # look through get-tuple-element / bitcast between the op and the convolution
        near += [by_name[o] for n in near if n.opcode in ("get-tuple-element", "bitcast") for o in n.operands
                 if o in by_name]
        near += [u for n in near if n.opcode in ("get-tuple-element", "bitcast")
                 for u in e.computation.instructions if n.name in u.operands]
    return any(_is_convolution(n, e.module) for n in near)


def layout_copy(e: ExecutedInstruction, total_ps: int) -> dict | None:
    """The row of an op that only moves data into another layout (why, shapes, bytes moved, next to a convolution),
    or None."""
    ins = e.instruction
    reason = None
    if ins.opcode in ("copy", "transpose"):
        operands = e.operands()
        reason = layout_change(ins, operands[0] if operands else None)
    elif ins.opcode == "fusion":
        fused = [i for i in e.fused() if i.opcode not in STRUCTURAL_OPCODES]
        if fused and all(i.opcode in ("copy", "transpose") for i in fused):
            inner = {i.name: i for i in e.fused()}
            subject = fused[-1]
            reason = layout_change(subject, inner.get(subject.operands[0]) if subject.operands else None)
            reason = f"fusion of only {', '.join(sorted({i.opcode for i in fused}))}: {reason}" if reason else None
    if not reason:
        return None
    operands = e.operands()
    return e.row(
        total_ps, opcode=ins.opcode, why=reason, shape=ins.shape_text, operand_shapes=[o.shape_text for o in operands],
        bytes_moved_per_run=shape_bytes(ins) + sum(shape_bytes(o) for o in operands),
        next_to_convolution=_next_to_convolution(e),
    )


def layout_copy_rows(program: Program) -> list[dict[str, Any]]:
    """Every op that only moves data into another layout, its row as detect_layout_mismatch_copies lists it, the
    busiest first."""
    executed, total_ps = executed_instructions(program.session)
    return sorted(filter(None, (layout_copy(e, total_ps) for e in executed)), key=lambda r: -r["total_ms"])


CONVOLUTION_LAYOUT = ("next_to_convolution", (True,))


@idiom("layout_copies", "memory_numerics",
       "Layout-changing copies and transposes take a large share of op time",
       "keep one layout end to end: write einsum/dot dimension orders so no explicit transpose is needed "
       "(jnp.einsum with the output order you consume), avoid .T/jnp.transpose/swapaxes between matmuls, and let XLA "
       "pick layouts (no manual layout constraints); re-check with detect_layout_mismatch_copies",
       "a copy or transpose that only re-lays an array out reads and writes every element and computes nothing; "
       "where producer and consumer agree on one layout, XLA folds the permutation into the ops and copies nothing",
       gain=None,
       variants=(
           Variant((CONVOLUTION_LAYOUT, ("vendor", ("AMD",)), ("platform", ("GPU",))),
                   "the transposes convert the convolution's operands to and from the layout MIOpen runs in: keep "
                   "activations channels-last (NHWC / NDHWC) end to end (lax.conv_general_dilated with "
                   "dimension_numbers=('NHWC','HWIO','NHWC'), or the channels-last variant of your layer), and check "
                   "XLA's conv layout choice on ROCm (XLA_FLAGS=--xla_gpu_force_conv_nhwc); MIOpen's NHWC kernels "
                   "then read the data as it is; re-check with detect_layout_mismatch_copies"),
           Variant((CONVOLUTION_LAYOUT, ("platform", ("GPU",))),
                   "the transposes convert the convolution's operands to and from the layout cuDNN runs in: keep "
                   "activations channels-last (NHWC) in bf16/fp16 so cuDNN's Tensor Core kernels take them as they "
                   "are (XLA_FLAGS=--xla_gpu_force_conv_nhwc), and let XLA choose conv layouts; re-check with "
                   "detect_layout_mismatch_copies"),
           Variant((CONVOLUTION_LAYOUT, ("platform", ("TPU",))),
                   "the transposes feed or follow a convolution: keep the feature dimension last (NHWC) so XLA:TPU "
                   "maps it onto the MXU without relayout, and batch/feature sizes multiples of 128; re-check with "
                   "detect_layout_mismatch_copies"),
           Variant((CONVOLUTION_LAYOUT,),
                   "the transposes feed or follow a convolution: keep one layout (channels-last) on both sides of it; "
                   "re-check with detect_layout_mismatch_copies"),
           Variant((("framework", ("TensorFlow",)),),
                   "keep one layout end to end: avoid tf.transpose between matmuls (use tf.einsum with the output "
                   "order you consume, or transpose_a/transpose_b in tf.linalg.matmul) and compile with "
                   "jit_compile=True; re-check with detect_layout_mismatch_copies"),
           Variant((("framework", ("PyTorch/XLA",)),),
                   "keep one layout end to end: avoid .permute()/.t()/.contiguous() between matmuls, use torch.einsum "
                   "with the output order you consume; re-check with detect_layout_mismatch_copies"),
       ))
def layout_copies(program: Program) -> list[Match]:
    rows = layout_copy_rows(program)
    share = round(sum(r["share_of_op_time_percent"] for r in rows), 2)
    if not rows or share < LAYOUT_COPIES_MIN_PERCENT:
        return []
    top = rows[0]
    # a copy of an argument that is not donated is that idiom's (its finding names its first ops), not a layout's
    if any(top["op"] in m.ops[:8] for m in argument_copies(program)):
        return []
    compute = float(program.step.get("compute_percent") or 0.0)
    near = bool(top["next_to_convolution"])
    shape = top["shape"].split("{")[0]
    return [Match(
        "layout_copies", share * compute / 100 if compute else share,
        f"ops that only move data into another layout (transposes, layout copies) take {share:g}% of op time; the "
        f"largest moves {shape} ({top['why']})" + (", next to a convolution" if near else ""),
        module=re.sub(r"\(\d+\)$", "", top["module"]), ops=[r["op"] for r in rows[:20]],
        params={"next_to_convolution": near},
        facts={"share_of_op_time_percent": share, "count": len(rows), "top_op": top["op"],
               "top_op_ms": top["total_ms"]})]


RECOMPUTE_MATERIAL_PERCENT = 10.0
"""Share of op time recomputed ops (jax.checkpoint) must take for their cost to count."""
RECOMPUTE_PEAK_MAX_PERCENT = 60.0
"""The peak, as a share of the memory limit, under which the recomputation is not needed to fit (issue 58's Flax LM:
7.7 of 16.9 GB, 46%); above it the saved activations may not fit, and recomputing is the price of fitting."""
RECOMPUTE_SAVED_PEAK_MAX_PERCENT = 90.0
"""Above the peak share, the recomputation is still not needed where the peak plus the recomputed matmul outputs a
dots-saving policy keeps stays under this share of the limit (the 10% left for the allocator's fragmentation and
the buffers a new schedule moves)."""
RECOMPUTE_COMPUTE_MIN_PERCENT = 30.0
"""Under this share of the step computing, op time is not where the step's time goes: no recomputation finding."""


def recompute_not_needed(recomputed_percent: float | None, peak_gib: float | None, limit_gib: float | None,
                         saveable_gib: float | None) -> bool:
    """A material share of op time recomputes values while the peak is well under the memory limit, or while the
    peak plus what a dots-saving policy keeps instead (the recomputed matmuls' outputs, measured in the HLO) stays
    under RECOMPUTE_SAVED_PEAK_MAX_PERCENT of it (remat_linen_lm: 18.4% recomputed, peak 11.2 of 15.7 GiB, 71%, and
    1.5 GiB of recomputed matmul outputs: 81% with them saved)."""
    if not ((recomputed_percent or 0) >= RECOMPUTE_MATERIAL_PERCENT and peak_gib and limit_gib):
        return False
    if 100 * peak_gib / limit_gib < RECOMPUTE_PEAK_MAX_PERCENT:
        return True
    return bool(saveable_gib) and 100 * (peak_gib + saveable_gib) / limit_gib < RECOMPUTE_SAVED_PEAK_MAX_PERCENT


@idiom("needless_remat", "memory_numerics",
       "Recomputation the memory does not need: rematerialised blocks whose saved values would fit under the limit",
       "recompute less: drop the jax.checkpoint / nn.remat (Flax linen) / nnx.remat (Flax NNX) around the blocks "
       "whose activations fit, or give it a policy that saves the matmul outputs: jax.checkpoint(block, "
       "policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable); then check the peak with a new capture",
       "jax.checkpoint re-runs the blocks' forward computations inside the backward pass so that their activations "
       "need not be kept; where the memory has room for them, keeping them removes that recomputation",
       gain=(0.5, 1.0), measured="docs/reference/measurements.md#needless-remat",
       alternatives=("save only the costly values: jax.checkpoint(block, policy=jax.checkpoint_policies."
                     "save_only_these_names(...)) with those values named by jax.ad_checkpoint.checkpoint_name "
                     "(premise: the values worth keeping are named)",))
def needless_remat(program: Program) -> list[Match]:
    # a value recomputed on every trip of a loop because it never changes is the loop's to hoist, remat or not
    invariant = frozenset((m.module, op) for m in loop_invariant_compute(program) for op in m.ops)
    recomputed = rematerialised_time(program.session, program.rows, leave_out=invariant)
    share = recomputed.get("rematerialised_op_percent")
    memory = program.memory
    peak, limit = memory.get("peak_memory_gib"), memory.get("allocator_limit_gib") or memory.get("capacity_gib")
    saved = recomputed.get("rematerialised_saveable_dot_gib")
    compute = float(program.step.get("compute_percent") or 0.0)
    if not recompute_not_needed(share, peak, limit, saved) or compute < RECOMPUTE_COMPUTE_MIN_PERCENT:
        return []
    step_ms = float(program.step.get("step_time_ms_mean") or 0.0)
    per_step = (f", about {step_ms * compute / 100 * share / 100:.3g} ms of each {step_ms:.3g} ms step"
                if step_ms else "")
    return [Match(
        "needless_remat", share * compute / 100,
        f"{share:g}% of op time{per_step} re-runs forward computations inside the backward pass "
        f"({recomputed.get('rematerialised_op_count') or 'the'} ops JAX marks rematted_computation under "
        "jax.checkpoint), "
        f"while the step's peak memory is {peak:g} of {limit:g} GiB ({100 * peak / limit:.0f}%): the activations it "
        "recomputes could be kept instead"
        + (f" (the recomputed matmuls' outputs a dots-saving policy keeps are {saved:g} GiB: "
           f"{100 * (peak + saved) / limit:.0f}% of the limit with them)" if saved else ""),
        facts={"rematerialised_op_percent": share, "peak_memory_gib": peak, "memory_limit_gib": limit,
               "rematerialised_saveable_dot_gib": saved},
        cites=[op.split(" (")[0] for op in recomputed.get("rematerialised_ops") or []])]


LANES = 128
"""A TPU lays an array's minor dimension along 128 lanes: the minor dimension is padded to a multiple of 128. (The
second-minor is padded to the tile's rows too, but to 8, 16 or fewer rows by a tiling XLA picks per array, which the
profile's layouts do not record: only the lanes are judged here.)"""
UNALIGNED_MIN_WASTE = 0.3
"""The share of an op's largest array that must be padding for the padding to be what the op spends its time on."""
UNALIGNED_MIN_STAKE_PERCENT = 10.0
"""The share of the step the padded lanes themselves take (each op's time times its padding share) below which the
padding is not worth a finding: the ops' whole time would count work the real lanes need."""


def padded_lanes(instruction) -> tuple[int, int] | None:
    """(minor dim, padded to the lanes) of an array value by its layout, where the minor dim is really unaligned: not
    a multiple of 128, and not a power of two under 128 (a head or feature size XLA folds into fuller tiles, whose
    padding a TPU measurement found to cost about 1% of an attention step); else None."""
    dims = instruction.dims
    if instruction.dtype in ("tuple", "token") or len(dims) < 2:
        return None
    order = instruction.layout if len(instruction.layout) == len(dims) else tuple(reversed(range(len(dims))))
    minor = dims[order[0]]
    if minor % LANES == 0 or (minor < LANES and minor & (minor - 1) == 0):
        return None
    return minor, -(-minor // LANES) * LANES


def _largest(graph: Graph, site: Site):
    """The largest array value a timed op writes or reads (its output, or an operand), by bytes."""
    values = [site.instruction] + [o.instruction for o in (graph.operand(site, k)
                                                            for k in range(len(site.instruction.operands)))
                                   if o is not None]
    values = [v for v in values if v.dtype not in ("tuple", "token")]
    return max(values, key=nbytes, default=None)


@idiom("unaligned_minor_dims", "memory_numerics",
       "Arrays whose minor dimension is not a multiple of the TPU's 128 lanes run mostly on padding",
       "make {dims} a multiple of 128 at {line} ({example}): round the size the program chooses (a hidden width, a "
       "feature count) to {rounded}, or pad the array there with jnp.pad to {padded} and slice the result once at "
       "the end",
       "a TPU holds an array in tiles of 128 lanes along its minor dimension and pads that dimension to a multiple "
       "of 128: the padded lanes are read, written and multiplied like real ones, so an op whose largest array is "
       "mostly padding does that much more work; that the op's time follows its padding is a premise (an op bound "
       "by its other arrays loses less)",
       gain=(0.3, 0.8), platforms=("TPU",),
       variants=(Variant((("platform", ("TPU",)),),
                         withheld="on a TPU v5e taking the padding out made a program slower: a residual MLP whose 6 "
                                  "layers each took a 129-wide input (a column of ones for the bias), laid out as 256 "
                                  "lanes, trained in 1.73 ms a step as written (1.64 ms in a second capture) and "
                                  "2.24 ms with a 128-wide matmul and the bias added after it "
                                  "(docs/reference/measurements.md#unaligned-minor-dims-on-a-tpu; one program "
                                  "measured), so the padded share of these ops is not time the change is known to "
                                  "save"),))
def unaligned_minor_dims(program: Program) -> list[Match]:
    """Per program, the timed ops whose largest array is at least 30% padding along its layout's minor dim."""
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        # ops whose padding is a short axis of per-element components are that idiom's: its change splits them
        claimed = {op for m in components_as_short_axis(program) if m.module == module_key for op in m.ops}
        ops, real, padded, worst, lines = [], 0.0, 0.0, None, {}
        for site in _timed_sites(program, graph):
            if site.instruction.name in claimed:
                continue
            value = _largest(graph, site)
            lanes = padded_lanes(value) if value is not None else None
            if lanes is None or 1 - lanes[0] / lanes[1] < UNALIGNED_MIN_WASTE:
                continue
            ms = program.op_ms[(module_key, site.instruction.name)]
            ops.append(site.instruction.name)
            real += ms * lanes[0] / lanes[1]
            padded += ms
            if worst is None or ms > worst[0]:
                worst = (ms, value, lanes)
            line = program.line_of(graph, site)
            if line[0]:
                lines[line] = lines.get(line, 0.0) + ms
        stake = program.step_percent(padded)
        if not ops or program.step_percent(padded - real) < UNALIGNED_MIN_STAKE_PERCENT:
            continue
        _, value, (minor, to) = worst
        line, function = max(lines, key=lines.get) if lines else ("", "")
        shape = value.shape_text.split("{")[0]
        rounded = " or ".join(str(n) for n in dict.fromkeys((minor // LANES * LANES, to)) if n)
        out.append(Match(
            "unaligned_minor_dims", stake,
            f"{len(ops)} ops' largest arrays are mostly padding in the TPU's 128 lanes (such as {shape}, whose minor "
            f"dimension of {minor} is laid out as {to}: {100 * (1 - minor / to):.0f}% padding)"
            + (f", most of their time at {line}" if line else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops[:16], line=line, function=function,
            needed_percent=program.step_percent(real), work_ratio=round(padded / real, 2) if real else None,
            params={"dims": f"the dimension of {minor}", "example": shape, "rounded": rounded, "padded": str(to)},
            facts={"minor_dim": minor, "padded_to": to, "ops_with_padding": len(ops)}))
    return out


def _timed_sites(program: Program, graph: Graph) -> list[Site]:
    """The instructions the profile times (a fusion, not what it fuses) that ran in the capture."""
    module_key = program.module_key(graph.module)
    return [Site(c, i) for c in graph.module.computations.values() for i in c.instructions
            if graph.timed_op(Site(c, i)) == i.name and program.op_ms.get((module_key, i.name), 0.0) > 0]


COMPONENTS_MAX = 8
"""An axis this short holds each element's components (a position's x, y, z; a quaternion's 4; a colour's 3)."""
COMPONENT_ELEMENTS_MIN = 1 << 16
"""Elements along the array's other axes for it to be a population of small vectors, not a small matrix."""
COMPONENTS_MIN_STAKE_PERCENT = 10.0
COMPONENT_TAKES_MIN = 2
"""Slices of single components the ops must hold: the program computes component by component on the axis."""


def component_axis(instruction: HloInstruction) -> tuple[int, int, str, int] | None:
    """(axis, its size, the tile dimension it lies in, what that dimension pads it to) of an array value whose short
    axis of components lies in one of a TPU tile's two dimensions by the value's layout: the minor one (128 lanes)
    or the second-minor one (8 rows of 32-bit values, 16 of 16-bit), where it is padded; None otherwise."""
    dims = instruction.dims
    if instruction.dtype in ("tuple", "token") or len(dims) < 2:
        return None
    order = instruction.layout if len(instruction.layout) == len(dims) else tuple(reversed(range(len(dims))))
    rows = 8 * max(4 // DTYPE_BYTES.get(instruction.dtype, 4), 1)
    for axis, tile, padded_to in ((order[0], "lanes", LANES), (order[1], "rows", rows)):
        size = dims[axis]
        if 2 <= size <= COMPONENTS_MAX and size % padded_to and elements(dims) // size >= COMPONENT_ELEMENTS_MIN:
            return axis, size, tile, padded_to
    return None


def _held_values(graph: Graph, site: Site) -> list[Site]:
    """A timed op, its operands and every instruction its fusion holds (nested fusions' too)."""
    out = [site] + [o for o in (graph.operand(site, k) for k in range(len(site.instruction.operands))) if o]
    pending = list(site.instruction.called) if site.instruction.opcode == "fusion" else []
    while pending:
        body = graph.module.computations.get(pending.pop())
        for ins in body.instructions if body is not None else []:
            out.append(Site(body, ins))
            if ins.opcode == "fusion":
                pending.extend(ins.called)
    return out


def _component_use(graph: Graph, site: Site) -> str | None:
    """What an instruction does to a short axis of components: 'take' (a slice of one component), 'stack' (a pad
    or concatenate that builds the axis from single components), 'reduce' (a reduction over it); else None."""
    ins = site.instruction
    operand = graph.operand(site, 0)
    if operand is None:
        return None
    if ins.opcode in ("slice", "dynamic-slice"):
        axis = component_axis(operand.instruction)
        return "take" if axis is not None and ins.dims[axis[0]] == 1 else None
    axis = component_axis(ins)
    if ins.opcode in ("pad", "concatenate") and axis is not None and operand.instruction.dims[axis[0]] == 1:
        return "stack"
    source = component_axis(operand.instruction)
    if ins.opcode == "reduce" and source is not None and source[0] in ins.dimensions:
        return "reduce"
    return None


def _carries_components(graph: Graph) -> bool:
    """Whether the program's state holds a short axis of components: an element of a loop's state each trip
    computes anew, or an argument the program returns updated (particles' positions from one step to the next)."""
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode not in ("parameter", "get-tuple-element") or component_axis(ins) is None:
            continue
        if ins.opcode == "parameter" and site.computation.name == graph.module.entry and graph.updated_by_step(ins):
            return True
        state = graph.operand(site, 0) if ins.opcode == "get-tuple-element" else None
        if state is not None and state.instruction.opcode == "parameter" and \
                graph.loop_of(site.computation) is not None and ins.tuple_index in graph.carried(site.computation):
            return True
    return False


COMPONENTS_OTHER_WORK = frozenset({*MATMUL_OPCODES, "custom-call", "sort", "rng-bit-generator", "while",
                                   "triangular-solve", "cholesky"})
"""Ops whose time is their own work (a matmul, a library call, a sort, random bits), not passes over padding."""


@idiom("components_as_short_axis", "memory_numerics",
       "Each element's few components are kept as a short axis of one array, which the TPU's tiles pad",
       "keep each of the {k} components its own 1-D array of {n:,} elements instead of the {shape} arrays read at "
       "{line}: split them once, outside the jitted step (x, y, z = tuple(pos.T) for a (n, 3) pos), carry the {k} "
       "arrays through the step and its loops as a tuple, and write the arithmetic per component: a jnp.take or "
       "[:, i] of one component becomes its array, a jnp.stack of components the tuple, a sum over the axis "
       "a + b + c, and a jnp.cross written out, (ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx); stack "
       "them once at the end where the caller needs the {shape} array",
       "a TPU lays an array in tiles of 8 rows (of 32-bit values) by 128 lanes over its layout's two minor "
       "dimensions: a short axis of components lies in one of them whichever layout XLA picks and is padded to 8 "
       "rows or 128 lanes, and each component sliced out of it is an array of one row or lane padded the same way, "
       "so the slices, the stacks back and every elementwise pass work on mostly padding, where a 1-D array of the "
       "elements fills every tile; transposing the array, components first, changes nothing there: the short axis "
       "is then the rows (on a TPU v5e that layout ran the same step)",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#components-as-short-axis", platforms=("TPU",))
def components_as_short_axis(program: Program) -> list[Match]:
    """Per program whose state (a loop's, or the arguments it updates) holds an array with a short axis of
    per-element components (2 to 8 of them over at least 65,536 elements) in a tile dimension, and that slices
    single components out of such arrays and stacks them back: the timed ops that hold such arrays, but for those
    whose time is other work (a matmul, a library call, a sort, random bits). The stake is those ops' whole time."""
    cache = program.__dict__.setdefault("components_as_short_axis", {})
    if "matches" in cache:  # unaligned_minor_dims asks too: read once
        return cache["matches"]
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        ops, uses, lines, widest = [], {"take": 0, "stack": 0, "reduce": 0}, {}, None
        for site in _timed_sites(program, graph):
            held = _held_values(graph, site)
            if any(v.instruction.opcode in COMPONENTS_OTHER_WORK for v in held):
                continue
            axes = [(v.instruction, component_axis(v.instruction)) for v in held]
            axes = [(ins, axis) for ins, axis in axes if axis is not None]
            if not axes:
                continue
            ops.append(site.instruction.name)
            for value in held:
                use = _component_use(graph, value)
                if use is not None:
                    uses[use] += 1
            ins, axis = max(axes, key=lambda pair: nbytes(pair[0]))
            if widest is None or nbytes(ins) > nbytes(widest[0]):
                widest = (ins, axis)
            line = program.line_of(graph, site)
            if line[0]:
                lines[line] = lines.get(line, 0.0) + program.op_ms[(module_key, site.instruction.name)]
        stake = program.step_percent(program.time_ms(graph.module, ops))
        if uses["take"] < COMPONENT_TAKES_MIN or not uses["stack"] or stake < COMPONENTS_MIN_STAKE_PERCENT or \
                not _carries_components(graph):
            continue
        value, (axis, k, tile, padded_to) = widest
        n = elements(value.dims) // k
        shape = plain_shape(value)
        ranked = sorted(lines, key=lambda lf: -lines[lf])
        line, function = ranked[0] if ranked else ("", "")
        done = [f"{uses[u]} {name if uses[u] > 1 else one}" for u, name, one in (
            ("take", "slices of one component", "slice of one component"),
            ("stack", "stacks of single components back into the axis", "stack of single components into the axis"),
            ("reduce", "reductions over it", "reduction over it")) if uses[u]]
        out.append(Match(
            "components_as_short_axis", stake,
            f"{len(ops)} ops hold {shape} arrays whose axis of {k} (each element's components) lies in the TPU "
            f"tile's {padded_to} {tile} by their layout ({100 * (1 - k / padded_to):.0f}% padding), with "
            f"{', '.join(done)}" + (f", most of their time at {', '.join(lf[0] for lf in ranked[:3])}" if ranked
                                    else "") + f": {stake:g}% of the step",
            module=module_key, ops=ops, line=line, function=function,
            params={"k": k, "n": n, "shape": shape, "padded_to": f"{padded_to} {tile}"},
            facts={"components": k, "elements": n, "tile_dimension": tile, "padded_to": padded_to,
                   "component_takes": uses["take"], "component_stacks": uses["stack"],
                   "component_reductions": uses["reduce"], "ops_on_components": len(ops)}))
    cache["matches"] = out
    return out


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
       gain=(0.4, 0.6), measured="docs/reference/measurements.md#large-constant-in-program",
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


STACKED_MIN_STAKE_PERCENT = 1.0
"""Parameters stacked each step holding less of the step than this are noise."""
STACK_READERS = ("while", "dot", "convolution", "dynamic-slice")
"""What reads stacked weights: a scan over the layers (a while loop slicing one per trip), or a batched matmul."""


def _argument(graph: Graph, site: Site | None, entry: str) -> bool:
    """Whether a value is one of the program's arguments: an entry parameter, or an element of a tupled one."""
    if site is None or site.computation.name != entry:
        return False
    if site.instruction.opcode == "get-tuple-element":
        site = graph.operand(site, 0)
    return site is not None and site.instruction.opcode == "parameter"


def _argument_read(graph: Graph, site: Site | None, entry: str, depth: int = 4) -> str | None:
    """The program's argument a value is, where it is one: through fusion boundaries and re-typing ops, and through
    the asynchronous slices XLA:TPU reads an argument in and the ConcatBitcast that joins them back."""
    site = graph.origin(site)
    if site is None or depth <= 0:
        return None
    ins = site.instruction
    if ins.opcode == "custom-call" and ins.custom_call_target == "ConcatBitcast" and ins.operands:
        parts = {_argument_read(graph, graph.operand(site, k), entry, depth - 1) for k in range(len(ins.operands))}
        return parts.pop() if len(parts) == 1 else None
    if ins.opcode in ("async-done", "async-start") and ins.operands:
        return _argument_read(graph, graph.operand(site, 0), entry, depth - 1)
    return ins.name if _argument(graph, site, entry) else None


def _stacked_by_updates(graph: Graph) -> list[tuple[list[Site], list[str]]]:
    """XLA:TPU's stack of arguments: no concatenate but a chain of dynamic-update-slices, outside any loop, each
    writing one of the program's arguments into the same buffer: per buffer shape, its updates and the arguments."""
    entry, chains = graph.module.entry, {}
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode != "dynamic-update-slice" or nbytes(ins) < 1 << 20 or graph.loop_of(site.computation):
            continue
        argument = _argument_read(graph, graph.operand(site, 1), entry)
        if argument is not None:
            sites, arguments = chains.setdefault(ins.shape_text.split("{")[0], ([], []))
            sites.append(site)
            arguments.append(argument)
    return [(sites, arguments) for sites, arguments in chains.values() if len(set(arguments)) >= 2]


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
       gain=(0.25, 0.5), measured="docs/reference/measurements.md#params-stacked-each-step")
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
            ops, stake = timed_stake(program, graph, [site])
            if not ops or stake < STACKED_MIN_STAKE_PERCENT:
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
        for sites, arguments in _stacked_by_updates(graph):
            if not any(_reads_stack(graph, u) for site in sites for u in graph.users(_top_level(graph, site))):
                continue
            ops, stake = timed_stake(program, graph, sites)
            if not ops or stake < STACKED_MIN_STAKE_PERCENT:
                continue
            stack = sites[0].instruction
            line, function = next((program.line_of(graph, s) for s in sites if program.line_of(graph, s)[0]),
                                  ("", ""))
            out.append(Match(
                "params_stacked_each_step", stake,
                f"{len(sites)} dynamic-update-slices write {len(set(arguments))} of the program's arguments into "
                f"{stack.shape_text.split('{')[0]} ({nbytes(stack) / 2**20:.3g} MiB) on every call (XLA:TPU's "
                "stack of them)" + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function, params={"count": len(set(arguments))},
                facts={"stacked_arrays": len(set(arguments)), "stacked_bytes": nbytes(stack),
                       "runs": program.runs.get((module_key, ops[0]), 0)}))
    return out


WIDE_OPERAND_MIN_SHARE = 0.5
"""The share of a matmul's HBM bytes one float32 argument must be for its reads to be what the matmul waits on."""
WIDE_OPERAND_MIN_STAKE_PERCENT = 5.0
WIDE_OPERAND_MIN_BYTES = 1 << 20
"""A float32 argument smaller than this costs little to read at twice the width (as promoted_matmul's weights)."""


def _default_precision(ins: HloInstruction) -> bool:
    """A matmul at precision DEFAULT (no operand asks for more): on a TPU one bfloat16 pass of the matrix unit."""
    return not ins.operand_precision or max(ins.operand_precision) == 0


def _pytree_root(names: list[str]) -> str | None:
    """The arguments' common pytree root (params of params['layers'][7]['qkv'] and params['embed']), if they share one."""
    roots = {re.split(r"[\[.]", name, maxsplit=1)[0] for name in names}
    return roots.pop() if len(roots) == 1 and all("[" in name for name in names) else None


def _arguments_text(names: list[str]) -> str:
    root = _pytree_root(names) if len(names) > 1 else None
    if root:  # a model's weights: the change is one cast of the whole tree, not one per array
        more = ", …" if len(names) > 3 else ""
        return f"the float32 weights of {root} ({len(names)} arrays: {', '.join(names[:3])}{more})"
    return " and ".join(names[:4])


def _cast_text(names: list[str]) -> str:
    root = _pytree_root(names) if len(names) > 1 else None
    if root:
        return f"{root} = jax.tree.map(lambda w: w.astype(jnp.bfloat16) if w.dtype == jnp.float32 else w, {root})"
    return f"{names[0]}.astype(jnp.bfloat16)"


def _converted_apart(graph: Graph, site: Site | None, timed: str) -> str | None:
    """The timed op, other than `timed`, that converts the value a matmul reads on its way from an argument (the
    step's own cast of its weights, which XLA did not fuse into the matmul); None where the matmul reads the
    argument itself."""
    for _ in range(16):
        if site is None:
            return None
        if site.instruction.opcode == "convert" and graph.timed_op(site) != timed:
            return graph.timed_op(site)
        site = graph.producer(site)
    return None


@idiom("float32_operand_rounded_by_matmul", "memory_numerics",
       "A matmul bound by reading a large float32 argument, which it rounds to bfloat16 anyway",
       "store {arguments} as bfloat16 where {verb} made, once, outside {function} ({cast} "
       "before the step, not inside it), and multiply in bfloat16 with a float32 result at {line} "
       "(jnp.matmul({example}, other.astype(jnp.bfloat16), preferred_element_type=jnp.float32), other being the "
       "matmul's other operand), so the matmul reads 2 bytes an element instead of 4 and jnp's type promotion does "
       "not turn it back into float32; the product is the same: at precision DEFAULT a TPU's matrix unit rounds "
       "float32 operands to bfloat16 itself. Where {arguments} {hold} only small integers (a 0/1 mask or "
       "adjacency, counts up to 127), int8 storage ({example}.astype(jnp.int8) once, outside; jnp converts it in "
       "the matmul) is a quarter of the bytes: on a TPU v5e it saved more than bfloat16 storage did "
       "(docs/reference/measurements.md#float32-operand-rounded-by-matmul)",
       "the matmul does about as many FLOPs per byte as its operands' bytes allow, under the device's ridge, so its "
       "time is the time to read them; the float32 argument is most of those bytes and the matrix unit uses only "
       "its bfloat16 rounding at precision DEFAULT, so storing that rounding halves the argument's bytes and loses "
       "nothing the product uses",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#float32-operand-rounded-by-matmul",
       platforms=("TPU", "GPU"),
       variants=(Variant((("platform", ("GPU",)),),
                         "if {arguments} {hold} only values bfloat16 represents exactly (a 0/1 mask or adjacency, "
                         "integers up to 256), store {them} as bfloat16 where {verb} made, once, outside {function} "
                         "({cast} before the step), so the matmul at {line} reads 2 bytes an "
                         "element instead of 4; otherwise keep float32: at precision DEFAULT a GPU multiplies "
                         "float32 in TF32, whose 10 bits of mantissa bfloat16's 7 would cut (the gain on a GPU is a "
                         "premise: one TPU program measured it)"),))
def float32_operand_rounded_by_matmul(program: Program) -> list[Match]:
    """Per program, the memory-bound matmuls at precision DEFAULT that read a float32 argument (one the step does
    not update) making at least half their HBM bytes; the stake is their time, the recoverable part their time times
    half that argument's share of their bytes."""
    rows = {(r["module"], r["op"]): r for r in program.rows}
    # bfloat16 activations meeting float32 weights are promoted_matmul's: its change is the one for them
    promoted = {(m.module, op) for m in promoted_matmul(program) for op in m.ops}
    out = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        ops: dict[str, float] = {}  # timed op -> the share of its bytes the float32 arguments are
        read: set[tuple[str, str]] = set()  # (timed op, argument) already counted
        converts: dict[str, str] = {}  # timed op that only converts such an argument to bfloat16 -> the argument
        arguments: dict[str, HloInstruction] = {}
        lines: dict[tuple[str, str], float] = {}
        for site in graph.sites():
            ins = site.instruction
            if not (ins.opcode == "dot" or ins.opcode == "convolution" and ins.conv_is_matrix_product) or \
                    len(ins.operands) < 2 or not _default_precision(ins):
                continue
            timed = graph.timed_op(site)
            row = rows.get((module_key, timed)) or {}
            op_bytes = row.get("hbm_bytes_per_run") or row.get("bytes_per_run") or 0
            if row.get("bound") != "memory" or not op_bytes or (module_key, timed) in promoted:
                continue
            for k in (0, 1):
                origin = graph.origin(graph.operand(site, k))
                argument = origin.instruction if origin is not None else None
                if argument is None or argument.opcode != "parameter" or argument.dtype != "f32" or \
                        origin.computation.name != graph.module.entry or nbytes(argument) < WIDE_OPERAND_MIN_BYTES or \
                        graph.updated_by_step(argument) or (timed, argument.name) in read:
                    continue
                read.add((timed, argument.name))
                apart = _converted_apart(graph, graph.operand(site, k), timed)
                if apart is not None:
                    # The step converts the argument in an op of its own: the matmul reads the bfloat16 copy, and
                    # the convert (a float32 read and a bfloat16 write, every step) is what storing it saves
                    converts.setdefault(apart, argument.op_name or re.sub(r"\.\d+$", "", argument.name))
                    arguments.setdefault(argument.name, argument)
                    break
                # One op may read several such arguments (two matmuls XLA fuses): their shares add up
                ops[timed] = ops.get(timed, 0.0) + nbytes(argument) / op_bytes
                arguments.setdefault(argument.name, argument)
                line = program.line_of(graph, site)
                if line[0]:
                    lines[line] = lines.get(line, 0.0) + program.op_ms.get((module_key, timed), 0.0)
                break
        ops = {op: min(share, 1.0) for op, share in ops.items() if share >= WIDE_OPERAND_MIN_SHARE}
        converted_ms = program.time_ms(graph.module, sorted(converts))
        stake = program.step_percent(program.time_ms(graph.module, list(ops)) + converted_ms)
        if not ops or stake < WIDE_OPERAND_MIN_STAKE_PERCENT:
            continue
        halved = program.step_percent(sum(program.op_ms.get((module_key, op), 0.0) * share / 2
                                          for op, share in ops.items()) + converted_ms)
        # the argument as the user's code names it (its pytree path, which JAX keeps as the parameter's op name)
        names = [argument.op_name or re.sub(r"\.\d+$", "", name) for name, argument in arguments.items()]
        largest = max(arguments.values(), key=nbytes)
        shape = largest.shape_text.split("{")[0]
        line, function = max(lines, key=lines.get) if lines else ("", "")
        several = len(names) > 1
        root = _pytree_root(names) if len(names) > 3 else None  # a model's weights: named by their tree
        largest_name = largest.op_name or re.sub(r"\.\d+$", "", largest.name)
        share = sum(ops.values()) / len(ops)
        out.append(Match(
            "float32_operand_rounded_by_matmul", stake,
            f"{len(ops)} memory-bound matmul{'s' if len(ops) > 1 else ''} at precision DEFAULT read the float32 "
            + (f"arguments of {root}, {len(names)} arrays ({', '.join(names[:3])}, …; the largest {largest_name}, "
               if root else f"argument{'s' if several else ''} {', '.join(names[:4])} (")
            + f"{shape}, {nbytes(largest) / 2**20:,.0f} MiB), "
            f"{100 * share:.0f}% of their HBM bytes" + (f", at {line}" if line else "")
            + (f", and the step converts {', '.join(sorted(set(converts.values()))[:3])} to bfloat16 itself on every "
               f"call, in {len(converts)} op{'s of their' if len(converts) > 1 else ' of its'} own "
               f"({program.step_percent(converted_ms):g}% of the step)" if converts else "")
            + f": {stake:g}% of the step, of which half the argument's bytes"
            + (" and the converts" if converts else "") + f" are {halved:g}%",
            module=module_key, ops=list(ops)[:16], line=line, function=function,
            needed_percent=round(stake - halved, 2),
            params={"arguments": _arguments_text(names), "example": names[0], "cast": _cast_text(names),
                    "verb": "they are" if several
                    else "it is", "hold": "hold" if several else "holds", "them": "them" if several else "it",
                    "function": f"the jitted {function}" if function else "the jitted step"},
            facts={"argument_shape": shape, "argument_mib": round(nbytes(largest) / 2**20, 1),
                   "argument_share_of_bytes": round(share, 3), "matmuls": len(ops), "arguments": len(names),
                   "converts": len(converts)}))
    return out
