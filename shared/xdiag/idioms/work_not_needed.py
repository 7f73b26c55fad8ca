"""Idioms of work the result does not need: each op may run near its roof, but the result needs far less of it.

- structured_matmul: a dense matmul with a matrix built from iotas (a one-hot of indices, a triangle of ones) or one
  constant stands in for a row lookup, a running sum or a sum broadcast: O(n²) work where O(n) does.
- full_sort: an array sorted in full and then cut to its first k elements, where a partial ordering (top-k) does.
- loop_invariant_weights: a loop reads the same weight matrix on every trip to multiply a few rows, where one
  matmul over all rows reads it once.
- discarded_rows: a matmul (and the softmax after it) computes every row of which a gather or slice then keeps a few,
  where selecting the rows first computes only those.
- loop_invariant_compute: a loop body recomputes, on every trip, a value built only from what the loop passes on
  unchanged, where computing it once before the loop does.
- call_invariant_compute: a jitted step computes, on every call, a large part (a tower over a fixed catalogue) from
  arguments it does not update and not from the others its result reads, where computing it once outside does.
- select_computes_both_branches: jnp.where with one scalar flag picks between two costly arrays, so both are computed
  on every step and one thrown away, where jax.lax.cond computes the one picked.
- loop_copies_carried_buffer: a loop updates a buffer it carries in place and also reads the buffer as it was before
  the update, so XLA copies the whole buffer on every trip.
- matmul_chain_order: a product of two large matrices read only by a product with a thin one, (A @ B) @ v, where
  A @ (B @ v) needs far fewer FLOPs.
- diagonal_of_product: a full matrix product of which only the diagonal (or the trace) is read, where an einsum
  computes the diagonal alone.
- pairwise_broadcast_reduce: pairwise distances or similarities built by broadcasting (N, 1, D) against (1, M, D)
  and summing over D, where one (N, D) × (D, M) matmul does.
- forward_computed_twice: the loss computed in one program and its gradient in another, each step, so the forward
  pass runs twice where jax.value_and_grad runs it once.
- softmax_for_argmax: a softmax read only by an argmax or max, where the logits' argmax is the same index.
- contraction_as_multiply_reduce: a batched contraction written as a broadcast multiply and a sum,
  (x[..., :, :, None] * y[..., None, :, :]).sum(-2), built element by element on the vector units where one batched
  matmul runs on the matrix unit (the unbatched case, x[:, None] * y[None], is pairwise_broadcast_reduce's).
- weights_tiled_per_example: a weight matrix broadcast along the batch (jnp.tile, jnp.repeat, jnp.broadcast_to, or
  jax.vmap over copies of it) into a batched matmul, so each example reads its own copy of the weights.
- repeated_kv_heads: key and value heads repeated to the query heads before attention (grouped-query attention),
  where a grouped einsum reads each key and value head once.
- decode_recomputes_prefix: a decoding loop runs the model over every position of the token buffer it carries on
  every trip to use one position, where a key/value cache computes one position per trip.
- rolling_windows_gathered: every overlapping window gathered into a copy (x[:, arange(n)[:, None] + arange(W)])
  and summed over the window, where differences of cumulative sums give the rolling sums in a few passes.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np

from xdiag.analysis.source_lines import Frame, short_path, source_of_stack
from xdiag.cost.hlo import conv_flops
from xdiag.idioms.catalogue import Match, Variant, idiom
from xdiag.idioms.hlo_graph import (DEPTH, DTYPE_BYTES, MATMUL_OPCODES, SHAPE_ONLY, Graph, Site, elements, nbytes,
                                    opcode_name, plain_shape)
from xdiag.idioms.program import Program, calls_per_step_of

MIN_STAKE_PERCENT = 1.0
"""A match staking less of the step than this is noise."""
FFT_LOWERING = re.compile(r"(?:^|/)(?:jit\()?(?:fft|rfft|irfft|ifft|fftn|rfftn|irfftn|ifftn|fft2|rfft2)(?=[)/]|$)")
"""An op's framework path that names jnp.fft's functions or lax's fft primitive: XLA:TPU lowers the transform into
float32 matmuls at precision HIGHEST (with copies between its stages), which the program did not write."""
LOOKUP_CHANGE = {
    "one_hot": "replace the one-hot matmul at {line} with a row lookup: table[ids] (jnp.take(table, ids, axis=0)) "
               "instead of jax.nn.one_hot(ids, {values}) @ table; its gradient is then a scatter-add of {rows} rows "
               "instead of a {values}-wide matmul",
    "triangular": "replace the matmul with a triangular matrix at {line} with a running sum: jnp.cumsum(x, axis="
                  "{axis}) (jax.lax.cumsum(x, axis={axis}, reverse=True) for an upper triangle; subtract x where the "
                  "triangle leaves out its diagonal)",
    "constant": "replace the matmul with a constant matrix at {line} with a sum broadcast back: "
                "jnp.broadcast_to(c * x.sum(axis={axis}, keepdims=True), x.shape) (c the matrix's value)",
}
LOOKUP_WHAT = {
    "one_hot": "a one-hot matrix (an iota compared equal with indices) standing in for a lookup of {rows} rows out "
               "of {values}",
    "triangular": "a triangular matrix of ones (two iotas compared in order) standing in for a running sum over "
                  "{values} positions",
    "constant": "a matrix of one repeated value standing in for a sum over {values} positions broadcast back",
}


def _matmul_sites(graph: Graph):
    for site in graph.sites():
        if site.instruction.opcode in MATMUL_OPCODES and len(site.instruction.operands) >= 2:
            if site.instruction.opcode == "convolution" and not site.instruction.conv_is_matrix_product:
                continue
            yield site


def _contracted(graph: Graph, site: Site, position: int) -> int | None:
    """The size of the dimension the matmul contracts (the one-hot's values, the table's rows), from its dimension
    numbers: a dot's lhs contracting dimension, a convolution's kernel input features; None where neither is read."""
    ins = site.instruction
    if ins.opcode == "convolution" and ins.conv_kernel_dims:
        kernel = graph.operand(site, 1)
        dims = kernel.instruction.dims if kernel is not None else ()
        return dims[ins.conv_kernel_dims[0]] if ins.conv_kernel_dims[0] < len(dims) else None
    if ins.opcode == "dot" and ins.lhs_contracting:
        lhs = graph.operand(site, 0)
        dims = lhs.instruction.dims if lhs is not None else ()
        return dims[ins.lhs_contracting[0]] if ins.lhs_contracting[0] < len(dims) else None
    return None


GATHER_NS_PER_ROW_TPU = 29.26e6 / (2048 * 2048)
"""On a TPU v5e a gather from a table took this long per looked-up element: 29.26 ms for 2,048 × 2,048 token ids
(docs/reference/measurements.md#membership-by-all-pairs). A one-hot matmul that takes less per looked-up row is
faster there than the lookup that would replace it (the same program's 393-row one-hot matmul took 3.31 ms)."""


@idiom("structured_matmul", "work_not_needed",
       "A dense matmul stands in for a lookup, running sum or broadcast",
       "{change}",
       "a matrix built from iotas or one constant holds no information the matmul needs: a lookup, a running sum or a "
       "sum moves each element once, where the matmul multiplies every element by every row of the matrix",
       gain=(0.7, 1.0),
       variants=(Variant((("platform", ("TPU",)), ("kind", ("one_hot",)), ("faster_than_a_gather", (True,))),
                         withheld="on a TPU v5e a gather took about 7 ns per looked-up element (29.26 ms for 4.19 M "
                                  "token ids, docs/reference/measurements.md#membership-by-all-pairs), where this "
                                  "one-hot matmul takes {ns_per_row:.2g} ns per looked-up row: the matrix unit picks "
                                  "rows of a table of {values} faster than a lookup reads them (there a one-hot "
                                  "matmul over 393 rows of 128 took 3.31 ms and the gathers 29.26 and 33.25 ms; one "
                                  "program measured)"),))
def structured_matmul(program: Program) -> list[Match]:
    found: dict[tuple[str, str, str], Match] = {}
    for graph in program.graphs:
        for site in _matmul_sites(graph):
            if FFT_LOWERING.search(site.instruction.op_name or ""):
                continue  # an FFT's stages: their coefficient tables are no matrix the program wrote
            for position in (0, 1):
                operand = graph.operand(site, position)
                kind = graph.mask_kind(operand)
                if kind not in LOOKUP_CHANGE or (kind == "triangular" and program.platform == "TPU"):
                    # On a TPU v5e jnp.cumsum (a reduce-window) took 7% longer than the triangular matmul it would
                    # replace (docs/reference/measurements.md#running-sum-on-a-tpu): no change to offer there.
                    continue
                matrix = graph.origin(operand)
                other = graph.operand(site, 1 - position)
                if matrix is None or other is None:
                    continue
                built = matrix.instruction
                shape = operand.instruction if operand is not None else built
                values = _contracted(graph, site, position) or (max(shape.dims) if shape.dims else 0)
                rows = elements(shape.dims) // max(values, 1)
                if values < 64:  # a small mask costs little whatever it stands for
                    continue
                out = site.instruction
                line, function = program.line_of(graph, site)
                timed = [graph.timed_op(site)]
                builder = graph.timed_op(matrix)
                if builder not in timed and program.time_ms(graph.module, [builder]) > 0:
                    timed.append(builder)  # the fusion that writes the mask out only to feed this matmul
                key = (graph.module.name, kind, line or timed[0])
                match = found.get(key)
                # What the result needs: each output element read once (a row of the table, or of x) and written once.
                needed_bytes = 2 * nbytes(out)
                needed = program.roof_ms(hbm_bytes=needed_bytes * program.runs.get(
                    (program.module_key(graph.module), timed[0]), 1))
                flops = 2.0 * elements(out.dims) * values
                if match is None:
                    match = found[key] = Match(
                        "structured_matmul", 0.0, "", module=program.module_key(graph.module), line=line,
                        function=function,
                        params={"kind": kind, "values": values, "rows": rows,
                                "axis": _axis(other.instruction.dims, values)},
                        facts={"matmul": f"{out.opcode} {shape.shape_text} × {other.instruction.shape_text} → "
                                         f"{out.shape_text}",
                               "flops_per_run": flops, "needed_bytes_per_run": needed_bytes},
                        # multiply-adds per output element, where the lookup or sum needs about one
                        work_ratio=float(values))
                    match.needed_percent = 0.0
                for op in timed:
                    if op not in match.ops:
                        match.ops.append(op)
                        match.stake_percent = min(match.stake_percent + program.step_percent(
                            program.time_ms(graph.module, [op])), 100.0)
                if needed is not None:
                    match.needed_percent = (match.needed_percent or 0.0) + program.step_percent(needed)
    out: list[Match] = []
    for match in found.values():
        kind = match.params["kind"]
        runs = program.runs.get((match.module, match.ops[0]), 0) if match.ops else 0
        if runs and match.params["rows"]:
            ns = 1e6 * program.profiled_step_ms * match.stake_percent / 100 / (runs * match.params["rows"])
            match.params["ns_per_row"] = round(ns, 3)
            match.params["faster_than_a_gather"] = kind == "one_hot" and ns < GATHER_NS_PER_ROW_TPU
            if program.platform == "TPU" and match.params["faster_than_a_gather"]:
                # the lookup the result needs was measured slower there than this matmul: its multiply-adds are
                # no work the report can count against the result's
                match.work_ratio = match.needed_percent = None
        match.what = (f"{match.facts['matmul']} multiplies by " + LOOKUP_WHAT[kind].format(**match.params)
                      + (f" at {match.line}" if match.line else ""))
        match.params["change"] = LOOKUP_CHANGE[kind].format(line=match.line or "the line that builds it",
                                                            **match.params)
        if match.needed_percent is not None and match.needed_percent <= 0:
            match.needed_percent = None
        if match.stake_percent >= MIN_STAKE_PERCENT:
            out.append(match)
    return out


def _axis(dims: tuple[int, ...], values: int) -> int:
    """The axis of the other operand the structured matrix runs along (its dimension of `values` elements)."""
    return next((k for k, d in enumerate(dims) if d == values), 0)


TOP_K = re.compile(r"(?<![a-z_])(approx_)?top_k(?![a-z_])")
QUANTILE = re.compile(r"(?<![a-z_])(percentile|quantile|median|nanpercentile|nanquantile|nanmedian)(?![a-z_])")
"""jnp's quantiles sort the whole array and read one or two positions of it: the positions are not the first k."""


@idiom("full_sort", "work_not_needed",
       "An array is sorted in full to keep its first few elements",
       "{change}",
       "a full sort orders all n elements (n·log n comparisons over several passes); keeping k ≪ n needs one partial "
       "pass",
       gain=(0.5, 0.95),
       alternatives=("where an approximate top-k is acceptable (retrieval, sampling), jax.lax.approx_max_k(x, k, "
                     "recall_target=0.95), which on a TPU runs near the memory roof",),
       # XLA:CPU runs jax.lax.top_k as a sort of the whole row: on a CPU the change would be a sort still
       platforms=("TPU", "GPU"))
def full_sort(program: Program) -> list[Match]:
    out: list[Match] = []
    for graph in program.graphs:
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "sort" or TOP_K.search(ins.op_name or ""):  # top_k lowered to a sort is the change
                continue
            dims = ins.dims or (ins.tuple_shapes[0][1] if ins.tuple_shapes else ())
            axis = ins.dimensions[0] if ins.dimensions else len(dims) - 1
            if not dims or axis >= len(dims):
                continue
            n = dims[axis]
            rows = max(elements(dims) // max(n, 1), 1)
            # Every read of the sorted arrays is a slice, gather or select of a few elements per row: the top k.
            kept = [elements(u.instruction.dims) // rows for u in graph.users(site)]
            if not kept or n < 256 or max(kept) * 4 > n:
                continue
            k = max(max(kept), 1)
            timed = graph.timed_op(site)
            stake = program.step_percent(program.time_ms(graph.module, [timed]))
            if stake < MIN_STAKE_PERCENT:
                continue
            line, function = program.line_of(graph, site)
            keys = ins.tuple_shapes[0] if ins.tuple_shapes else (ins.dtype, ins.dims)
            quantile = QUANTILE.search(ins.op_name or "")
            at = line or "the sort's line"
            change = (f"compute the {quantile.group(1)} at {at} from the few values it reads instead of sorting all "
                      f"{n}: for a high quantile q, jax.lax.top_k(x, m) with m = ceil((1 - q)·{n}) + 1 holds them "
                      f"(the quantile is the smallest of its values, interpolated with the next); for a low one, "
                      f"jax.lax.top_k(-x, m)" if quantile else
                      f"keep the top {k} at {at} with jax.lax.top_k(x, {k}) (jax.lax.top_k(-x, {k}) for the smallest) "
                      f"instead of sorting all {n} elements and slicing: it returns the values and their indices")
            out.append(Match(
                "full_sort", stake,
                f"sort of {keys[0]}[{','.join(map(str, keys[1]))}] along dimension {axis} ({n} elements"
                + (f", with {len(ins.tuple_shapes) - 1} array(s) carried along" if len(ins.tuple_shapes) > 1 else "")
                + (f"), for jnp.{quantile.group(1)}, which reads {k} of them per row" if quantile else
                   f"), of which only the first {k} are read (a slice)") + (f" at {line}" if line else ""),
                module=program.module_key(graph.module), ops=[timed], line=line, function=function,
                work_ratio=None if quantile else round(n / k, 1), params={"k": k, "n": n, "change": change},
                facts={"sorted_elements": n, "kept_elements": k, "sort_runs": program.runs.get(
                    (program.module_key(graph.module), timed), 0)}))
    return out


def _loop_body_ops(graph: Graph):
    """The ops a while loop's body runs (each timed on its own): matmuls, and fusions that multiply by an operand."""
    for site in graph.sites():
        if site.instruction.opcode in ("fusion", *MATMUL_OPCODES) and graph.loop_of(site.computation) is not None \
                and site.computation.name not in graph.top_level:
            yield site


def _loop_at(program: Program, graph: Graph, loop) -> str:
    """A while loop as its user finds it: "the loop at file:line" (the scan / fori_loop call its stack names), not its
    HLO name."""
    caller = graph.callers.get(loop.called[0]) if loop.called else None
    line = program.line_of(graph, caller)[0] if caller is not None else ""
    return f"the loop at {line}" if line else "a loop"


MIN_WEIGHT_BYTES = 1 << 20
"""A loop-invariant matrix smaller than this is re-read from on-chip memory or costs little."""
MAX_ROWS_PER_TRIP = 16
"""A matmul of at most this many rows per trip leaves the matrix units mostly idle and is bound by reading the
weights: one matmul over all rows reads them once."""


@idiom("loop_invariant_weights", "work_not_needed",
       "A loop re-reads the same weights on every trip to multiply a few rows",
       "apply the weights to all rows at once at {line}: replace the loop over rows (jax.lax.map / fori_loop / scan "
       "over {trips} trips) with one call on the whole batch, jax.vmap(f)(xs) or xs @ w, so the {weights} matrix is "
       "read once per call instead of once per trip",
       "a matmul of a few rows per trip reads the whole weight matrix for a few multiplications; batched, the same "
       "weights are read once and the matrix units see full tiles",
       gain=(0.6, 0.95))
def loop_invariant_weights(program: Program) -> list[Match]:
    """A matmul (or XLA's multiply-and-reduce form of a matrix-vector product) inside a loop whose weight operand
    the loop passes on unchanged, with a few rows per trip."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        for site in _loop_body_ops(graph):
            for position in range(len(site.instruction.operands)):
                weights = graph.loop_invariant(graph.operand(site, position))
                if weights is None or nbytes(weights.instruction) < MIN_WEIGHT_BYTES:
                    continue
                loop = graph.loop_of(weights.computation)
                out_elements = elements(site.instruction.dims or (site.instruction.tuple_shapes[0][1]
                                                                  if site.instruction.tuple_shapes else ()))
                weight_dims = weights.instruction.dims
                per_trip_rows = out_elements // max(weight_dims[-1] if weight_dims else 1, 1)
                if loop is None or not 1 <= per_trip_rows <= MAX_ROWS_PER_TRIP or len(weight_dims) < 2 or \
                        not loop.trip_count or \
                        weight_dims[0] == loop.trip_count or \
                        graph.depends_on_carried(site):  # the rows the loop slices one per trip (lax.map's xs); a
                    continue  # recurrence (a decode loop's next token needs the last) cannot batch its trips
                key = (graph.module.name, loop.name)
                match = out.get(key)
                if match is not None:
                    match.facts["weight_matrices"] = match.facts.get("weight_matrices", 1) + 1
                    continue
                body = weights.computation
                module_key = program.module_key(graph.module)
                timed = [i.name for i in body.instructions if (module_key, i.name) in program.op_ms]
                runs = program.runs.get((module_key, graph.timed_op(site)), 0)
                trips = loop.trip_count or 0
                loops = runs // trips if trips else 0
                # Read once per execution of the loop instead of once per trip, at the device's bandwidth.
                needed = program.roof_ms(hbm_bytes=nbytes(weights.instruction) * loops) if loops else None
                line, function = program.line_of(graph, site)
                out[key] = Match(
                    "loop_invariant_weights", program.step_percent(program.time_ms(graph.module, timed)),
                    f"{_loop_at(program, graph, loop)} runs {trips or 'its'} trips per execution, and each trip "
                    f"multiplies {per_trip_rows} row(s) by weights it passes on unchanged: {graph.computes(site)} reads "
                    f"{weights.instruction.shape_text.split('{')[0]} ({nbytes(weights.instruction) / 2**20:.3g} MiB) "
                    "on every trip" + (f", at {line}" if line else ""),
                    module=module_key, ops=timed[:16], line=line, function=function,
                    needed_percent=program.step_percent(needed) if needed is not None else None,
                    work_ratio=float(trips) if trips else None,
                    params={"trips": trips or "its", "weights": weights.instruction.shape_text.split("{")[0],
                            "rows": per_trip_rows},
                    facts={"weight_bytes": nbytes(weights.instruction), "rows_per_trip": per_trip_rows,
                           "loop_runs": loops, "weight_matrices": 1}, cites=[loop.name])
    return [m for m in out.values() if m.stake_percent >= MIN_STAKE_PERCENT]


SELECT_OPCODES = ("gather", "slice", "dynamic-slice")
"""Ops that keep some of an array's elements: the rows a program reads of a larger result."""
OPAQUE_OPCODES = ("while", "conditional", "call", "custom-call", "all-reduce", "all-gather", "all-to-all",
                  "reduce-scatter", "collective-permute", "send", "outfeed", "async-start", "sort", "scatter")
"""Ops whose use of a value the walk does not see into: the value may be read in full there."""
MAX_KEPT_FRACTION = 0.25
"""A selection keeping more than this share of the rows leaves too little work to remove."""


def _holds_matmul(graph: Graph, ins) -> bool:
    if ins.opcode in MATMUL_OPCODES:
        return True
    if ins.opcode != "fusion" or not ins.called or ins.called[0] not in graph.module.computations:
        return False
    return any(i.opcode in MATMUL_OPCODES for i in graph.module.computations[ins.called[0]].instructions)


def _matmul_inside(graph: Graph, site: Site) -> Site:
    """The matmul a fusion holds (its Python line is the user's), else the op itself."""
    ins = site.instruction
    if ins.opcode == "fusion" and ins.called and ins.called[0] in graph.module.computations:
        inner = graph.module.computations[ins.called[0]]
        for i in inner.instructions:
            if i.opcode in MATMUL_OPCODES:
                return Site(inner, i)
    return site


def _downstream(computation, start: str) -> set[str]:
    """Every instruction of the computation that reads, directly or through others, the value of `start`."""
    out, frontier = set(), [start]
    while frontier:
        name = frontier.pop()
        for user in computation.users.get(name, []):
            if user.name not in out:
                out.add(user.name)
                frontier.append(user.name)
    return out


def _inner_flow(graph: Graph, fusion: Site, position: int, reached: set[str]) -> tuple[str, float]:
    """How a fusion uses its operand in `position`: ('select', kept fraction) where every read of it inside the fusion
    passes a gather or slice first, ('pass', 1) where it reaches the fusion's output, ('mix', 0) where a matmul
    multiplies it by another value the same walk computes (attention's scores: the rows mix)."""
    called = graph.module.computations.get(fusion.instruction.called[0]) if fusion.instruction.called else None
    if called is None:
        return "mix", 0.0
    params = {p.name for p in called.instructions if p.opcode == "parameter" and p.parameter_number == position}
    shares: dict[str, float] = {}  # each gather or slice of it: together, the share of it the fusion reads
    passes, frontier, seen = False, list(params), set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == called.root:
            passes = True
            continue
        current = called.by_name[name]
        for user in called.users.get(name, []):
            if _reads_diagonal(graph, Site(called, user), name):
                return "mix", 0.0  # a diagonal reads one element of every row: no row is left out
            if user.opcode in SELECT_OPCODES and user.operands and user.operands[0] == name:
                shares[user.name] = elements(user.dims) / max(elements(current.dims), 1)
            elif user.opcode in MATMUL_OPCODES:
                others = [o for o in user.operands if o != name]
                if any(_computed_by_walk(graph, Site(called, called.by_name[o]), fusion, reached)
                       for o in others if o in called.by_name):
                    return "mix", 0.0
                frontier.append(user.name)
            # a fusion nested in this one that only re-lays the value out (XLA:TPU wraps a matmul's operands in
            # bitcast or copy fusions) keeps every element of it
            elif user.opcode in OPAQUE_OPCODES or (user.opcode == "fusion" and not _moves_only(graph, user)):
                return "mix", 0.0
            else:
                frontier.append(user.name)
    return ("pass", 1.0) if passes else ("select", min(sum(shares.values()), 1.0))


def _computed_by_walk(graph: Graph, inner: Site, fusion: Site, reached: set[str]) -> bool:
    """Whether a value inside a fusion is built from one the walk reached: from a fusion parameter whose operand is
    in `reached`."""
    frontier, seen = [inner.instruction], set()
    operands = fusion.instruction.operands
    while frontier:
        ins = frontier.pop()
        if ins.name in seen:
            continue
        seen.add(ins.name)
        if ins.opcode == "parameter":
            if 0 <= ins.parameter_number < len(operands) and operands[ins.parameter_number] in reached:
                return True
            continue
        frontier.extend(inner.computation.by_name[o] for o in ins.operands if o in inner.computation.by_name)
    return False


def _row_selection(graph: Graph, site: Site) -> tuple[float, list[str], list[str]] | None:
    """Where every use of an op's value reaches its computation's result only through gathers or slices that keep a
    few of its rows (through elementwise ops, reductions such as a softmax's, and further matmuls by weights): the
    share of the rows kept, the ops walked (the op first) and the selecting ops; else None."""
    computation = site.computation
    downstream = _downstream(computation, site.instruction.name) | {site.instruction.name}
    # per array the walk reaches, each selecting op's share of its rows; the arrays are the same rows computed on
    # (a log-softmax's shifted logits and its log-sum), so the rows kept are those of the array kept most of
    shares: dict[str, dict[str, float]] = {}
    walked, selectors = [site.instruction.name], []
    frontier, seen = [site.instruction.name], set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == computation.root:
            return None  # the value reaches the result as it is
        current = computation.by_name[name]
        for user in computation.users.get(name, []):
            if _reads_diagonal(graph, Site(computation, user), name):
                return None  # a diagonal reads one element of every row: no row is left out
            if user.opcode in SELECT_OPCODES and user.operands and user.operands[0] == name:
                share = elements(user.dims) / max(elements(current.dims), 1)
                of_array = shares.setdefault(name, {})
                of_array[user.name] = max(of_array.get(user.name, 0.0), share)
                selectors.append(user.name)
            elif user.opcode == "fusion":
                flows = [_inner_flow(graph, Site(computation, user), k, downstream)
                         for k, operand in enumerate(user.operands) if operand == name]
                if any(kind == "mix" for kind, _ in flows):
                    return None
                if any(kind == "pass" for kind, _ in flows):
                    frontier.append(user.name)
                    walked.append(user.name)
                else:
                    of_array = shares.setdefault(name, {})
                    of_array[user.name] = max([of_array.get(user.name, 0.0)] + [share for _, share in flows])
                    selectors.append(user.name)
            elif user.opcode in MATMUL_OPCODES:
                if any(o in downstream for o in user.operands if o != name):
                    return None  # multiplied by another value of the walk: the rows mix
                frontier.append(user.name)
                walked.append(user.name)
            elif user.opcode in OPAQUE_OPCODES:
                return None
            else:
                frontier.append(user.name)
                walked.append(user.name)
    # an LSTM's four gate slices of one array keep a quarter each: all of it
    kept = max((sum(of_array.values()) for of_array in shares.values()), default=0.0)
    if not selectors or kept <= 0:
        return None
    return min(kept, 1.0), list(dict.fromkeys(walked)), list(dict.fromkeys(selectors))


@idiom("discarded_rows", "work_not_needed",
       "A matmul computes every row of which only a few are read",
       "select the rows the result reads before the matmul at {line}, not after it: take them from its input first "
       "(x = x[jnp.arange(x.shape[0]), idx] for one position per sequence, x[:, :1] for the "
       "first token, jax.lax.dynamic_slice for a window, with the border its convolution window reads), so that it "
       "and the {after} op(s) after it run on the {kept} of its rows the result keeps",
       "a matmul, and the elementwise ops and reductions after it (a softmax), work row by row: the rows a gather or "
       "slice then drops are computed for nothing, and selecting them first removes that work",
       gain=(0.85, 1.0), measured="docs/reference/measurements.md#discarded-rows")
def discarded_rows(program: Program) -> list[Match]:
    """A matmul (or convolution) whose value, through row-wise ops (elementwise, reductions, further matmuls by
    weights), reaches the result only through gathers or slices that keep a small share of it. Matmuls that feed the
    same selection are one match, led by the one that takes the most time."""
    found: dict[tuple[str, tuple[str, ...]], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        selections = []
        for site in graph.sites():
            if site.computation.name not in graph.top_level and _holds_matmul(graph, site.instruction):
                selection = _row_selection(graph, site)
                selections.append((site, selection if selection is not None and selection[0] <= MAX_KEPT_FRACTION
                                   else None, program.line_of(graph, _matmul_inside(graph, site))))
        # a line whose other matmuls need every row (a layer's function called once per layer, the last one's rows
        # then selected) cannot select its rows without changing those too
        needed_lines = {line for _, selection, line in selections if selection is None and line[0]}
        for site, selection, line in selections:
            if selection is None or line in needed_lines:
                continue
            kept, walked, selectors = selection
            timed = [op for op in walked if (module_key, op) in program.op_ms]
            own_ms = program.time_ms(graph.module, [site.instruction.name])
            key = (module_key, tuple(selectors))
            match = found.get(key)
            if match is None:
                selector = site.computation.by_name[selectors[0]]
                match = found[key] = Match(
                    "discarded_rows", 0.0, "", module=module_key, work_ratio=round(1 / kept, 1),
                    facts={"kept_fraction": round(kept, 6),
                           "selected_by": f"{selector.opcode} → {selector.shape_text.split('{')[0]}",
                           "matmul_ms": -1.0})
            match.ops = list(dict.fromkeys(match.ops + timed))
            if own_ms > match.facts["matmul_ms"]:  # the match is led by its most costly matmul
                inner = _matmul_inside(graph, site)
                match.line, match.function = line
                match.facts["matmul"] = f"{inner.instruction.opcode} → {inner.instruction.shape_text.split('{')[0]}"
                match.facts["matmul_ms"] = own_ms
                match.params["after"] = len(timed) - 1
    out = []
    for match in found.values():
        kept = match.facts["kept_fraction"]
        match.stake_percent = program.step_percent(program.time_ms(
            next(g.module for g in program.graphs if program.module_key(g.module) == match.module), match.ops))
        match.needed_percent = round(match.stake_percent * kept, 3)
        match.params["kept"] = f"1/{round(1 / kept):g}"
        match.what = (f"{match.facts['matmul']} and the {match.params['after']} op(s) after it compute every row, of "
                      f"which the result keeps 1/{round(1 / kept):g} ({match.facts['selected_by']})"
                      + (f", at {match.line}" if match.line else ""))
        if match.stake_percent >= MIN_STAKE_PERCENT:
            out.append(match)
    return out


CHEAP_OPCODES = frozenset({*SHAPE_ONLY, "get-tuple-element", "tuple", "parameter", "constant", "iota",
                           "opt-barrier", "slice", "dynamic-slice"})
"""Ops a loop body may repeat at no real cost, or that only pass a value on."""


def _invariant(graph: Graph, site: Site | None, memo: dict[tuple[str, str], bool | None],
               depth: int = DEPTH) -> bool | None:
    """Whether a value inside a loop body is the same on every trip: built only from elements of the loop's state
    that every trip passes on unchanged, and from constants (looked through the optimization barrier a rematerialised
    body puts on its inputs). True where it reads such an element, None where it reads none (a constant), False
    where it changes."""
    if site is None or depth <= 0:
        return False
    key = (site.computation.name, site.instruction.name)
    if key not in memo:
        memo[key] = False  # a value that reads itself (none should) changes
        memo[key] = _invariant_uncached(graph, site, memo, depth)
    return memo[key]


def _invariant_uncached(graph: Graph, site: Site, memo: dict[tuple[str, str], bool | None],
                        depth: int) -> bool | None:
    if graph.loop_invariant(site) is not None:
        return True
    origin = graph.origin(site)
    if origin is None:
        return False
    ins = origin.instruction
    if ins.opcode in ("constant", "iota"):
        return None
    if ins.opcode == "get-tuple-element":
        barrier = graph.operand(origin, 0)
        if barrier is not None and barrier.instruction.opcode == "opt-barrier":
            tuple_site = graph.operand(barrier, 0)
            if tuple_site is not None and tuple_site.instruction.opcode == "tuple":
                return _invariant(graph, graph.operand(tuple_site, ins.tuple_index), memo, depth - 1)
        return False
    if ins.opcode == "parameter" or ins.opcode in OPAQUE_OPCODES or ins.opcode in ("rng", "rng-bit-generator"):
        return False
    reads = [_invariant(graph, graph.operand(origin, k), memo, depth - 1) for k in range(len(ins.operands))]
    if any(r is False for r in reads):
        return False
    return True if any(reads) else None


@idiom("loop_invariant_compute", "work_not_needed",
       "A loop recomputes on every trip a value that never changes",
       "compute it once before the loop at {line}: {op} reads only values the loop passes on unchanged, so build it "
       "before jax.lax.scan / fori_loop and let the body (and a jax.checkpoint-ed function in it) close over the "
       "result, instead of recomputing it on each of the {trips} trips",
       "the value is the same on every trip; computed once before the loop, it costs one trip's time instead of one "
       "per trip",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#loop-invariant-compute")
def loop_invariant_compute(program: Program) -> list[Match]:
    """Ops of a while loop's body (scan, fori_loop) whose every operand is the same on every trip: XLA hoists most
    such ops itself, but not one whose result is much larger than its operands, nor one behind the optimization
    barrier of a rematerialised (jax.checkpoint) body."""
    out: dict[tuple[str, str], Match] = {}
    loops_at: dict[tuple[str, str], str] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        memo: dict[tuple[str, str], bool | None] = {}
        for site in graph.sites():
            ins = site.instruction
            if site.computation.name in graph.top_level or ins.opcode in CHEAP_OPCODES or not ins.operands \
                    or (module_key, ins.name) not in program.op_ms:
                continue
            loop = graph.loop_of(site.computation)
            if loop is None or not loop.trip_count or loop.trip_count < 2:
                continue
            reads = [_invariant(graph, graph.operand(site, k), memo) for k in range(len(ins.operands))]
            if any(r is False for r in reads) or not (any(reads) or _holds_matmul(graph, ins)):
                continue  # a matmul of constants counts too (weights closed over as constants), a fill does not
            ms = program.time_ms(graph.module, [ins.name])
            match = out.get((module_key, loop.name))
            if match is None:
                match = out[(module_key, loop.name)] = Match(
                    "loop_invariant_compute", 0.0, "", module=module_key, work_ratio=float(loop.trip_count),
                    params={"trips": loop.trip_count}, facts={"loop": loop.name, "trips": loop.trip_count,
                                                              "lead_ms": -1.0})
                loops_at[(module_key, loop.name)] = _loop_at(program, graph, loop)
            match.ops.append(ins.name)
            if ms > match.facts["lead_ms"]:
                inner = _matmul_inside(graph, site)
                match.line, match.function = program.line_of(graph, inner)
                match.facts["lead_ms"] = ms
                match.params["op"] = graph.computes(site)
    found = []
    for key, match in out.items():
        module = next(g.module for g in program.graphs if program.module_key(g.module) == match.module)
        trips = match.params["trips"]
        match.stake_percent = program.step_percent(program.time_ms(module, match.ops))
        match.needed_percent = round(match.stake_percent / trips, 3)
        match.what = (f"{loops_at[key]} runs {trips} trips per execution, and on each it recomputes "
                      f"{match.params['op']}" + (f" (and {len(match.ops) - 1} more op(s))" if len(match.ops) > 1
                                                 else "")
                      + " from values the loop passes on unchanged" + (f", at {match.line}" if match.line else ""))
        if match.stake_percent >= MIN_STAKE_PERCENT:
            found.append(match)
    return found


CALL_INVARIANT_MIN_STAKE_PERCENT = 10.0
"""A part of the step built only from arguments it does not update, holding less of the step than this, is left
alone: computed once outside, it would save too little to be worth a second function."""
CALLS = ("while", "conditional", "call")
"""Ops that run computations of their own, timed by those computations' ops."""


def _post_order(computation) -> list:
    """The computation's instructions, each after its operands."""
    order, seen = [], set()
    for start in computation.instructions:
        stack = [(start, False)]
        while stack:
            ins, done = stack.pop()
            if done:
                order.append(ins)
            elif ins.name not in seen:
                seen.add(ins.name)
                stack.append((ins, True))
                stack.extend((computation.by_name[o], False) for o in ins.operands
                             if o in computation.by_name and o not in seen)
    return order


Reads = dict[tuple[str, str], frozenset[str]]


def _arguments_read(graph: Graph) -> Reads:
    """For each instruction of the program's entry and of the fusions it calls, the arguments its value is computed
    from (the entry's parameters, each element of a tupled one apart); none for a constant or an iota."""
    entry = graph.module.computations[graph.module.entry]
    reads: Reads = {}

    def walk(computation, caller: Site | None) -> None:
        for ins in _post_order(computation):
            source = computation.by_name.get(ins.operands[0]) if ins.operands else None
            if caller is not None and ins.opcode == "parameter":
                outer = graph.operand(caller, ins.parameter_number)
                value = reads.get((outer.computation.name, outer.instruction.name), frozenset()) if outer else \
                    frozenset()
            elif caller is None and (ins.opcode == "parameter" or (
                    ins.opcode == "get-tuple-element" and source is not None and source.opcode == "parameter")):
                value = frozenset({ins.name})
            else:
                value = frozenset().union(*(reads.get((computation.name, o), frozenset()) for o in ins.operands))
            reads[(computation.name, ins.name)] = value
            if ins.opcode == "fusion" and ins.called and ins.called[0] in graph.module.computations:
                walk(graph.module.computations[ins.called[0]], Site(computation, ins))

    walk(entry, None)
    return reads


def _fused_matmuls(graph: Graph, site: Site) -> list[Site]:
    """The matmuls an op runs: itself, or those of the fusion it is (and of the fusions nested in it)."""
    ins = site.instruction
    if ins.opcode in MATMUL_OPCODES:
        return [site]
    if ins.opcode != "fusion" or not ins.called or ins.called[0] not in graph.module.computations:
        return []
    inner = graph.module.computations[ins.called[0]]
    return [m for i in inner.instructions for m in _fused_matmuls(graph, Site(inner, i))]


def _timed_ops(program: Program, graph: Graph, site: Site) -> list[str]:
    """The ops the profile times for an instruction of the entry: its own, or those of the computations a loop, a
    conditional or a call runs."""
    if site.instruction.opcode not in CALLS:
        return [graph.timed_op(site)]
    key, out = program.module_key(graph.module), []
    for name in site.instruction.called:
        called = graph.module.computations.get(name)
        for ins in called.instructions if called is not None else ():
            out.extend(_timed_ops(program, graph, Site(called, ins)))
    return [op for op in dict.fromkeys(out) if (key, op) in program.op_ms]


def _argument_names(graph: Graph, names) -> list[str]:
    """The arguments as the user's code names them (their pytree paths), a tree's leaves under their common path
    (params['item'] for params['item'][0]['w'] and params['item'][2]['b'])."""
    entry = graph.module.computations[graph.module.entry]
    position = {ins.name: k for k, ins in enumerate(entry.instructions)}  # parameters in the function's order
    paths = list(dict.fromkeys(entry.by_name[n].op_name or re.sub(r"\.\d+$", "", n)
                               for n in sorted(names, key=lambda n: (_argument_number(entry, n), position[n]))))
    trees: dict[str, list[list[str]]] = {}
    for path in paths:
        root, *keys = re.split(r"(?=\[)", path)
        trees.setdefault(root, []).append(keys)
    out = []
    for root, leaves in trees.items():
        common = 0
        while all(len(k) > common and k[common] == leaves[0][common] for k in leaves):
            common += 1
        out.append(root + "".join(leaves[0][:common]) if len(leaves) > 1 else root + "".join(leaves[0]))
    return out


def _argument_number(entry, name: str) -> tuple[int, int]:
    """An argument's position among the jitted function's (a tupled one's element: its tuple's, then its index)."""
    ins = entry.by_name[name]
    if ins.opcode == "get-tuple-element":
        return entry.by_name[ins.operands[0]].parameter_number, ins.tuple_index
    return ins.parameter_number, 0


def _call_site(program: Program, graph: Graph, site: Site) -> tuple[str, str, str]:
    """(the line of the jitted function that calls the code computing this op, the function it calls there, the
    jitted function's name) from the op's Python stack; the function is "" where the jitted function's own line
    computes it."""
    jitted = re.sub(r"^p?jit_|\(\d+\)$", "", graph.module.name)
    stack = graph.module.stack(_matmul_inside(graph, site).instruction)
    for k, (file, line, function) in enumerate(stack):
        if function == jitted:
            return (f"{Frame(file, line, function).short}", stack[k - 1][2] if k > 0 else "", jitted)
    line, _ = program.line_of(graph, _matmul_inside(graph, site))
    return line, "", jitted


@idiom("call_invariant_compute", "work_not_needed",
       "Each call recomputes a large part from arguments the step does not update",
       "compute {part} at {line} once, outside {jitted}, where {arguments} are made ({example}), and pass {results} "
       "to {jitted} in place of {arguments}, so each call reads it instead of recomputing it",
       "that part of the step reads only some of its arguments, none of which the step updates; where they are the "
       "same on every call (the premise: weights and a catalogue fixed while the requests change, which the profile "
       "cannot see), its result is the same too, and computed once it costs nothing per call",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#call-invariant-compute",
       alternatives=("where those arguments change now and then (weights reloaded, items added), recompute the "
                     "result only then (for the new items only), not on every call",))
def call_invariant_compute(program: Program) -> list[Match]:
    """Per program that updates none of its arguments (no training step: what it does not update includes its next
    batch), the matmuls (and the ops around them) computed only from some of its arguments and not from others the
    result reads (a fixed catalogue's embeddings, where the requests are the other arguments), holding at least
    CALL_INVARIANT_MIN_STAKE_PERCENT of the step. Arguments that share their leading dimension with a result's (the
    requests a result has a row for) are taken to change with each call; a program whose results have no dimension
    gives no such sign and is left alone. An op that fuses such matmuls with others (XLA:CPU and
    XLA:GPU fuse a tower into the matmul that reads it) stakes their share of its matmuls' FLOPs of its time."""
    out = []
    for graph in program.graphs:
        entry = graph.module.computations.get(graph.module.entry)
        root = entry.by_name.get(entry.root) if entry is not None else None
        if root is None:
            continue
        shapes_out = [d for _, d in root.tuple_shapes] if root.tuple_shapes else \
            [o.instruction.dims for o in graph.outputs()]
        batch = {dims[0] for dims in shapes_out if dims}
        if not batch:
            continue
        reads = _arguments_read(graph)
        result_reads = reads[(entry.name, root.name)]
        if any(graph.updated_by_step(entry.by_name[name]) for name in result_reads):
            continue  # a training step (params in, new params out): what it does not update includes its next batch
        unchanged = {name for name in result_reads
                     if not (entry.by_name[name].dims and entry.by_name[name].dims[0] in batch)}
        key = program.module_key(graph.module)
        timed = [Site(entry, ins) for ins in entry.instructions
                 if ins.opcode not in ("parameter", "constant", "tuple", "get-tuple-element")
                 and any(program.op_ms.get((key, op)) for op in _timed_ops(program, graph, Site(entry, ins)))]
        matmuls = [m for t in timed for m in _fused_matmuls(graph, t)]

        def reads_of(site: Site) -> frozenset[str]:
            return reads.get((site.computation.name, site.instruction.name), frozenset())

        parts = {r for r in reads.values() if r and r <= unchanged and result_reads - r}
        claimed: set[str] = set()
        for part in sorted((p for p in parts if not any(p < q for q in parts)), key=len, reverse=True):
            if not any(reads_of(m) and reads_of(m) <= part for m in matmuls):
                continue
            ops, ms, within = [], 0.0, []
            for site in timed:
                if site.instruction.name in claimed:
                    continue
                inner = [m for m in _fused_matmuls(graph, site) if reads_of(m) <= part and reads_of(m)]
                whole = bool(reads_of(site)) and reads_of(site) <= part
                if not whole and not inner:
                    continue
                flops = sum(matmul_flops(graph, m) for m in _fused_matmuls(graph, site))
                share = 1.0 if whole or not flops else sum(matmul_flops(graph, m) for m in inner) / flops
                site_ops = _timed_ops(program, graph, site)
                ops.extend(site_ops)
                ms += share * program.time_ms(graph.module, site_ops)
                within.extend((site, m) for m in inner)
            stake = program.step_percent(ms)
            if not within or stake < CALL_INVARIANT_MIN_STAKE_PERCENT:
                continue
            claimed.update(site.instruction.name for site, _ in within)
            inside = {name for (computation, name), r in reads.items() if computation == entry.name and r
                      and r <= part}
            results = list(dict.fromkeys(  # what the rest of the step reads of the part, its arguments apart
                o for ins in entry.instructions if ins.name not in inside for o in ins.operands
                if o in inside and graph.origin(Site(entry, entry.by_name[o])).instruction.name not in
                reads.get((entry.name, graph.origin(Site(entry, entry.by_name[o])).instruction.name), ())))
            shapes = [plain_shape(entry.by_name[r]) for r in results if entry.by_name[r].dtype != "tuple"]
            fused = not shapes  # the part's result is made inside the op that reads it
            _, heaviest = max(within, key=lambda pair: matmul_flops(graph, pair[1]))
            call_line, callee, jitted = _call_site(program, graph, heaviest)
            line, function = program.line_of(graph, heaviest)
            arguments = _argument_names(graph, part)
            others = _argument_names(graph, result_reads - part)
            listed = " and ".join([", ".join(arguments[:-1]), arguments[-1]] if len(arguments) > 1 else arguments)
            ops = list(dict.fromkeys(ops))
            out.append(Match(
                "call_invariant_compute", stake,
                f"{len(within)} matmul(s) of the jitted {jitted} ({graph.computes(heaviest)} the largest) and the ops "
                f"around them compute from {listed} alone"
                + (f" (the call of {callee} at {call_line})" if callee else f" at {call_line}" if call_line else "")
                + f": {stake:g}% of the step"
                + (", by their share of the FLOPs of the matmuls XLA fused them with" if fused else "")
                + f". The step also reads {', '.join(others[:4])}"
                + ("" if fused else f", and of this part only {', '.join(shapes[:3])}")
                + f"; it returns no new value of {listed}",
                module=key, ops=ops[:16], line=call_line or line, function=function,
                params={"part": f"{callee}({', '.join(arguments)})" if callee else
                        f"what {jitted} computes from {listed}",
                        "jitted": f"the jitted {jitted}", "arguments": listed,
                        "example": f"jax.jit({callee})({', '.join(arguments)})" if callee else
                        f"jax.jit(f)({', '.join(arguments)}) of a function f holding those lines",
                        "results": f"the result ({', '.join(shapes[:3])})" if shapes else "the result"},
                facts={"arguments": arguments[:8], "other_arguments": others[:8], "results": shapes[:4],
                       "matmuls": len(within)}))
    return out


BRANCH_WALK_MAX = 4096
"""How many instructions a walk back from a select's operand visits: a branch is a handful of ops to a whole model."""


def _computed_by(graph: Graph, site: Site | None) -> set[str]:
    """The timed ops that compute a value, walking back over operands across fusion boundaries, up to the program's
    or the loop's own arguments (data both branches share)."""
    out: set[str] = set()
    frontier, seen = [site], set()
    while frontier and len(seen) < BRANCH_WALK_MAX:
        current = frontier.pop()
        if current is None:
            continue
        key = (current.computation.name, current.instruction.name)
        if key in seen:
            continue
        seen.add(key)
        ins = current.instruction
        if ins.opcode == "parameter":
            caller = graph.callers.get(current.computation.name)
            if caller is not None and caller.instruction.opcode == "fusion" and ins.parameter_number >= 0:
                frontier.append(graph.operand(caller, ins.parameter_number))
            continue  # the entry's or a loop's argument: no op of this step computes it here
        if ins.opcode in ("get-tuple-element", "constant"):
            continue
        out.add(graph.timed_op(current))
        frontier.extend(graph.operand(current, k) for k in range(len(ins.operands)))
    return out


BRANCH_HEAVY_OPS = frozenset({"convolution", "dot"})
"""Ops whose time, fused with the select that reads them, is one branch's own work rather than the select's."""


def _computes_inside(graph: Graph, site: Site | None) -> bool:
    """Whether a value is made by a matmul or convolution inside the fusion that holds it (walking back within that
    fusion, and into the fusions nested in it, up to its parameters): work fused together with its reader."""
    caller = graph.callers.get(site.computation.name) if site is not None else None
    if caller is None or caller.instruction.opcode != "fusion":
        return False  # not inside a fusion: each op is timed on its own
    frontier, seen = [site], set()
    while frontier and len(seen) < BRANCH_WALK_MAX:
        current = frontier.pop()
        if current is None or current.instruction.name in seen:
            continue
        seen.add(current.instruction.name)
        ins = current.instruction
        if ins.opcode in BRANCH_HEAVY_OPS:
            return True
        if ins.opcode == "fusion" and ins.called and ins.called[0] in graph.module.computations and any(
                i.opcode in BRANCH_HEAVY_OPS for i in graph.module.computations[ins.called[0]].instructions):
            return True
        if ins.opcode != "parameter":
            frontier.extend(graph.operand(current, k) for k in range(len(ins.operands)))
    return False


@idiom("select_computes_both_branches", "work_not_needed",
       "jnp.where with one flag computes both arrays and throws one away",
       "compute only the branch the flag picks at {line}: jax.lax.cond(flag, branch_a, branch_b, x) instead of "
       "jnp.where(flag, branch_a(x), branch_b(x)), with each branch a function of the same operands (outside "
       "jax.vmap: a cond over a batch of flags becomes a select again)",
       "jnp.where picks element by element, so both arrays are computed in full before one of them is discarded; "
       "with one scalar flag for the whole array, lax.cond runs only the branch it picks",
       gain=(0.6, 0.8), measured="docs/reference/measurements.md#select-both-branches")
def select_computes_both_branches(program: Program) -> list[Match]:
    """A select whose predicate is one scalar broadcast to the whole array, where the ops computing each of its two
    arrays (those the other array and the flag do not share) take time: the cheaper branch's time is what lax.cond
    saves whichever way the flag goes."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "select" or len(ins.operands) != 3 or not ins.dims or \
                    ins.op_name.rsplit("/", 1)[-1] != "select_n":  # jnp.where, lax.select: not XLA's own selects
                continue
            flag = graph.origin(graph.operand(site, 0))
            if flag is None or flag.instruction.dims or flag.instruction.dtype != "pred" or \
                    flag.instruction.opcode == "constant":
                continue
            own = graph.timed_op(site)
            shared = _computed_by(graph, flag) | {own}
            first, second = (_computed_by(graph, graph.operand(site, k)) for k in (1, 2))
            branches = [sorted(first - second - shared), sorted(second - first - shared)]
            # XLA:TPU fuses the select into the op that computes one of its arrays (a convolution and the select
            # as one fusion): that op's time is that branch's, not work both share
            inside = [_computes_inside(graph, graph.operand(site, k)) for k in (1, 2)]
            if inside[0] != inside[1]:
                branches[inside.index(True)].append(own)
            times = [program.time_ms(graph.module, ops) for ops in branches]
            saved = min(times)
            stake = program.step_percent(saved)
            if stake < MIN_STAKE_PERCENT:
                continue
            line, function = program.line_of(graph, site)
            key = (module_key, line or own)
            if key in out:
                continue
            cheaper = times.index(saved)
            out[key] = Match(
                "select_computes_both_branches", stake,
                f"a select of {ins.shape_text.split('{')[0]} picks between two arrays by one scalar flag broadcast "
                f"to every element" + (f" at {line}" if line else "") + f": the ops computing one array take "
                f"{program.step_percent(times[0]):g}% of the step, those computing the other "
                f"{program.step_percent(times[1]):g}%, and both run every step; the cheaper one, {stake:g}%, is "
                "what computing only the picked branch saves whichever way the flag goes",
                module=module_key, ops=branches[cheaper][:16], line=line, function=function,
                work_ratio=round(sum(times) / max(times), 2) if max(times) > 0 else None,
                facts={"branch_ms": [round(t, 3) for t in times], "branch_ops": [len(b) for b in branches],
                       "select": ins.shape_text.split("{")[0]})
    return list(out.values())


MIN_BUFFER_BYTES = 1 << 20
"""A carried buffer smaller than this costs little to copy."""


def _in_place_update(graph: Graph, body, index: int) -> Site | None:
    """Where the trip's new value of a loop-state element is the old one with a slice written into it (a
    dynamic-update-slice or scatter, as .at[i].set(v) lowers): that update; else None."""
    root = body.by_name.get(body.root)
    if root is None or root.opcode != "tuple" or not 0 <= index < len(root.operands) or \
            root.operands[index] not in body.by_name:
        return None
    made = _through_outputs(graph, graph.origin(Site(body, body.by_name[root.operands[index]])))
    return made if made is not None and made.instruction.opcode in ("dynamic-update-slice", "scatter") else None


def _through_outputs(graph: Graph, site: Site | None) -> Site | None:
    """Where a value is one output of a fusion with several (XLA:TPU fuses a slot's update with the reads beside
    it): the instruction inside that makes it; else the value's origin."""
    while site is not None and site.instruction.opcode == "get-tuple-element":
        fusion = graph.operand(site, 0)
        called = graph.module.computations.get(fusion.instruction.called[0]) if fusion is not None and \
            fusion.instruction.opcode == "fusion" and fusion.instruction.called else None
        root = called.by_name.get(called.root) if called is not None else None
        index = site.instruction.tuple_index
        if root is None or root.opcode != "tuple" or not 0 <= index < len(root.operands):
            return site
        site = graph.origin(Site(called, called.by_name[root.operands[index]]))
    return site


def _root_path(graph: Graph, body, index: int) -> list[Site]:
    """The copies on the way from a trip's update of a loop-state element to the body's result (a copy of the
    updated buffer XLA makes to hand it to the next trip)."""
    root = body.by_name.get(body.root)
    site = Site(body, body.by_name[root.operands[index]]) if root is not None and root.opcode == "tuple" and \
        0 <= index < len(root.operands) and root.operands[index] in body.by_name else None
    out = []
    while site is not None and site.instruction.opcode in SHAPE_ONLY and site.computation is body:
        if site.instruction.opcode == "copy":
            out.append(site)
        site = graph.operand(site, 0)
    return out


def _readers(graph: Graph, value: Site) -> list[Site]:
    """The ops of the value's computation that read it, a copy of it or a re-laid-out copy (a fusion of transposes
    and copies): each as its computation's op, a fusion rather than the fusion's instructions."""
    names, out, frontier = {value.instruction.name}, [], [value.instruction.name]
    while frontier:
        name = frontier.pop()
        for user in value.computation.users.get(name, []):
            if user.name in names or user.opcode == "tuple":
                continue
            if user.opcode == "copy" or _moves_only(graph, user):
                names.add(user.name)
                frontier.append(user.name)
            else:
                out.append(Site(value.computation, user))
    return out


def _moves_only(graph: Graph, instruction) -> bool:
    """A fusion that only re-lays out or re-types its operand (a transpose written out for a later op)."""
    called = graph.module.computations.get(instruction.called[0]) if instruction.opcode == "fusion" and \
        instruction.called else None
    return called is not None and all(i.opcode in SHAPE_ONLY or i.opcode == "parameter" for i in called.instructions)


@idiom("loop_copies_carried_buffer", "work_not_needed",
       "A loop copies a buffer it carries in full on every trip",
       "make the update at {line} the last use of the buffer in the trip: read the updated buffer after "
       "buf = buf.at[i].set(v) (mask the slot just written where the old values are needed) instead of reading "
       "the buffer as it was before the update{reads}, so XLA writes the slot in place; or, where the trips only "
       "append to it, return the slice as the scan's per-step output (ys) instead of carrying the buffer",
       "an in-place update needs the old buffer to be dead once it is written; a read of the old values in the same "
       "trip keeps it alive, so XLA copies the whole buffer every trip to update the copy, bytes the result does "
       "not need; the reads of the old values are staked too: on a TPU v5e they ran 2.8x slower than the same "
       "reads of the updated buffer after the change (one program's measurement, a premise elsewhere)",
       gain=(0.6, 0.9), measured="docs/reference/measurements.md#loop-copies-carried-buffer")
def loop_copies_carried_buffer(program: Program) -> list[Match]:
    """Copy instructions of a while loop's body that copy, in full, an element of the loop's state the trip updates
    in place (before the update, or the updated buffer on its way to the next trip), with the reads of the old
    values that keep the old buffer alive."""
    out: dict[tuple[str, str], Match] = {}
    loops_at: dict[tuple[str, str], str] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "copy" or site.computation.name in graph.top_level or \
                    nbytes(ins) < MIN_BUFFER_BYTES:
                continue
            loop = graph.loop_of(site.computation)
            carried = graph.origin(site)
            if loop is None or carried is None or carried.instruction.opcode != "get-tuple-element" or \
                    carried.computation is not site.computation or carried.instruction.dims != ins.dims:
                continue
            state = graph.operand(carried, 0)
            index = carried.instruction.tuple_index
            update = _in_place_update(graph, site.computation, index)
            if state is None or state.instruction.opcode != "parameter" or update is None:
                continue
            key = (module_key, loop.name)
            match = out.get(key)
            if match is None:
                line, function = program.line_of(graph, update)
                match = out[key] = Match(
                    "loop_copies_carried_buffer", 0.0, "", module=module_key, line=line, function=function,
                    params={"reads": ""},
                    facts={"trips": loop.trip_count, "buffers": [], "copy_bytes_per_trip": 0, "copies": 0,
                           "copy_runs": program.runs.get((module_key, ins.name), 0), "old_value_reads": []},
                    cites=[loop.name])
                loops_at[key] = _loop_at(program, graph, loop)
            copies = [c for c in [site] + _root_path(graph, site.computation, index) if nbytes(c.instruction)
                      >= MIN_BUFFER_BYTES and c.instruction.name not in match.ops]
            for copy in copies:
                match.ops.append(copy.instruction.name)
                match.facts["copies"] += 1
                match.facts["copy_bytes_per_trip"] += nbytes(copy.instruction)
                match.facts["buffers"].append(copy.instruction.shape_text.split("{")[0])
            # the reads of the values as they were, which the change moves onto the updated buffer
            updating = graph.timed_op(update)
            old_reads = [graph.timed_op(r) for r in _readers(graph, carried)
                         if graph.timed_op(r) not in (updating, *match.ops)]
            match.facts["old_value_reads"] = list(dict.fromkeys(match.facts["old_value_reads"] + old_reads))
            reads = sorted({program.line_of(graph, r)[0] for r in _readers(graph, carried)
                            if graph.timed_op(r) != updating} - {"", match.line})
            if reads:
                match.params["reads"] = f" (at {', '.join(reads[:3])})"
    found = []
    for key, match in out.items():
        module = next(g.module for g in program.graphs if program.module_key(g.module) == match.module)
        copies_percent = program.step_percent(program.time_ms(module, match.ops))
        match.ops = list(dict.fromkeys(match.ops + match.facts["old_value_reads"]))
        match.stake_percent = program.step_percent(program.time_ms(module, match.ops))
        if copies_percent < MIN_STAKE_PERCENT:
            continue
        trips = match.facts["trips"]
        match.what = (f"{loops_at[key]} runs {trips or 'its'} trips, and each copies "
                      f"{match.facts['copy_bytes_per_trip'] / 2**20:.3g} MiB of the state it carries "
                      f"({match.facts['copies']} copies of {', '.join(sorted(set(match.facts['buffers'])))}) because "
                      "the trip reads a buffer as it was before updating it in place"
                      + (f" at {match.line}" if match.line else "") + f": the copies {copies_percent:g}% of the step, "
                      f"the reads of the old values ({len(match.facts['old_value_reads'])} ops) "
                      f"{match.stake_percent - copies_percent:.3g}%")
        match.facts["copies_percent"] = copies_percent
        found.append(match)
    return found


def matmul_flops(graph: Graph, site: Site) -> float:
    """A matmul's FLOPs from its shapes: 2 · |output| · the contracted size."""
    ins = site.instruction
    if ins.opcode == "convolution":
        return conv_flops(ins, site.computation) or 0.0
    lhs = graph.operand(site, 0)
    if lhs is None:
        return 0.0
    return 2.0 * elements(ins.dims) * elements(tuple(lhs.instruction.dims[d] for d in ins.lhs_contracting
                                                     if d < len(lhs.instruction.dims)))


def _outer(graph: Graph, site: Site) -> Site:
    """The value as the rest of the program reads it: a fusion's root is the fusion's own result."""
    seen = set()
    while site.computation.name not in seen and site.instruction.name == site.computation.root:
        seen.add(site.computation.name)
        caller = graph.callers.get(site.computation.name)
        if caller is None or caller.instruction.opcode != "fusion":
            break
        site = caller
    return site


def value_readers(graph: Graph, site: Site) -> list[Site]:
    """Every instruction that reads a value, inside its fusion and, where it is the fusion's result, after it."""
    outer = _outer(graph, site)
    found = list(graph.users(site)) + (list(graph.users(outer)) if outer is not site else [])
    return list({(s.computation.name, s.instruction.name): s for s in found}.values())


def _plain_matmul(graph: Graph, site: Site | None) -> bool:
    """A matmul of two matrices: a dot with no batch dimensions, or a convolution that is one, to a 2-D result."""
    if site is None or len(site.instruction.dims) != 2:
        return False
    ins = site.instruction
    return (ins.opcode == "dot" and not ins.lhs_batch) or (ins.opcode == "convolution" and ins.conv_is_matrix_product)


def timed_stake(program: Program, graph: Graph, sites: list[Site]) -> tuple[list[str], float]:
    """The timed ops that run these instructions, and their share of the step."""
    ops = list(dict.fromkeys(graph.timed_op(s) for s in sites))
    return ops, program.step_percent(program.time_ms(graph.module, ops))


def _needed_percent(program: Program, graph: Graph, op: str, flops: float = 0.0, hbm_bytes: float = 0.0
                    ) -> float | None:
    """The share of the step this much work per run of `op` needs at the device's peaks (None without peaks)."""
    runs = program.runs.get((program.module_key(graph.module), op), 1)
    ms = program.roof_ms(flops=flops * runs, hbm_bytes=hbm_bytes * runs)
    return program.step_percent(ms) if ms is not None else None


MIN_REORDER_RATIO = 4.0
"""A product chain whose other order needs less than this fraction of its FLOPs is left alone."""


@idiom("matmul_chain_order", "work_not_needed",
       "A product of two large matrices is computed only to multiply a thin one",
       "reorder the product at {line}: {reordered} (or jnp.linalg.multi_dot([{operands}]), which picks the cheapest "
       "order from the shapes), so the thin operand is multiplied first and the {big} product is never formed",
       "matrix products associate: (A @ B) @ v forms the whole n×n product, n³ multiply-adds, where A @ (B @ v) "
       "needs two matrix-thin products, n²·k each; the result is the same up to rounding",
       gain=(0.45, 0.7), measured="docs/reference/measurements.md#matmul-chain-order")
def matmul_chain_order(program: Program) -> list[Match]:
    """A matmul whose result only one other matmul reads, where multiplying in the other order needs at least
    MIN_REORDER_RATIO times fewer FLOPs. With the first product P (r×c, contracted over k) and the second reading it
    along c with p columns of the third operand: r·c·k + r·c·p multiply-adds now, k·p·(c + r) the other way."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for second in _matmul_sites(graph):
            if not _plain_matmul(graph, second):
                continue
            for position in (0, 1):
                operand = graph.operand(second, position)
                first = graph.origin(operand)
                if operand is None or first is None or not _plain_matmul(graph, first) or \
                        elements(operand.instruction.dims) != elements(first.instruction.dims) or \
                        [r.instruction.name for r in value_readers(graph, first)] != [second.instruction.name]:
                    continue
                flops_now = matmul_flops(graph, first) + matmul_flops(graph, second)
                product = elements(first.instruction.dims)
                k = matmul_flops(graph, first) / (2 * product)
                c = matmul_flops(graph, second) / (2 * max(elements(second.instruction.dims), 1))
                r = product / max(c, 1)
                p = elements(second.instruction.dims) / max(r, 1)
                flops_other = 2 * k * p * (c + r)
                if flops_other <= 0 or flops_now < MIN_REORDER_RATIO * flops_other:
                    continue
                line, function = program.line_of(graph, second)
                ops, stake = timed_stake(program, graph, [first, second])
                if stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                    continue
                thin = graph.operand(second, 1 - position)
                x, y = (graph.operand(first, j) for j in (0, 1))
                shape = [s.instruction.shape_text.split("{")[0] if s is not None else "?" for s in (x, y, thin)]
                big = first.instruction.shape_text.split("{")[0]
                reordered = (f"A @ (B @ v) instead of (A @ B) @ v, with A {shape[0]}, B {shape[1]} and v {shape[2]}"
                             if position == 0 else
                             f"(v @ A) @ B instead of v @ (A @ B), with v {shape[2]}, A {shape[0]} and B {shape[1]}")
                out[(module_key, line or ops[0])] = Match(
                    "matmul_chain_order", stake,
                    f"{opcode_name(first.instruction)} {shape[0]} × {shape[1]} → {big} ({flops_now / 1e9:.3g} GFLOP "
                    f"with the next product), read only by {opcode_name(second.instruction)} with {shape[2]} → "
                    f"{second.instruction.shape_text.split('{')[0]}; multiplied the other way the two products need "
                    f"{flops_other / 1e9:.3g} GFLOP, {flops_now / flops_other:.3g}× less"
                    + (f", at {line}" if line else ""),
                    module=module_key, ops=ops, line=line, function=function,
                    # the other order's FLOPs, and each of its two products reading its large operand once
                    needed_percent=_needed_percent(program, graph, ops[-1], flops=flops_other, hbm_bytes=sum(
                        nbytes(o.instruction) for o in (graph.origin(v) for v in (x, y, thin)) if o is not None)),
                    work_ratio=round(flops_now / flops_other, 1),
                    params={"reordered": reordered, "big": big,
                            "operands": "A, B, v" if position == 0 else "v, A, B"},
                    facts={"flops_per_run": flops_now, "flops_reordered_per_run": flops_other,
                           "product": big, "thin_operand": shape[2]})
    return list(out.values())


def _reads_diagonal(graph: Graph, reader: Site, value: str) -> bool:
    """Whether an instruction reads only the diagonal of the matrix `value`: a gather at index pairs (i, i) built
    from one iota (jnp.diagonal, jnp.diag), or a select or product with an identity mask (jnp.trace, x * jnp.eye)."""
    ins = reader.instruction
    if ins.opcode == "gather" and ins.operands[:1] == (value,) and len(ins.operands) > 1:
        indices = graph.origin(graph.operand(reader, 1))
        if indices is None:
            return False
        if indices.instruction.opcode == "concatenate":
            parts = {o.instruction.name if o is not None and o.instruction.opcode == "iota" else None
                     for o in (graph.origin(graph.operand(indices, k))
                               for k in range(len(indices.instruction.operands)))}
            if len(parts) == 1 and None not in parts:
                return True
        # XLA:TPU packs each index pair into one integer (i << 16 | i) and unpacks it inside the gather's fusion:
        # index pairs computed from iotas alone, one element per row of a square matrix, are its diagonal
        matrix = reader.computation.by_name.get(value)
        return matrix is not None and len(matrix.dims) == 2 and matrix.dims[0] == matrix.dims[1] and \
            elements(ins.dims) == matrix.dims[0] and indices.instruction.dims[-1:] == (2,) and \
            _from_iotas_only(graph, indices)
    if ins.opcode == "select" and len(ins.operands) == 3 and value in ins.operands[1:]:
        other = graph.operand(reader, 2 if ins.operands[1] == value else 1)
        return graph.mask_kind(graph.operand(reader, 0)) == "diagonal" and graph.mask_kind(other) == "constant"
    if ins.opcode == "multiply" and len(ins.operands) == 2 and value in ins.operands:
        return graph.mask_kind(graph.operand(reader, 1 - ins.operands.index(value))) == "diagonal"
    return False


def _from_iotas_only(graph: Graph, site: Site, limit: int = 64) -> bool:
    """Whether a value is computed from iotas and constants alone (across fusions), with at least one iota: an
    index the program fixes, not one it reads."""
    frontier, seen, iotas = [site], set(), 0
    while frontier:
        current = frontier.pop()
        key = (current.computation.name, current.instruction.name)
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > limit:
            return False
        opcode = current.instruction.opcode
        if opcode == "iota":
            iotas += 1
        elif opcode in ("fusion", "parameter"):
            back = graph.producer(current)
            if back is None:
                return False  # an argument of the program
            frontier.append(back)
        elif opcode != "constant":
            if opcode in OPAQUE_OPCODES and opcode != "custom-call" or not current.instruction.operands:
                return False
            frontier.extend(s for s in (graph.operand(current, k) for k in range(len(current.instruction.operands)))
                            if s is not None)
    return iotas > 0


ELEMENTWISE_OPCODES = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs",
                                  "sqrt", "rsqrt", "exponential", "log", "tanh", "logistic", "power", "select",
                                  "clamp", "sign"})
"""Ops that make each element of their result from the same element of each operand: the diagonal of their result
needs only the diagonal of what they read."""


def _diagonal_readers(graph: Graph, value: Site, depth: int = 4) -> list[Site] | None:
    """The ops that read a matrix where each reads only its diagonal, directly or through elementwise ops of the
    matrix's shape (a covariance scaled by 1/(n - 1) before its diagonal is taken), those ops included; None where
    some reader needs more than the diagonal."""
    readers = value_readers(graph, value)
    if not readers or depth <= 0:
        return None
    out = []
    for reader in readers:
        if _reads_diagonal(graph, reader, _operand_from(graph, reader, value)):
            out.append(reader)
            continue
        if reader.instruction.opcode not in ELEMENTWISE_OPCODES or reader.instruction.dims != value.instruction.dims:
            return None
        further = _diagonal_readers(graph, reader, depth - 1)
        if further is None:
            return None
        out += [reader, *further]
    return out


def _gram_axis(graph: Graph, product: Site) -> int | None:
    """Where a matmul multiplies an array by itself (X.T @ X, as jnp.cov and a Gram matrix make it): the axis of
    X it sums over; else None."""
    ins = product.instruction
    if len(ins.operands) < 2 or ins.operands[0] != ins.operands[1]:
        return None
    if ins.opcode == "dot" and ins.lhs_contracting:
        return ins.lhs_contracting[0]
    operand = graph.operand(product, 0)
    if operand is None or len(operand.instruction.dims) != 2:
        return None
    # a convolution that is a matmul keeps one dimension of each operand: the other is the one it sums over
    kept = [axis for axis, size in enumerate(operand.instruction.dims) if size in ins.dims]
    return 1 - kept[0] if len(kept) == 1 else None


@idiom("diagonal_of_product", "work_not_needed",
       "A full matrix product is computed to read only its diagonal",
       "compute only the diagonal at {line}: jnp.einsum('ij,ji->i', A, B) instead of jnp.diag(A @ B) "
       "(jnp.einsum('ij,ji->', A, B) instead of jnp.trace(A @ B); (A * B.T).sum(axis=1) is the same), so the "
       "{product} product is never formed",
       "element i of the diagonal of A @ B is row i of A times column i of B: n·k multiply-adds for the diagonal, "
       "where the full product does n·m·k and then drops all but n of its elements",
       gain=(0.75, 1.0), measured="docs/reference/measurements.md#diagonal-of-product",
       variants=(Variant((("covariance", (True,)),),
                         "compute the variances alone at {line}: jnp.var(x, axis={axis}, ddof=1) (jnp.std(x, "
                         "axis={axis}, ddof=1) for the standard deviations) instead of jnp.diag(jnp.cov("
                         "...)) and its square root, so the {product} covariance is never formed: one pass "
                         "over x"),
                 Variant((("gram", (True,)),),
                         "compute only the diagonal at {line}: jnp.sum(x * x, axis={axis}) instead of "
                         "jnp.diag(x.T @ x) (the diagonal of an array's product with itself is its squares summed along the axis the "
                         "product contracts), so the {product} product is never formed")))
def diagonal_of_product(program: Program) -> list[Match]:
    """A matmul whose every reader keeps only its diagonal (a gather of (i, i), or an identity mask), directly or
    through elementwise ops; its stake holds those readers' time too, which the change removes with it. A product of
    an array with itself (a covariance, a Gram matrix) is named as one: its diagonal is a sum of squares."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for product in _matmul_sites(graph):
            if not _plain_matmul(graph, product) or min(product.instruction.dims) < 64:
                continue
            readers = _diagonal_readers(graph, product)
            if readers is None:
                continue
            line, function = program.line_of(graph, product)
            ops, stake = timed_stake(program, graph, [product, *readers])
            dims = product.instruction.dims
            flops = matmul_flops(graph, product)
            ratio = elements(dims) / min(dims)
            operands = {o.instruction.name: o for o in (graph.origin(graph.operand(product, k)) for k in (0, 1))
                        if o is not None}
            # the diagonal alone: its multiply-adds, and one read of each operand
            needed = _needed_percent(program, graph, ops[0], flops=flops / ratio,
                                     hbm_bytes=sum(nbytes(o.instruction) for o in operands.values()))
            match = out.get((module_key, line or ops[0]))
            if match is not None:  # jnp.diag(A @ B) and jnp.trace(C @ D) on one line: one change
                if ops[0] not in match.ops:
                    match.ops += [op for op in ops if op not in match.ops]
                    match.stake_percent = min(match.stake_percent + stake, 100.0)
                    if needed is not None:
                        match.needed_percent = (match.needed_percent or 0.0) + needed
                    match.facts["products"] += 1
                continue
            shape = product.instruction.shape_text.split("{")[0]
            axis = _gram_axis(graph, product)
            covariance = axis is not None and "cov" in re.split(r"\W+", product.instruction.op_name or "")
            kind = "a covariance (an array times itself)" if covariance else \
                "an array times itself" if axis is not None else ""
            out[(module_key, line or ops[0])] = Match(
                "diagonal_of_product", stake,
                f"{opcode_name(product.instruction)} → {shape} ({flops / 1e9:.3g} GFLOP)"
                + (f", {kind} summed over its axis {axis}," if kind else "")
                + f" of which only the {min(dims)} diagonal elements are read ("
                + ", ".join(sorted({opcode_name(r.instruction) for r in readers})) + ")"
                + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function, needed_percent=needed,
                work_ratio=round(ratio, 1),
                params={"product": shape, **({"axis": axis, "gram": True, "covariance": covariance}
                                             if axis is not None else {})},
                facts={"flops_per_run": flops, "diagonal_elements": min(dims), "products": 1})
    for match in out.values():
        if match.facts["products"] > 1:
            match.what += f" (and {match.facts['products'] - 1} more such product(s) on the line)"
    return [m for m in out.values() if m.stake_percent >= MIN_STAKE_PERCENT]


def _operand_from(graph: Graph, reader: Site, value: Site) -> str:
    """The name of the reader's operand that is the value (through fusion parameters and re-shapes); "" if none."""
    for name in reader.instruction.operands:
        found = reader.computation.by_name.get(name)
        origin = graph.origin(Site(reader.computation, found)) if found is not None else None
        if origin is not None and origin.instruction is value.instruction:
            return name
    return ""


def _is_difference(site: Site) -> bool:
    """A subtraction, or the add XLA:TPU writes for one: a − b as a + (−b), the negation folded into b's constant or
    its fusion, the add still named for the framework's sub."""
    ins = site.instruction
    return ins.opcode == "subtract" or (ins.opcode == "add" and (ins.op_name or "").rsplit("/", 1)[-1] == "sub")


def _broadcast_pair(graph: Graph, site: Site | None, reduced: int) -> tuple[int, int] | None:
    """Where an elementwise op combines two arrays broadcast against each other, (N, D) against (M, D) to
    N×M×D, and the reduction after it runs over the D of `reduced` elements: (N, M); else None."""
    if site is None or not (site.instruction.opcode == "multiply" or _is_difference(site)) or \
            len(site.instruction.operands) != 2 or reduced < 2:
        return None
    made = elements(site.instruction.dims)
    left, right = (graph.origin(graph.operand(site, k)) for k in (0, 1))
    if left is None or right is None:
        return None
    a, b = elements(left.instruction.dims), elements(right.instruction.dims)
    if not (a < made and b < made and a * b == made * reduced and a % reduced == 0 and b % reduced == 0):
        return None
    return a // reduced, b // reduced


PAIRWISE_CHANGE = {
    "squared distance": "compute the distances at {line} with one matmul: (x ** 2).sum(-1)[:, None] + "
                        "(y ** 2).sum(-1)[None, :] - 2 * x @ y.T (clip at 0 before a square root) instead of "
                        "((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)",
    "dot product": "compute the similarities at {line} as one matmul: x @ y.T (jnp.einsum('nd,md->nm', x, y)) "
                   "instead of (x[:, None, :] * y[None, :, :]).sum(-1)",
}


@idiom("pairwise_broadcast_reduce", "work_not_needed",
       "Pairwise distances are built by broadcasting every pair and reducing",
       "{change}, so the {pairs} pairs are never formed and the work runs on the matrix unit",
       "broadcasting (N, 1, D) against (1, M, D) makes N·M·D elementwise values on the vector units before the sum "
       "over D keeps N·M of them; the same sums are one (N, D) × (D, M) matmul, which reads N·D + M·D and writes "
       "N·M elements",
       gain=(0.6, 1.0), measured="docs/reference/measurements.md#pairwise-broadcast-reduce")
def pairwise_broadcast_reduce(program: Program) -> list[Match]:
    """A sum over D of the products (or squared differences) of an (N, D) and an (M, D) array broadcast to
    N×M×D: a matmul, or the expansion of a squared distance into one."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "reduce" or len(ins.operands) != 2 or not ins.called or \
                    _reducer(graph, ins) != "add":
                continue
            value = graph.origin(graph.operand(site, 0))
            if value is None or value.instruction.opcode != "multiply" or len(value.instruction.operands) != 2:
                continue
            reduced = elements(tuple(value.instruction.dims[d] for d in ins.dimensions
                                     if d < len(value.instruction.dims)))
            elementwise = [value]
            pair = _broadcast_pair(graph, value, reduced)
            kind = "dot product"
            if pair is None and value.instruction.operands[0] == value.instruction.operands[1]:
                difference = graph.origin(graph.operand(value, 0))
                pair = _broadcast_pair(graph, difference, reduced) if difference is not None and \
                    _is_difference(difference) else None
                elementwise.append(difference)
                kind = "squared distance"
            if pair is None:
                continue
            n, m = pair
            if n * m < 4096:  # a few pairs cost little whatever builds them
                continue
            line, function = program.line_of(graph, value)
            ops, stake = timed_stake(program, graph, [site, *elementwise])
            if stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            itemsize = nbytes(value.instruction) / max(elements(value.instruction.dims), 1)
            built = n * m * reduced
            needed_elements = n * reduced + m * reduced + n * m
            pairs = f"{value.instruction.dtype}[{n},{m},{reduced}]"
            out[(module_key, line or ops[0])] = Match(
                "pairwise_broadcast_reduce", stake,
                f"{'a squared difference' if kind == 'squared distance' else 'a product'} of two arrays broadcast "
                f"against each other, ({n}, {reduced}) and ({m}, {reduced}), to {built:,} elements ({pairs}), then "
                f"summed over the {reduced} → {ins.shape_text.split('{')[0]}: the {kind}s of {n}×{m} pairs, "
                f"{built / needed_elements:.3g}× the {needed_elements:,} elements a matmul reads and writes"
                + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                needed_percent=_needed_percent(program, graph, ops[0], flops=2.0 * built,
                                               hbm_bytes=needed_elements * itemsize),
                work_ratio=round(built / needed_elements, 1),
                params={"change": PAIRWISE_CHANGE[kind].format(line=line or "the line that builds it"),
                        "pairs": pairs},
                facts={"kind": kind, "broadcast_elements": built, "matmul_elements": needed_elements})
    return list(out.values())


def _reducer(graph: Graph, ins) -> str:
    """The opcode a reduce combines its elements with (its computation's root): 'add', 'maximum', …"""
    called = graph.module.computations.get(ins.called[0]) if ins.called else None
    root = called.by_name.get(called.root) if called is not None else None
    return root.opcode if root is not None else ""


GRADIENT_OP = re.compile(r"(?<![a-z_])transpose\(")
"""JAX's name for the ops of a gradient's backward pass (the transpose of its linearised forward)."""
DIFFERENTIATED_OP = re.compile(r"(?<![a-z_])(jvp|linearize|transpose)\(")
"""JAX's names for any op of a differentiated function, forward or backward."""


def _matmul_signature(program: Program, graph: Graph, site: Site) -> tuple:
    """What a matmul computes, as two traces of the same code give it alike: its output's and operands' dimensions,
    its contraction and the user's line it was traced from (not their types: XLA:TPU may keep a product in bf16 in
    one program and in f32 in the other)."""
    ins = site.instruction
    operands = tuple(o.instruction.dims if o is not None else () for o in
                     (graph.operand(site, k) for k in range(len(ins.operands))))
    return ins.dims, operands, ins.lhs_contracting, program.line_of(graph, site)[0]


def _call_lines(graph: Graph, site: Site, other: Graph, other_site: Site) -> tuple[str, str]:
    """The user's lines that call each of two programs traced from the same code: the first frames, from the
    outermost in, where the two instructions' Python stacks part."""
    mine, theirs = graph.module.stack(site.instruction), other.module.stack(other_site.instruction)
    common = 0
    while common < min(len(mine), len(theirs)) and mine[-1 - common] == theirs[-1 - common]:
        common += 1
    if common >= min(len(mine), len(theirs)):
        return "", ""
    lines = []
    for stack in (mine[:len(mine) - common], theirs[:len(theirs) - common]):
        source = source_of_stack(stack[-1:])
        lines.append(source.user.short if source is not None and source.user is not None else "")
    return lines[0], lines[1]


@idiom("forward_computed_twice", "work_not_needed",
       "The loss is computed in one call and again inside its gradient's call",
       "compute the loss and its gradient in one call: loss, grads = jax.value_and_grad({function})(params, ...) "
       "(jax.value_and_grad(f, has_aux=True) where it returns more) replaces the call at {line} and the one at "
       "{gradient_line}, so the forward pass runs once per step instead of twice",
       "jax.grad runs the forward pass to differentiate it, and value_and_grad returns that pass's value: a separate "
       "call for the loss computes the same forward again (a premise the profile shows as the same matmuls from the "
       "same lines in both programs, each run every step; that both calls read the same batch and parameters is the "
       "program's to confirm)",
       gain=(0.6, 0.9), measured="docs/reference/measurements.md#forward-computed-twice")
def forward_computed_twice(program: Program) -> list[Match]:
    """A program with no gradient in it whose every matmul (shapes, contraction, the user's line) is also one of
    another program's differentiated forward, that other program computing a gradient, both run as often per step."""
    per_step = dict(calls_per_step_of(program))
    modules = []
    for graph in program.graphs:
        key = program.module_key(graph.module)
        sites = list(_matmul_sites(graph))
        if per_step.get(key, 0) < 1 or not sites:
            continue
        names = [s.instruction.op_name or "" for s in sites]
        modules.append((graph, key, sites, names))
    out = []
    for graph, key, sites, names in modules:
        if any(DIFFERENTIATED_OP.search(n) for n in names):
            continue  # a gradient's program: its forward is needed
        signatures = [_matmul_signature(program, graph, s) for s in sites]
        for other, other_key, other_sites, other_names in modules:
            if other_key == key or abs(per_step[other_key] - per_step[key]) >= 0.5 or \
                    not any(GRADIENT_OP.search(n) for n in other_names):
                continue
            forward = [(_matmul_signature(program, other, s), s) for s, n in zip(other_sites, other_names)
                       if not GRADIENT_OP.search(n)]
            unmatched = [f for f, _ in forward]
            for signature in signatures:
                if signature not in unmatched:
                    break
                unmatched.remove(signature)
            else:
                ms = sum(v for (m, _), v in program.op_ms.items() if m == key)
                stake = program.step_percent(ms)
                if stake < MIN_STAKE_PERCENT:
                    break
                lead = max(sites, key=lambda s: program.time_ms(graph.module, [graph.timed_op(s)]))
                twin = next(s for f, s in forward if f == _matmul_signature(program, graph, lead))
                line, gradient_line = _call_lines(graph, lead, other, twin)
                inner_line, function = program.line_of(graph, lead)
                flops = sum(matmul_flops(graph, s) for s in sites)
                other_flops = sum(matmul_flops(other, s) for s in other_sites)
                out.append(Match(
                    "forward_computed_twice", stake,
                    f"the program {key} computes no gradient and runs {len(sites)} matmul(s) ({flops / 1e9:.3g} "
                    f"GFLOP per call), each also in the forward pass of {other_key}, which computes a gradient; both "
                    f"run {per_step[key]:g} time(s) per step" + (f", called at {line} and {gradient_line}" if line
                                                                 else "")
                    + (f" (the matmuls at {inner_line})" if inner_line else ""),
                    module=key, ops=sorted({op for (m, op) in program.op_ms if m == key})[:16],
                    line=line or inner_line, function=function, needed_percent=0.0,
                    work_ratio=round((flops + other_flops) / other_flops, 2) if other_flops else None,
                    params={"function": function or "loss_fn", "gradient_line": gradient_line or other_key},
                    facts={"gradient_program": other_key, "forward_matmuls": len(sites),
                           "forward_flops_per_call": flops, "gradient_flops_per_call": other_flops}))
                break
    return out


def _arg_reduce(graph: Graph, site: Site) -> str | None:
    """'argmax' for a reduce that carries an iota's indices along with the values (jnp.argmax, jnp.argmin),
    'max' for a reduce by maximum, else None."""
    ins = site.instruction
    if ins.opcode != "reduce":
        return None
    if len(ins.operands) == 4:
        indices = graph.origin(graph.operand(site, 1))
        return "argmax" if indices is not None and indices.instruction.opcode == "iota" and \
            indices.instruction.dimensions == ins.dimensions else None
    return "max" if len(ins.operands) == 2 and _reducer(graph, ins) == "maximum" else None


def _softmax(graph: Graph, value: Site | None) -> tuple[Site, Site] | None:
    """Where a value is a softmax, exp(x - max) divided (or multiplied by one over) its sum: (the exponential, the
    sum); else None."""
    if value is None or value.instruction.opcode not in ("divide", "multiply") or len(value.instruction.operands) != 2:
        return None
    for k in (0, 1):
        exp, norm = graph.origin(graph.operand(value, k)), graph.origin(graph.operand(value, 1 - k))
        if exp is None or norm is None or exp.instruction.opcode != "exponential" or \
                exp.instruction.dims != value.instruction.dims or (value.instruction.opcode == "divide" and k != 0):
            continue
        if norm.instruction.opcode == "divide" and value.instruction.opcode == "multiply":  # times 1 / sum
            norm = graph.origin(graph.operand(norm, 1))
        if norm is not None and norm.instruction.opcode == "reduce" and _reducer(graph, norm.instruction) == "add":
            summed = graph.origin(graph.operand(norm, 0))
            # XLA:TPU recomputes the exponentials in each fusion that reads them: the sum's are another instance
            if summed is not None and summed.instruction.opcode == "exponential" and \
                    summed.instruction.dims == exp.instruction.dims:
                return exp, norm
    return None


def _full_passes(graph: Graph, ops: list[str], size: int) -> int:
    """How many arrays of at least `size` elements the timed ops read and write together."""
    passes = 0
    for op in ops:
        found = graph.module.find(op)
        if found is None:
            continue
        computation, ins = found
        shapes = [d for _, d in ins.tuple_shapes] if ins.tuple_shapes else [ins.dims]
        operands = [computation.by_name[o].dims for o in dict.fromkeys(ins.operands) if o in computation.by_name]
        passes += sum(1 for dims in shapes + operands if elements(dims) >= size)
    return passes


def _logits_written_for(graph: Graph, exp: Site, readers: set[str]) -> Site | None:
    """Where the array a softmax exponentiates (x in exp(x - max)) is a matmul's result that the matmul's own fusion
    already reduces (the softmax's row max taken there) and writes out only for the softmax's passes to read: that
    matmul; else None. An argmax of the logits joins such a fusion, so the logits are then never written."""
    shifted = graph.origin(graph.operand(exp, 0))
    if shifted is None or shifted.instruction.opcode != "subtract":
        return None
    value = graph.origin(graph.operand(shifted, 0))
    if value is None or value.instruction.opcode != "get-tuple-element":
        return None
    made = graph.operand(value, 0)
    if made is None or made.instruction.opcode != "fusion" or not made.instruction.called:
        return None
    if any(graph.timed_op(u) not in readers for u in graph.users(value)):
        return None  # the logits are read elsewhere too: written whatever the softmax does
    called = graph.module.computations.get(made.instruction.called[0])
    root = called.by_name.get(called.root) if called is not None else None
    index = value.instruction.tuple_index
    if root is None or root.opcode != "tuple" or not 0 <= index < len(root.operands):
        return None
    matmul = graph.origin(Site(called, called.by_name[root.operands[index]]))
    if matmul is None or matmul.instruction.opcode not in MATMUL_OPCODES:
        return None
    reduced = any(u.instruction.opcode == "reduce" for u in graph.users(matmul))
    return Site(made.computation, made.instruction) if reduced else None


@idiom("softmax_for_argmax", "work_not_needed",
       "A softmax is computed only for its largest entry to be read",
       "{change}",
       "softmax is increasing along its axis, so its argmax is the logits' argmax: the exponentials, their sum and "
       "the division are work the index does not need (the largest probability alone is exp(max - logsumexp))",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#softmax-for-argmax")
def softmax_for_argmax(program: Program) -> list[Match]:
    """A softmax (exp, its sum, the division) whose every reader is an argmax or max reduction."""
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            kind = _arg_reduce(graph, site)
            value = graph.origin(graph.operand(site, 0)) if kind else None
            found = _softmax(graph, value)
            if found is None or elements(value.instruction.dims) < 4096:
                continue
            readers = value_readers(graph, value)
            kinds = {_arg_reduce(graph, r) for r in readers}
            if None in kinds:
                continue  # the probabilities are read as they are too: they are needed
            exp, total = found
            reduce_op = graph.timed_op(site)
            softmax_ops = [op for op in dict.fromkeys(graph.timed_op(s) for s in (exp, total, value))
                           if op != reduce_op]
            # every pass over the array after the logits is the softmax's (the argmax's pass reads probabilities);
            # the index needs one read of the logits, or none where their matmul's fusion can take the argmax
            written = _logits_written_for(graph, exp, {*softmax_ops, reduce_op})
            size = elements(value.instruction.dims)
            logits_bytes = size * DTYPE_BYTES.get(value.instruction.dtype, 4)
            runs = program.runs.get((module_key, reduce_op), 0)
            one_pass_ms = (program.roof_ms(hbm_bytes=logits_bytes) or 0.0) * runs
            stake = program.step_percent(program.time_ms(graph.module, softmax_ops + [reduce_op])
                                         + (one_pass_ms if written is not None else 0.0))
            needed = None if written is not None else program.step_percent(one_pass_ms)
            line, function = program.line_of(graph, site)
            if stake < MIN_STAKE_PERCENT or (module_key, line or reduce_op) in out:
                continue
            passes = _full_passes(graph, list(dict.fromkeys(softmax_ops + [reduce_op])), size)
            axis = site.instruction.dimensions[0] if site.instruction.dimensions else -1
            at = line or "the line that reads it"
            change = (f"take the argmax of the logits at {at}: jnp.argmax(logits, axis={axis}) instead of "
                      f"jnp.argmax(jax.nn.softmax(logits, axis={axis}), axis={axis}), the same index"
                      if "argmax" in kinds else f"read the largest probability at {at} without the probabilities: "
                      f"jnp.exp(jnp.max(logits, axis={axis}) - jax.nn.logsumexp(logits, axis={axis}))")
            if "max" in kinds or _reads_value(graph, site):
                change += (f"; where its largest probability is read too, jnp.exp(jnp.max(logits, axis={axis}) - "
                           f"jax.nn.logsumexp(logits, axis={axis})) gives it")
            softmax_line = program.line_of(graph, exp)[0]
            out[(module_key, line or reduce_op)] = Match(
                "softmax_for_argmax", stake,
                f"a softmax over {value.instruction.shape_text.split('{')[0]} (exponential, sum along dimension "
                f"{axis}, {value.instruction.opcode})" + (f" at {softmax_line}" if softmax_line else "")
                + f" is read only by {' and '.join(sorted(kinds))} reduction(s)" + (f" at {line}" if line else "")
                + f": {passes} passes over the array where the {'index' if 'argmax' in kinds else 'maximum'} "
                + ("needs one over the logits" if written is None else
                   f"needs none: the op that makes the logits, {graph.computes(written)}, already reduces them "
                   "and writes them out only for these passes"),
                module=module_key, ops=softmax_ops + [reduce_op], line=line, function=function,
                needed_percent=needed, work_ratio=float(passes),
                params={"change": change},
                facts={"reads": sorted(kinds), "array_passes": passes, "softmax_line": softmax_line},
                cites=[written.instruction.name] if written is not None else [])
    return list(out.values())


def _reads_value(graph: Graph, site: Site) -> bool:
    """Whether the values an argmax reduce carries (its first output, the maximum) are read, not only the index."""
    outer = _outer(graph, site)
    return any(u.instruction.opcode == "get-tuple-element" and u.instruction.tuple_index == 0
               for u in (Site(outer.computation, i) for i in outer.computation.users.get(outer.instruction.name, [])))


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
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#contraction-as-multiply-reduce")
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
            ops, stake = timed_stake(program, graph, [site, product])
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


def _matmul_batch(graph: Graph, site: Site) -> int:
    """A batched matmul's batch size: a dot's batch dimensions; for a convolution that is a matrix product (XLA:TPU
    writes a batched matmul's batch as kernel spatial dimensions its window spans whole over a base-dilated input, a
    contraction as ones it spans whole to one output position, and the profile keeps no dimension numbers beyond the
    kernel's), the one split of the kernel's spatial dimensions into batch and contracted that its shapes hold:
    |lhs|·|rhs| = batch · |out| · K², K the kernel's input features times its contracted spatial sizes. 0 where it has
    no batch, or no single split holds."""
    ins = site.instruction
    lhs, rhs = graph.operand(site, 0), graph.operand(site, 1)
    if lhs is None or rhs is None:
        return 0
    if ins.opcode == "dot":
        dims = lhs.instruction.dims
        return elements(tuple(dims[d] for d in ins.lhs_batch if d < len(dims))) if ins.lhs_batch else 0
    kernel = rhs.instruction.dims
    if ins.opcode != "convolution" or not ins.conv_is_matrix_product or not ins.conv_kernel_dims \
            or any(d >= len(kernel) for d in ins.conv_kernel_dims):
        return 0
    features, spatial = kernel[ins.conv_kernel_dims[0]], [kernel[d] for d in ins.conv_kernel_dims[1:]]
    product, out = elements(lhs.instruction.dims) * elements(rhs.instruction.dims), elements(ins.dims)
    batches = set()
    for split in itertools.product((True, False), repeat=len(spatial)):
        batch = elements(tuple(n for n, batched in zip(spatial, split) if batched))
        contracted = features * elements(tuple(n for n, batched in zip(spatial, split) if not batched))
        if product == batch * out * contracted ** 2:
            batches.add(batch)
    return batches.pop() if len(batches) == 1 and min(batches) > 1 else 0


def _broadcast_operands(graph: Graph):
    """Every batched matmul's operand made by broadcasting a smaller array whole a number of times."""
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode not in MATMUL_OPCODES or len(ins.operands) != 2:
            continue
        batch = _matmul_batch(graph, site)
        if not batch:
            continue
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
                     "grouped: jax.lax.ragged_dot or a grouped matmul over the distinct copies only",),
       variants=(Variant((("platform", ("TPU",)), ("tile_written", (False,))),
                         withheld="on a TPU v5e sharing the weights changed nothing measurable where XLA did not "
                                  "write the tile out: a linear layer over 128 examples of 64 tokens (width 1,024, "
                                  "bfloat16) whose weights were tiled 128 times took 0.170 and 0.179 ms a step in two "
                                  "captures as written and 0.179 ms with x @ w; its 256 MiB tile would take longer "
                                  "than that whole step to write at the chip's memory bandwidth "
                                  "(docs/reference/measurements.md#weights-tiled-on-a-tpu; one program measured)"),))
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
            ops, stake = timed_stake(program, graph, [site, tiled])
            if stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            x = graph.operand(site, 1 - position)
            x_bytes = nbytes(x.instruction) if x is not None else 0
            done = x_bytes + weight_bytes * batch + nbytes(ins)
            needed = x_bytes + weight_bytes + nbytes(ins)
            weights = source.instruction.shape_text.split("{")[0]
            spec = "bnk,km->bnm" if position == 1 else "km,bmn->bkn"
            # the tile is an op of its own that takes time: written out, not read in place by the matmul
            written = graph.timed_op(tiled) != graph.timed_op(site) and \
                program.time_ms(graph.module, [graph.timed_op(tiled)]) > 0
            out[(module_key, line or ops[0])] = Match(
                "weights_tiled_per_example", stake,
                f"{ins.opcode} {graph.operand(site, 0).instruction.shape_text.split('{')[0]} × "
                f"{graph.operand(site, 1).instruction.shape_text.split('{')[0]} over a batch of {batch}, whose "
                f"{'rhs' if position else 'lhs'} is {weights} "
                f"({weight_bytes / 2**20:.3g} MiB) broadcast {batch} times along the batch: the same weights "
                f"read once per example, {done / needed:.3g}× the bytes the matmul needs"
                + (f", at {line}" if line else ""),
                module=module_key, ops=ops, line=line, function=function,
                needed_percent=_needed_percent(program, graph, ops[0], flops=0.0, hbm_bytes=needed),
                # a tile XLA:TPU reads in place costs no bytes of the device's memory per copy: the chip measured
                # no gain from sharing it, so the copies' bytes are no work the report can count
                work_ratio=None if program.platform == "TPU" and not written else round(done / needed, 1),
                params={"spec": spec, "weights": weights, "batch": batch,
                        "tiled": operand.instruction.shape_text.split("{")[0], "tile_written": written},
                facts={"batch": batch, "weight_bytes": weight_bytes, "tiled_bytes": weight_bytes * batch})
    return list(out.values())


MAX_HEAD_REPEAT = 64
"""Query heads per key/value head beyond this are no grouped-query attention's (a broadcast along a longer new
dimension is a contraction's own, written as a multiply and a sum)."""


def _repeats_into_multiply_reduce(graph: Graph):
    """(the sum, the repeat broadcast, its source, the broadcast's result, copies) for each sum of a product one of
    whose factors is an array of a MiB or more repeated 2–MAX_HEAD_REPEAT times along one new dimension after its
    first (written out by an op of its own, or made inside the sum's fusion)."""
    for site in graph.sites():
        ins = site.instruction
        if ins.opcode != "reduce" or len(ins.operands) != 2 or _reducer(graph, ins) != "add":
            continue
        product = graph.origin(graph.operand(site, 0))
        if product is None or product.instruction.opcode != "multiply":
            continue
        for k in (0, 1):
            made = _broadcast_into(graph, graph.operand(product, k))
            source = graph.operand(made, 0) if made is not None else None
            if source is None:
                continue
            out_dims, kept = made.instruction.dims, tuple(made.instruction.dimensions)
            new = [d for d in range(len(out_dims)) if d not in kept]
            if len(new) != 1 or kept != tuple(d for d in range(len(out_dims)) if d != new[0]) or new[0] == 0 \
                    or not 2 <= out_dims[new[0]] <= MAX_HEAD_REPEAT or nbytes(source.instruction) < 1 << 20:
                continue
            yield site, made, source, made, out_dims[new[0]]


@idiom("repeated_kv_heads", "work_not_needed",
       "Key and value heads are repeated to the query heads before attention (grouped-query attention)",
       "contract the grouped heads at {line} without repeating them: reshape the queries to (batch, seq, "
       "kv_heads, {repeat}, head_dim) and jnp.einsum('bqgrd,bkgd->bgrqk', q, k) (and 'bgrqk,bkgd->bqgrd' with "
       "the values) instead of jnp.repeat(k, {repeat}, axis=2) before the attention einsum, so each key and value "
       "head is read once for its {repeat} query heads",
       "repeating the key and value heads writes (and the attention matmuls then read) a copy of the keys and "
       "values for every query head of a group; a grouped einsum reads each key and value head once, and the "
       "matmul is the same size",
       gain=(0.15, 0.25), measured="docs/reference/measurements.md#repeated-kv-heads",
       alternatives=("jax.nn.dot_product_attention(q, k, v) takes fewer key/value heads than query heads (a "
                     "multiple) without repeating them",),
       variants=(Variant((("form", ("multiply_reduce",)),),
                         change="contract the grouped heads at {line} without repeating them: group the queries "
                                "per key/value head, qg = q.reshape(q.shape[0], {kv_heads}, {repeat}, {head_dim}), "
                                "and contract them with the cache directly, s = jnp.einsum('bgrd,bgtd->bgrt', qg, k) "
                                "and jnp.einsum('bgrt,bgtd->bgrd', p, v).reshape(q.shape) for the values, instead of "
                                "jnp.repeat(k, {repeat}, axis={axis}) (and v) before the attention, so the cache is "
                                "read once for its {repeat} query heads and never copied",
                         gain=(0.9, 1.0), measured="docs/reference/measurements.md#repeated-kv-heads-decode"),))
def repeated_kv_heads(program: Program) -> list[Match]:
    """Batched dots one of whose operands is a broadcast of a smaller array along part of the batch dimensions
    (r copies, 2 ≤ r < the batch): keys or values repeated to the query heads of their group. A broadcast along the
    whole batch is weights_tiled_per_example's. With one query per sequence (decoding) XLA writes the attention's
    contractions as a multiply and a sum: there the repeat is a broadcast inserting one short dimension after the
    heads of an array of a MiB or more, that such a multiply reads."""
    out: dict[str, Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        found_here = [(f.dot, f.broadcast, f.source, f.operand, f.copies, "dot") for f in _broadcast_operands(graph)
                      if 2 <= f.copies < f.batch and not f.batch % f.copies and nbytes(f.operand.instruction) >= 1 << 20]
        found_here += [(*found, "multiply_reduce") for found in _repeats_into_multiply_reduce(graph)]
        for reader, broadcast, source, operand, repeat, form in found_here:
            ops, _ = timed_stake(program, graph, [reader, broadcast])
            line, function = program.line_of(graph, broadcast)
            match = out.get(module_key)
            if match is None:
                dims = source.instruction.dims
                axis = next(d for d in range(len(operand.instruction.dims)) if d not in broadcast.instruction.dimensions) \
                    if form == "multiply_reduce" else 0
                params = {"repeat": repeat, "form": form}
                if form == "multiply_reduce":
                    params.update(axis=axis - 1, kv_heads=dims[axis - 1], head_dim=dims[-1])
                match = out[module_key] = Match(
                    "repeated_kv_heads", 0.0, "", module=module_key, line=line, function=function,
                    params=params, facts={"repeat": repeat, "repeated": [], "copy_bytes": 0})
            fresh = [op for op in ops if op not in match.ops]
            match.ops.extend(fresh)
            match.stake_percent = min(match.stake_percent + program.step_percent(
                program.time_ms(graph.module, fresh)), 100.0)
            if form == "multiply_reduce":
                if broadcast.instruction.name in match.facts.setdefault("read", {}):
                    continue  # one repeat read by both the scores' sum and another
                # the grouped contraction still reads each repeated array once a run: what the result needs
                source = graph.origin(source) or source  # the array as stored, before a cast inside the sum
                match.facts["read"][broadcast.instruction.name] = nbytes(source.instruction) * program.runs.get(
                    (module_key, graph.timed_op(broadcast)), 1)
            match.facts["repeated"].append(
                f"{source.instruction.shape_text.split('{')[0]} → {operand.instruction.shape_text.split('{')[0]}")
            if graph.timed_op(broadcast) != graph.timed_op(reader):  # written out, not made inside the reader
                match.facts["copy_bytes"] += nbytes(operand.instruction)
    matches = []
    for match in out.values():
        if match.stake_percent < MIN_STAKE_PERCENT:
            continue
        read = match.facts.pop("read", None)
        if read:
            needed_ms = program.roof_ms(hbm_bytes=sum(read.values()))
            match.needed_percent = program.step_percent(needed_ms) if needed_ms is not None else None
        repeat = match.params["repeat"]
        match.work_ratio = float(repeat)
        match.what = (f"{len(match.facts['repeated'])} operand(s) of batched attention matmuls"
                      + (" (written by XLA as a multiply and a sum, one query per sequence)"
                         if match.params["form"] == "multiply_reduce" else "") + f" repeated {repeat} "
                      f"times along a batch dimension ({'; '.join(match.facts['repeated'][:2])}): "
                      f"{match.facts['copy_bytes'] / 2**20:.3g} MiB of copies of key/value heads, each head read "
                      f"{repeat}× where once does" + (f", at {match.line}" if match.line else ""))
        matches.append(match)
    return matches


BAND_KEPT_MAX = 0.25
"""A positional mask that keeps more of the scores than this is left alone: a causal mask alone keeps half of them,
and a flash kernel's own block skipping (the materialised-attention finding's change) is what serves it."""
BAND_MIN_SIDE = 256
"""A score matrix with a side shorter than this costs little to compute whole."""
BAND_SAMPLE_ROWS = 512
"""Rows of the mask evaluated to count what it keeps (evenly spaced; each row whole)."""
_MASK_ARITHMETIC = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "and": np.logical_and,
                    "or": np.logical_or, "maximum": np.maximum, "minimum": np.minimum}
_COMPARE = {"LT": np.less, "LE": np.less_equal, "GT": np.greater, "GE": np.greater_equal, "EQ": np.equal,
            "NE": np.not_equal}


def _positional(graph: Graph, site: Site | None, rows: np.ndarray, cols: np.ndarray, depth: int = 2 * DEPTH):
    """A mask (or the positions it compares) built only from iotas over its last two dimensions and integer
    constants, evaluated at (rows, cols) of those dimensions; None where any part of it is read from data (a padding
    mask, lengths) or spans another dimension."""
    if site is None or depth <= 0:
        return None
    ins = site.instruction
    if ins.opcode in ("fusion", "parameter"):  # a fusion's result is its root, its parameter the caller's operand
        return _positional(graph, graph.producer(site), rows, cols, depth - 1)
    if ins.opcode in ("convert", "copy", "bitcast"):
        return _positional(graph, graph.operand(site, 0), rows, cols, depth - 1)
    if ins.opcode == "constant":
        return ins.integer_value if not ins.dims else None
    if ins.opcode == "broadcast":
        source = graph.operand(site, 0)
        if source is None:
            return None
        if not source.instruction.dims:
            return _positional(graph, source, rows, cols, depth - 1)
        if len(source.instruction.dims) == 2 and ins.dimensions == (len(ins.dims) - 2, len(ins.dims) - 1):
            return _positional(graph, source, rows, cols, depth - 1)  # one mask for every batch and head
        # a vector iota broadcast along the mask: the dimension it lands on is its own
        if len(source.instruction.dims) == 1 and graph.origin(source).instruction.opcode == "iota" and \
                len(ins.dimensions) == 1 and ins.dimensions[0] >= len(ins.dims) - 2:
            return rows if ins.dimensions[0] == len(ins.dims) - 2 else cols
        return None
    if ins.opcode == "iota":
        if len(ins.dims) < 2 or not ins.dimensions or ins.dimensions[0] < len(ins.dims) - 2:
            return None
        return rows if ins.dimensions[0] == len(ins.dims) - 2 else cols
    if ins.opcode == "compare" and ins.comparison in _COMPARE or ins.opcode in _MASK_ARITHMETIC:
        values = [_positional(graph, graph.operand(site, k), rows, cols, depth - 1) for k in (0, 1)]
        if any(v is None for v in values):
            return None
        return (_COMPARE[ins.comparison] if ins.opcode == "compare" else _MASK_ARITHMETIC[ins.opcode])(*values)
    if ins.opcode == "not":
        value = _positional(graph, graph.operand(site, 0), rows, cols, depth - 1)
        return None if value is None else np.logical_not(value)
    return None


def _band_fraction(graph: Graph, mask: Site, sides: tuple[int, int]) -> float | None:
    """The share of a (queries × keys) score matrix a positional mask keeps, counted on evenly spaced whole rows;
    None where the mask is not positional."""
    queries, keys = sides
    rows = np.unique(np.linspace(0, queries - 1, min(queries, BAND_SAMPLE_ROWS)).astype(np.int64))[:, None]
    cols = np.arange(keys, dtype=np.int64)[None, :]
    kept = _positional(graph, mask, rows, cols)
    if kept is None or np.ndim(kept) == 0 or np.asarray(kept).dtype != bool:
        return None
    return float(np.broadcast_to(kept, (len(rows), keys)).mean())


def _from_matmul(graph: Graph, site: Site | None, depth: int = DEPTH) -> Site | None:
    """The matmul a value is computed from through elementwise scaling (scores q·kᵀ / √d), or None."""
    while site is not None and depth > 0:
        depth -= 1
        site = graph.origin(site)
        if site is None:
            return None
        ins = site.instruction
        if ins.opcode in MATMUL_OPCODES:
            return site if ins.opcode == "dot" or ins.conv_is_matrix_product else None
        if ins.opcode not in ("multiply", "divide", "add", "subtract") or len(ins.operands) != 2:
            return None
        # follow the operand that is not one value broadcast (the scale)
        site = next((graph.operand(site, k) for k in (0, 1) if not graph._constant(graph.operand(site, k))), None)
    return None


@idiom("masked_band_of_scores", "work_not_needed",
       "Attention scores are computed for every query and key, and a positional mask keeps only a narrow band",
       "compute the scores at {line} block by block, each block of {window} queries against its own and the "
       "previous block of keys: q.reshape(b, t // {window}, {window}, h, d) and the keys and values likewise, "
       "kk = jnp.concatenate([jnp.pad(kb, ((0, 0), (1, 0), (0, 0), (0, 0), (0, 0)))[:, :-1], kb], axis=2) (the "
       "values the same), s = jnp.einsum('bnqhd,bnkhd->bnhqk', qb, kk), the same mask applied on each block's "
       "positions, then the softmax and jnp.einsum('bnhqk,bnkhd->bnqhd', p, vv).reshape(b, t, h, d): "
       "{blocked_percent:g}% of the score entries instead of all of them",
       "the mask is built from positions alone (iotas compared with an offset), so which scores it drops is known "
       "before any is computed: the score matmul, the softmax and the probability-value matmul over the whole "
       "matrix do the work and traffic of every query-key pair, many times what the band it keeps needs, "
       "where blocks of queries scored against the keys their band reaches compute only those. Measured on one "
       "program (a 256-wide causal window over 4,096 positions, bfloat16, TPU v5e)",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#a-band-mask-over-full-attention-scores",
       alternatives=("on a TPU, splash attention with a local mask skips the blocks the band leaves out: "
                     "jax.experimental.pallas.ops.tpu.splash_attention's LocalMask((seq_len, seq_len), "
                     "window_size=(window - 1, 0), offset=0) in a MultiHeadMask, with make_splash_mha (its premise: "
                     "block sizes that divide the sequence, and head_dim a multiple of 128 runs best)",
                     "jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(window - 1, 0)) "
                     "states the band, but only a kernel that skips masked blocks gains from it (the cuDNN one on a "
                     "GPU); XLA's own implementation still computes every score"))
def masked_band_of_scores(program: Program) -> list[Match]:
    out: dict[tuple[str, str], Match] = {}
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode != "select" or len(ins.operands) != 3 or len(ins.dims) < 2 or \
                    min(ins.dims[-2:]) < BAND_MIN_SIDE or ins.dtype not in ("f32", "bf16", "f16"):
                continue
            filled = [k for k in (1, 2) if graph._constant(graph.operand(site, k))]
            scores = _from_matmul(graph, graph.operand(site, 3 - filled[0])) if len(filled) == 1 else None
            if scores is None:
                continue
            if not _feeds_exponential(graph, site):  # attention's scores go to a softmax; a masked diagonal does not
                continue
            sides = (ins.dims[-2], ins.dims[-1])
            kept = _band_fraction(graph, graph.operand(site, 0), sides)
            if kept is not None and filled[0] == 1:  # the mask picks the fill value where it holds: it keeps the rest
                kept = 1.0 - kept
            if kept is None or not 0 < kept <= BAND_KEPT_MAX:
                continue
            # the ops over the whole score matrix: the scores' matmul, the mask, the softmax, the probability matmul
            square = [s for s in graph.sites() if tuple(s.instruction.dims[-2:]) == sides and
                      len(s.instruction.dims) >= 2 or s.instruction.opcode in MATMUL_OPCODES and any(
                          tuple(o.instruction.dims[-2:]) == sides for o in
                          filter(None, (graph.operand(s, k) for k in range(len(s.instruction.operands)))))]
            ops, stake = timed_stake(program, graph, square)
            ops = [op for op in ops if (module_key, op) in program.op_ms]
            line, function = program.line_of(graph, scores)
            if not line:  # a matmul fused with no stack of its own (XLA:CPU): the mask's line
                line, function = program.line_of(graph, site)
            if stake < MIN_STAKE_PERCENT or (module_key, line or ops[0]) in out:
                continue
            # the band's width: the most keys a query keeps (a sampled row's count)
            window = _band_width(graph, site, sides, filled[0])
            block = max(window, 1)
            blocked = min(2.0 * block / sides[1], 1.0)
            out[(module_key, line or ops[0])] = Match(
                "masked_band_of_scores", stake,
                f"a {'×'.join(map(str, ins.dims))} {ins.dtype} score matrix ({opcode_text(scores)} of the queries "
                f"and keys) is masked by positions alone (iotas compared with an offset), keeping {kept:.3g} of its "
                f"entries, a band of at most {window:,} keys per query"
                + (f", at {line}" if line else "") + f"; the ops over the whole matrix hold {stake:g}% of the step",
                module=module_key, ops=ops[:16], line=line, function=function,
                needed_percent=stake * kept, work_ratio=round(1.0 / kept, 1),
                params={"window": block, "window_left": max(block - 1, 0), "queries": sides[0], "keys": sides[1],
                        "kept_fraction": kept, "blocked_percent": round(100 * blocked, 1)},
                facts={"kept_fraction": round(kept, 4), "band_keys": window, "scores": ins.shape_text.split("{")[0]})
    return list(out.values())


def _feeds_exponential(graph: Graph, site: Site, hops: int = 4) -> bool:
    """Whether the value reaches an exponential within a few ops (a softmax's exp(x - max))."""
    def out_of_fusion(current: Site) -> list[Site]:  # a fusion's result is read where the fusion is
        caller = graph.callers.get(current.computation.name)
        return [current, caller] if caller is not None and current.instruction.name == current.computation.root \
            else [current]

    frontier = [site]
    for _ in range(hops):
        frontier = [user for current in frontier for here in out_of_fusion(current) for user in graph.users(here)]
        if any(user.instruction.opcode == "exponential" for user in frontier):
            return True
    return False


def _band_width(graph: Graph, select: Site, sides: tuple[int, int], fill_position: int) -> int:
    """The most keys any one query keeps, over evenly spaced rows of the mask."""
    rows = np.unique(np.linspace(0, sides[0] - 1, min(sides[0], BAND_SAMPLE_ROWS)).astype(np.int64))[:, None]
    kept = np.broadcast_to(_positional(graph, graph.operand(select, 0), rows, np.arange(sides[1])[None, :]),
                           (len(rows), sides[1]))
    kept = ~kept if fill_position == 1 else kept
    return int(kept.sum(axis=1).max())


def opcode_text(site: Site) -> str:
    return "a matmul" if site.instruction.opcode == "dot" or site.instruction.conv_is_matrix_product else \
        site.instruction.opcode


PREFIX_MIN_POSITIONS = 16
"""A loop that reruns its model over fewer positions than this recomputes little per trip."""


def _body_op(graph: Graph, site: Site, body) -> Site | None:
    """The instruction of a loop body that runs this one: itself, or the body's fusion that holds it."""
    seen = set()
    while site.computation is not body and site.computation.name not in seen:
        seen.add(site.computation.name)
        caller = graph.callers.get(site.computation.name)
        if caller is None:
            return None
        site = caller
    return site if site.computation is body else None


def _upstream(computation, start: str) -> set[str]:
    """Every instruction of the computation whose value `start` reads, directly or through others."""
    out, frontier = set(), [start]
    while frontier:
        ins = computation.by_name.get(frontier.pop())
        for name in ins.operands if ins is not None else ():
            if name not in out:
                out.add(name)
                frontier.append(name)
    return out


def _position_pick(graph: Graph, site: Site) -> tuple[int, int] | None:
    """(axis, positions) where a dynamic-slice keeps one position of an axis of at least PREFIX_MIN_POSITIONS at an
    index the program computes (not a constant): h[:, t - 1] at a loop's index; None otherwise."""
    ins = site.instruction
    source = graph.operand(site, 0)
    if ins.opcode != "dynamic-slice" or source is None or len(source.instruction.dims) != len(ins.dims):
        return None
    for axis, (kept, whole) in enumerate(zip(ins.dims, source.instruction.dims)):
        start = graph.origin(graph.operand(site, 1 + axis))
        if kept == 1 and whole >= PREFIX_MIN_POSITIONS and start is not None and \
                start.instruction.opcode != "constant":
            return axis, whole
    return None


def _loop_bodies(graph: Graph):
    """(while loop, its body) for each while loop of the module."""
    for site in graph.sites():
        if site.instruction.opcode == "while" and site.instruction.called:
            body = graph.module.computations.get(site.instruction.called[0])
            if body is not None:
                yield site.instruction, body


def _call_line(graph: Graph, ops: list[Site], within: Site) -> str:
    """The line of the function that holds `within` from which the ops were called (the model's call in a loop's
    body), the one most of them name; "" where none does."""
    own = graph.module.stack(within.instruction)
    if not own:
        return ""
    file, _, function = own[0]
    lines: dict[int, int] = {}
    for op in ops:
        for frame_file, line, frame_function in graph.module.stack(_matmul_inside(graph, op).instruction):
            if frame_file == file and frame_function == function:
                lines[line] = lines.get(line, 0) + 1
                break
    return f"{short_path(file)}:{max(lines, key=lines.get)}" if lines else ""


@idiom("decode_recomputes_prefix", "work_not_needed",
       "A decoding loop reruns the model over every position on every trip to add one token",
       "keep a key/value cache instead of running the model over the whole {positions}-position buffer at {line} on "
       "every trip: run the prompt through it once before the loop (the prefill), writing each attention layer's "
       "keys and values into a cache of {positions} positions (jnp.zeros((batch, {positions}, heads, head_dim)) "
       "per layer, jax.lax.dynamic_update_slice_in_dim(cache, k, start, axis=1)), then run the loop's model on the "
       "newest token alone (jax.lax.dynamic_slice_in_dim(buf, t - 1, 1, axis=1) at position t - 1), writing its keys "
       "and values into the caches at t - 1 and attending to the cached positions up to it (the mask "
       "jnp.arange({positions}) <= t - 1), the caches carried in the fori_loop's state: each trip computes one "
       "position instead of {positions}",
       "every trip runs the whole model over every position of the buffer to use one of them: the positions before it "
       "are the same on every trip (a causal model's keys, values and MLP at a position depend only on the tokens up "
       "to it), so a cache of their keys and values leaves one position's projections and MLP per trip, and its "
       "attention to the cached ones",
       gain=(0.75, 0.95), measured="docs/reference/measurements.md#decode-recomputes-prefix",
       alternatives=("where a batched prefill is not wanted (prompts the loop should feed as it goes), keep the "
                     "cache and start the loop at the first prompt token, each trip feeding the buffer's token t - 1 "
                     "and writing the prompt's own next token or the predicted one (jnp.where(t < prompt_length, "
                     "buf[:, t], next_token)): one position per trip still, but the prompt's positions one trip "
                     "each (measured 68% shorter steps where the prefill gave 82%)",))
def decode_recomputes_prefix(program: Program) -> list[Match]:
    """A while loop whose body reads a buffer it carries whole (the tokens so far), runs matmuls over all its
    positions, keeps one position of the result by a dynamic slice at a computed index, and writes what it computes
    from that position into the buffer by a dynamic-update-slice: each trip reads what the trips before wrote, and
    recomputes every earlier position."""
    out: list[Match] = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for loop, body in _loop_bodies(graph):
            for index in range(len(body.by_name[body.root].operands) if body.root in body.by_name else 0):
                update = _in_place_update(graph, body, index)
                reads = graph.state_reads(body, index) if update is not None else []
                if update is None or update.instruction.opcode != "dynamic-update-slice" or not reads:
                    continue
                updating = _body_op(graph, update, body)
                read_ops = {op.instruction.name for op in (_body_op(graph, r, body) for r in reads) if op is not None}
                computed = set(read_ops).union(*(_downstream(body, name) for name in read_ops))
                for site in graph.sites():
                    pick = _position_pick(graph, site)
                    picking = _body_op(graph, site, body) if pick is not None else None
                    # the array it keeps a position of, as the body makes it: computed from the buffer, not the
                    # buffer itself (the old slot .at[t].set reads)
                    sliced = graph.origin(graph.operand(site, 0)) if picking is not None else None
                    made = _body_op(graph, sliced, body) if sliced is not None else None
                    if made is None or made.instruction.name in read_ops or made.instruction.name not in computed \
                            or updating is None or updating.instruction.name not in \
                            _downstream(body, picking.instruction.name) | {picking.instruction.name}:
                        continue
                    # the ops between the buffer's read and the kept position: the model over every position
                    before = _upstream(body, made.instruction.name) | {made.instruction.name}
                    over_all = [Site(body, body.by_name[name]) for name in body.by_name
                                if name in computed and name in before]
                    matmuls = [op for op in over_all if _holds_matmul(graph, op.instruction)]
                    ops, stake = timed_stake(program, graph, over_all)
                    ops = [op for op in ops if (module_key, op) in program.op_ms]
                    _, positions = pick
                    # the model's own weights applied to every position: a decode loop that keeps a key/value
                    # cache also reads its whole buffer (the cache), but only its attention does, one query a trip
                    if not matmuls or stake < MIN_STAKE_PERCENT or \
                            not any(_weight_rows(graph, op) >= positions for op in matmuls):
                        continue
                    largest = max(matmuls, key=lambda m: program.time_ms(graph.module, [m.instruction.name]))
                    line = _call_line(graph, matmuls, picking) or program.line_of(graph, site)[0]
                    pick_line, function = program.line_of(graph, site)
                    buffer = body.by_name[body.root].operands[index]
                    trips = loop.trip_count
                    out.append(Match(
                        "decode_recomputes_prefix", stake,
                        f"{_loop_at(program, graph, loop)} runs {trips or 'its'} trips, and each reads the "
                        f"{plain_shape(body.by_name[buffer])} buffer it carries whole, runs {len(matmuls)} matmul "
                        f"op(s) over all {positions} positions of it (the longest: {graph.computes(largest)}"
                        f"), then keeps one position (a dynamic slice at the loop's index"
                        + (f", at {pick_line}" if pick_line else "") + ") to write one slice of the buffer: every "
                        f"trip recomputes every earlier position; those ops hold {stake:g}% of the step",
                        module=module_key, ops=ops[:16], line=line, function=function,
                        needed_percent=round(stake / positions, 3), work_ratio=float(positions),
                        params={"positions": positions, "trips": trips or "its"},
                        facts={"positions": positions, "trips": trips, "matmul_ops": len(matmuls),
                               "buffer": plain_shape(body.by_name[buffer]), "picked_at": pick_line},
                        cites=[loop.name]))
                    break
    return out


def _weight_rows(graph: Graph, site: Site) -> float:
    """How many rows a matmul applies a weight to, where one operand of the matmul (inside its fusion) is a value the
    loop passes on unchanged (the model's weights): its FLOPs over twice the weight's elements; 0 where no operand
    is."""
    inner = _matmul_inside(graph, site)
    for k in range(len(inner.instruction.operands)):
        weights = graph.loop_invariant(graph.operand(inner, k))
        if weights is not None and weights.instruction.dims:
            return matmul_flops(graph, inner) / (2.0 * elements(weights.instruction.dims))
    return 0.0


WINDOW_MIN = 4
"""Windows shorter than this cost a few reads of each element at most."""
INDEX_ARITHMETIC = frozenset({"add", "subtract", "multiply", "select", "clamp", "compare", "pad", "slice",
                              "concatenate", "maximum", "minimum", "and", "or", "not", "negate"})
"""Ops that build gather indices from positions (an offset, jnp's wrap of negative indices, the clamp into bounds)
without reading data."""


def _iota_extents(graph: Graph, site: Site | None, depth: int = 3 * DEPTH) -> list[int] | None:
    """The lengths of the iotas (along their own dimension) an integer array is built from, where it is built from
    iotas and constants alone, through index arithmetic and the index pass-throughs XLA:TPU adds to a gather
    (AssumeGatherIndicesInBound); None where any part of it is read from data."""
    if site is None or depth <= 0:
        return None
    ins = site.instruction
    if ins.opcode == "iota":
        return [ins.dims[ins.dimensions[0]]] if ins.dimensions and ins.dimensions[0] < len(ins.dims) else None
    if ins.opcode == "constant":
        return []
    back = graph.producer(site)
    if back is not None:
        return _iota_extents(graph, back, depth - 1)
    passes = ins.opcode == "custom-call" and len(ins.operands) == 1 and ins.dtype.startswith(("s", "u"))
    if not passes and ins.opcode not in INDEX_ARITHMETIC:
        return None
    out: list[int] = []
    for k in range(len(ins.operands)):
        found = _iota_extents(graph, graph.operand(site, k), depth - 1)
        if found is None:
            return None
        out.extend(found)
    return out


def _sums_over(graph: Graph, site: Site, dims: tuple[int, ...], axis: int) -> bool:
    """Whether an op (or one its fusion holds) sums an array of these dimensions over `axis`."""
    ins = site.instruction
    called = graph.module.computations.get(ins.called[0]) if ins.opcode == "fusion" and ins.called else None
    for inner in (called.instructions if called is not None else [ins]):
        if inner.opcode != "reduce" or axis not in inner.dimensions or not inner.called:
            continue
        where = Site(called, inner) if called is not None else site
        operand = graph.operand(where, 0)
        reducer = graph.module.computations.get(inner.called[0])
        root = reducer.by_name.get(reducer.root) if reducer is not None else None
        if operand is not None and tuple(operand.instruction.dims) == dims and root is not None and \
                root.opcode == "add":
            return True
    return False


def _written_as(graph: Graph, site: Site) -> Site:
    """The value as the ops after it read it: through the re-shapes and transposes after it to its fusion's root,
    and out of that fusion (and any fusion holding it) as the fusion's own result."""
    seen = set()
    while (site.computation.name, site.instruction.name) not in seen:
        seen.add((site.computation.name, site.instruction.name))
        users = site.computation.users.get(site.instruction.name, [])
        if len(users) == 1 and users[0].opcode in SHAPE_ONLY:
            site = Site(site.computation, users[0])
        elif site.instruction.name == site.computation.root:
            caller = graph.callers.get(site.computation.name)
            if caller is None or caller.instruction.opcode != "fusion":
                break
            site = caller
        else:
            break
    return site


def _slice_text(name: str, ndim: int, axis: int, part: str) -> str:
    return f"{name}[{':, ' * axis}{part}{', ...' if axis < ndim - 1 else ''}]"


@idiom("rolling_windows_gathered", "work_not_needed",
       "Every overlapping window is gathered into a copy to sum it",
       "compute the rolling sums at {line} from differences of cumulative sums instead of gathering every window "
       "of {window} (indices jnp.arange(n)[:, None] + jnp.arange({window})): c1 = jnp.pad(jnp.cumsum(x, axis={axis}), "
       "{pad}) and c2 = jnp.pad(jnp.cumsum(x * x, axis={axis}), {pad}) (a leading zero), the window sums "
       "s1 = {sum1} and s2 = {sum2}, then mean = s1 / {window} and var = s2 / {window} - mean ** 2 (the standard "
       "deviation jnp.sqrt(jnp.maximum(var, 0.0))): a few passes over the {length} positions instead of a "
       "{copy_mib:.3g} MiB copy holding each element {window} times",
       "the gather writes each element once for every window that holds it, and the reductions read that copy "
       "again; the sums of consecutive windows differ by one element in and one out, which a cumulative sum gives "
       "from one pass over the input",
       gain=(0.7, 0.87), measured="docs/reference/measurements.md#rolling-windows-gathered",
       alternatives=("jax.lax.reduce_window(x, 0.0, jax.lax.add, window_dimensions, (1,) * x.ndim, 'VALID') with "
                     "the window along the same axis gives each window's sum with no gathered copy and no "
                     "cancellation between large cumulative sums (its premise where the series is long and its "
                     "mean far from zero in float32); it still adds each window's elements (measured a point "
                     "behind the cumulative sums)",))
def rolling_windows_gathered(program: Program) -> list[Match]:
    """A gather whose indices are built from two iotas alone (positions plus offsets: x[:, idx] with idx =
    arange(n)[:, None] + arange(W)), writing a copy with a window axis of W, that ops then sum over that axis."""
    out: list[Match] = []
    for graph in program.graphs:
        module_key = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            source, indices = graph.operand(site, 0), graph.operand(site, 1)
            if ins.opcode != "gather" or source is None or indices is None:
                continue
            extents = _iota_extents(graph, indices)
            if not extents or len(set(extents)) < 2 or elements(ins.dims) <= elements(source.instruction.dims):
                continue  # not a copy holding each element more than once
            # the copy as its readers see it (XLA:TPU writes it transposed and re-shapes it back with a bitcast)
            readers = list(graph.users(_written_as(graph, site)))
            found = None
            for window in sorted(set(extents)):
                starts = [e for e in extents if e != window]
                if window < WINDOW_MIN or window not in ins.dims or not starts:
                    continue
                axis_in_copy = ins.dims.index(window)
                summing = [r for r in readers if any(
                    _sums_over(graph, s, ins.dims, axis_in_copy) for s in (r, graph.callers.get(r.computation.name))
                    if s is not None)]
                if summing:
                    found = (window, max(starts), summing)
                    break
            if found is None:
                continue
            window, starts, summing = found
            axis = next((k for k, d in enumerate(source.instruction.dims) if d == starts + window - 1), None)
            if axis is None:
                continue
            length = source.instruction.dims[axis]
            ndim = len(source.instruction.dims)
            ops, stake = timed_stake(program, graph, [site, *summing])
            ops = [op for op in ops if (module_key, op) in program.op_ms]
            if stake < MIN_STAKE_PERCENT:
                continue
            line, function = program.line_of(graph, site)
            runs = program.runs.get((module_key, graph.timed_op(site)), 1)
            # the result needs the input read once and its window statistics (as many) written
            needed = program.roof_ms(hbm_bytes=runs * 2 * nbytes(source.instruction))
            pad = "(" + ", ".join("(1, 0)" if k == axis else "(0, 0)" for k in range(ndim)) + ")"
            copy_mib = nbytes(ins) / 2**20
            out.append(Match(
                "rolling_windows_gathered", stake,
                f"a gather whose indices are built from iotas alone (starts 0..{starts - 1} plus offsets "
                f"0..{window - 1}) "
                f"copies every overlapping window of {window} along the {length}-long axis {axis} of "
                f"{plain_shape(source.instruction)}: {plain_shape(ins)} ({copy_mib:.3g} MiB, "
                f"{elements(ins.dims) / max(elements(source.instruction.dims), 1):.3g}× its input), which "
                f"{len(summing)} op(s) then sum over the window" + (f", at {line}" if line else ""),
                module=module_key, ops=ops[:16], line=line, function=function,
                needed_percent=program.step_percent(needed) if needed is not None else None,
                work_ratio=float(window),
                params={"window": window, "axis": axis, "length": length, "pad": pad, "copy_mib": copy_mib,
                        "sum1": _slice_text("c1", ndim, axis, f"{window}:") + " - "
                        + _slice_text("c1", ndim, axis, f":-{window}"),
                        "sum2": _slice_text("c2", ndim, axis, f"{window}:") + " - "
                        + _slice_text("c2", ndim, axis, f":-{window}")},
                facts={"window": window, "windows": starts, "copy": plain_shape(ins), "copy_bytes": nbytes(ins),
                       "summed_by": len(summing)}))
    return out
