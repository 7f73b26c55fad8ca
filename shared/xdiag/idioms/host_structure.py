"""Idioms of how the host's Python drives the device: the step's time goes to the loop's structure, not to any op.

- python_loop_of_calls: a Python loop calls one jitted program many times per step (reading a value back after each
  call, or feeding it one request at a time), so the device idles between calls.
- recompile_per_shape: a jitted program is compiled again inside the steps because an argument's shape changes
  between calls (an array that grows by one element per call, or batches of varying size).
  Where jax.jit itself runs inside the loop, on a lambda or closure made per call, it is this idiom too, seen from
  the Python tracer's frames where the capture holds one call and one compile.
- static_argument_per_value: the same program compiled again on every call with the same shapes while jax.jit runs
  only before the loop: a value its compiles are keyed on (a static argument) changes per call.
- callback_in_step: the compiled step calls back into Python (jax.pure_callback, io_callback, jax.debug.callback),
  and the device waits for the host on every call (inside a loop of the compiled program, on every trip).
- host_preprocessing: the host converts and normalises each batch (NumPy between the device's calls) and ships it in a
  floating type, while the device waits.
- per_element_transfers: each step moves a Python list's elements between host and device one at a time
  (jnp.asarray per example, float() per value).
- read_each_step: a value read back every step keeps the host's work, its copies to the device and the device's
  work in series.
- reduced_on_host: every step copies a large result to the host only for a NumPy reduction over it (argmax, a sum,
  a sort for the top k), where the device could reduce it and return the small result.
- weights_uploaded_each_step: the weights a step's matmuls multiply by are passed as host (NumPy) arrays and copied
  to the device on every call.
- mask_uploaded_each_step: a large mask or additive bias is passed as a host array on every call and used only
  element by element against a larger array (attention scores), where the jitted function could build it from the
  ids it is made of.
- data_uploaded_each_step: large arrays the step's program reads (a graph, a dataset) are passed as host arrays on
  every call, converted and copied again each time, where put on the device once they stay there.
- boolean_mask_in_loop: a Python loop indexes an array with a boolean mask on every trip, so each trip reads the
  mask back to the host, uploads its indices and dispatches its ops one by one; jax.jit refuses the index.
- eager_loop_reads_each_trip: a Python loop runs its ops eagerly, one dispatch each, and reads a value back with int()
  or float() on every trip, where one jitted function computes every trip's values at once.

Their stake is the whole time the structure costs (the device's idle share of the step, or the compiles'), not the
slice the breakdown files as dispatch: a loop moved into one program drops its dispatches, waits and idle together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from xdiag.analysis.host_vocabulary import (
    CALLBACK_EVENT,
    COMPILE_EVENT,
    DISPATCH_EVENT,
    EXECUTE_EVENT,
    HOST_TRANSFER_EVENT,
    JITTED_CALL_EVENT,
    SYNC_EVENT,
)
from xdiag.analysis.intervals import PS_PER_MS, covered, outermost
from xdiag.analysis.op_table import module_spans
from xdiag.analysis.source_lines import is_library, python_frame, short_path
from xdiag.analysis.xprof.common import natural_order
from xdiag.idioms.catalogue import Match, idiom
from xdiag.idioms.hlo_graph import DTYPE_BYTES, Site, elements, nbytes, opcode_name
from xdiag.idioms.program import HostEvents, Program, calls_per_step_of
from xdiag.profile.space import HloInstruction, HloModule

MIN_CALLS_PER_STEP = 4.0
MIN_IDLE_PERCENT = 30.0
SETUP_OPS = frozenset(f"jit_{op}" for op in ("convert_element_type", "broadcast_in_dim", "iota", "copy", "reshape",
                                              "squeeze", "expand_dims", "concatenate", "full", "zeros_like", "stage",
                                              "stack"))
"""One-op programs that make or re-type arrays (a benchmark's setup), not a function's computation run eagerly."""
TINY_CALL_US = 50.0
"""A call whose device work is shorter than this costs less than its own launch and wait from Python."""
"""The device idles at least this share of the step before the loop's structure is its time."""
CALLBACK = re.compile(r"pure_callback|io_callback|debug_callback|callback")


def _module(program: Program, key: str) -> HloModule | None:
    return next((m for m in program.session.hlo_modules if key in (m.name, getattr(m, "display_name", m.name))), None)


def _function_line(program: Program, module: HloModule | None) -> tuple[str, str]:
    """The user's line most of the program's instructions come from, and its function."""
    if module is None:
        return "", ""
    graph = next(g for g in program.graphs if g.module is module)
    votes: dict[tuple[str, str], int] = {}
    for site in graph.sites():
        line = program.line_of(graph, site)
        if line[0]:
            votes[line] = votes.get(line, 0) + 1
    return max(votes, key=votes.get) if votes else ("", "")


def _single_op(module: HloModule | None) -> bool:
    """A program of one operation (jit_add, jit_tanh): what JAX compiles for each op a function runs eagerly."""
    entry = module.computations.get(module.entry) if module is not None else None
    return entry is not None and sum(i.opcode not in ("parameter", "constant", "tuple", "copy", "bitcast")
                                     for i in entry.instructions) <= 1


def _size(module: HloModule) -> int:
    return sum(len(c.instructions) for c in module.computations.values())


def _entry_shapes(module: HloModule | None) -> list[str]:
    if module is None:
        return []
    entry = module.computations.get(module.entry)
    params = sorted((i for i in entry.instructions if i.opcode == "parameter"), key=lambda i: i.parameter_number) \
        if entry else []
    return [i.shape_text.split("{")[0] for i in params]


@idiom("python_loop_of_calls", "host_structure",
       "A Python loop calls one jitted program many times per step",
       "{change}",
       "each call from Python pays a dispatch, and each value read back stops the host until the device is done, so "
       "the device idles between calls; one compiled loop runs the same work back to back",
       gain=(0.7, 1.0), measured="docs/reference/measurements.md#python-loop-of-calls")
def python_loop_of_calls(program: Program) -> list[Match]:
    step = program.step
    idle = float(step.get("device_idle_percent") or 0.0)
    calls = [(k, n) for k, n in calls_per_step_of(program) if k.split("(")[0] not in SETUP_OPS]
    if not calls or idle < MIN_IDLE_PERCENT:
        return []
    # The looped program, not a one-op program run as often beside it (an eager `x.sum()` of its output per trip)
    key, per_step = next((c for c in calls if c[1] >= 0.9 * calls[0][1] and not _single_op(_module(program, c[0]))),
                         calls[0])
    # Each trip's eager one-op programs (a reduction of its output read back) are dispatches of the loop's trips too
    beside = sum(n for k, n in calls if k != key and 0.5 <= n <= 1.5 * per_step and _single_op(_module(program, k)))
    dispatches = float(step.get("dispatches_per_step_mean") or 0.0)
    syncs = float(step.get("syncs_per_step_mean") or 0.0)
    launch = float(step.get("dispatch_percent") or 0.0) + float(step.get("host_sync_percent") or 0.0)
    # Without step marks each call is read as a step of its own: the loop shows as steps of one call whose launch
    # and wait take more of it than the device's work.
    device_us = 1e3 * float(step.get("step_time_ms_mean") or 0.0) * (100.0 - idle) / 100 / max(per_step, 1.0)
    module = _module(program, key)
    shapes = _entry_shapes(module)
    one_row = any(re.fullmatch(r"[a-z0-9]+\[1,\d+(,\d+)*\]", s) for s in shapes)  # a request of one row
    # Without step marks each call is read as a step of its own. A training loop's step is one call too: what marks
    # a loop of calls is a call whose device work is shorter than what its launch and wait cost, or one row a call.
    one_call_steps = dispatches <= 1.5 + beside and per_step <= 1.5 and launch >= MIN_IDLE_PERCENT and \
        float(step.get("steps") or 0) >= 2 * MIN_CALLS_PER_STEP and (device_us <= TINY_CALL_US or one_row)
    if not one_call_steps and (per_step < MIN_CALLS_PER_STEP or dispatches < MIN_CALLS_PER_STEP):
        return []
    line, function = _function_line(program, module)
    if _eager(program, calls) or eager_loop_reads_each_trip(program):
        return []  # eager_ops, or a loop of eager ops with a read each trip: the loop is the one-op programs'
    reads = syncs >= per_step / 2 and syncs >= 0.5
    name = key.split("(")[0]
    reads_text = "one blocking read" if syncs == 1 else f"{syncs:.3g} blocking reads"
    counted = (f"{per_step:.3g} calls and {syncs:.3g} reads of a value per step" if not one_call_steps else
               f"{float(step.get('steps') or 0):.0f} calls in the capture, each read as a step")
    stacked = _stacked_outputs(program, module) if one_call_steps else None
    if stacked is not None:
        count, shape = stacked
        line, function = _call_line(module, name.removeprefix("jit_")) or (line, function)
        change = (f"write the Python loop that calls {name} at {line} ({counted}) as one jax.lax.scan inside a "
                  f"jitted function: (carry, _), outs = jax.lax.scan(body, carry, None, length=n), body calling "
                  f"{name.removeprefix('jit_')} once and returning its per-trip outputs, which the scan stacks (the "
                  f"loop stacks them itself after it: jnp.stack of {count} {shape})"
                  + ("; the value read back every trip (an int() or float() of a reduction, for a log) summed in the "
                     "carry or over the stacked outputs and read once, after the scan" if reads else ""))
    elif one_row:
        change = (f"make one call of {name} on the whole batch instead of one call per row: stack the inputs "
                  f"(jnp.stack) and call jax.vmap({function or name.removeprefix('jit_')}) on them, or write "
                  f"{function or 'the function'} for a batch")
    elif reads:
        change = (f"move the Python loop that calls {name} ({counted}) into one jitted function: "
                  f"jax.lax.fori_loop(0, n, body, state) for a fixed count, or "
                  f"jax.lax.while_loop(cond, body, state) with the test the loop makes on the value read back as "
                  f"cond; read the result once after the loop")
    else:
        change = (f"move the Python loop that calls {name} ({counted}) into one jitted function: "
                  f"jax.lax.fori_loop(0, n, body, state) where each call feeds the next, jax.lax.scan over the "
                  f"inputs, or jax.vmap where the calls are independent, so one program runs them back to back")
    runs = (f"runs {per_step:.3g} times per step, dispatched {dispatches:.3g} times from Python with {reads_text} of "
            f"a value per step" if not one_call_steps else
            f"is called {float(step.get('steps') or 0):.0f} times in the capture, each call a step of its own as the "
            f"profile reads it (no step marks), with {device_us:.3g} µs of device work per call, "
            f"{launch:.3g}% of each in its launch and wait")
    stake, needed = idle, None
    if one_row:
        # Each call reads the program's weights again for one row; batched, the calls' rows share one read: all but
        # one call's device time goes too.
        calls = max(per_step * float(step.get("steps") or 0), 1.0)
        stake, needed = 100.0, (100.0 - idle) / calls
    return [Match(
        "python_loop_of_calls", stake,
        f"the program {name} (its arguments {', '.join(shapes[:3]) or 'not recorded'}) {runs}, and the device "
        f"idles {idle:g}% of the step between calls",
        module=key, line=line, function=function, needed_percent=needed,
        params={"change": change, "calls": round(per_step, 1)},
        facts={"calls_per_step": round(per_step, 1), "dispatches_per_step": dispatches, "syncs_per_step": syncs,
               "device_idle_percent": idle})]


def _stacked_outputs(program: Program, looped: HloModule | None) -> tuple[int, str] | None:
    """(trips, per-trip shape) where a program stacks at least MIN_CALLS_PER_STEP arrays of one shape that the looped
    program returns (jnp.stack of the loop's per-trip outputs, run eagerly after it): the loop is a scan's."""
    if looped is None:
        return None
    entry = looped.computations.get(looped.entry)
    returned = entry.instructions[-1].shape_text if entry is not None and entry.instructions else ""
    for module in program.session.hlo_modules:
        shapes = _entry_shapes(module)
        if module is not looped and module.name == "jit_stack" and len(shapes) >= MIN_CALLS_PER_STEP and \
                len(set(shapes)) == 1 and re.search(re.escape(shapes[0]) + r"[{,)]", returned):
            return len(shapes), shapes[0]
    return None


def _call_line(module: HloModule | None, function: str) -> tuple[str, str] | None:
    """The user's line ("file:line") that calls the jitted `function`, and its function: the frame the program's
    Python stacks hold just outside it; None where they hold none."""
    for path, number, name, parent in (module.stack_frames if module is not None else ()):
        if name.rsplit(".", 1)[-1] != function or not 0 < parent <= len(module.stack_frames):
            continue
        caller = module.stack_frames[parent - 1]
        if caller[2].rsplit(".", 1)[-1] != function and not is_library(caller[0]):
            return f"{short_path(caller[0])}:{caller[1]}", caller[2]
    return None


def _eager(program: Program, calls: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The one-op programs run per step, where at least three kinds make at least half the step's calls (else none):
    a function run eagerly runs several kinds of op; a benchmark timing one op calls one kind."""
    eager = [(k, n) for k, n in calls if n >= 1 and _single_op(_module(program, k))]
    kinds = {k.split("(")[0] for k, _ in eager} - SETUP_OPS
    return eager if len(kinds) >= 3 and sum(n for _, n in eager) >= 0.5 * sum(n for _, n in calls) else []


@idiom("eager_ops", "host_structure",
       "The step runs its ops one by one from Python, not as one compiled program",
       "{change}",
       "a function that is not jitted runs each jnp operation as its own compiled program, dispatched from Python "
       "one at a time; under jax.jit the same ops are one program that XLA fuses",
       gain=(0.7, 1.0))
def eager_ops(program: Program) -> list[Match]:
    """Ops run one by one from Python (each its own one-op program): the function that runs them is not jitted."""
    step = program.step
    idle = float(step.get("device_idle_percent") or 0.0)
    dispatches = float(step.get("dispatches_per_step_mean") or 0.0)
    eager = _eager(program, calls_per_step_of(program))
    launch = float(step.get("dispatch_percent") or 0.0) + float(step.get("host_sync_percent") or 0.0)
    # The launches hold the step, not the host's own Python or NumPy between them (an input pipeline's)
    if not eager or idle < MIN_IDLE_PERCENT or dispatches < MIN_CALLS_PER_STEP or launch < MIN_IDLE_PERCENT:
        return []
    lines: dict[tuple[str, str], float] = {}
    for key, per_step in eager:
        line = _function_line(program, _module(program, key))
        if line[0]:
            lines[line] = lines.get(line, 0.0) + per_step
    line, function = max(lines, key=lines.get) if lines else ("", "")
    function = function.split(".<locals>")[0]  # a lambda the function maps over its leaves: the function is the unit
    names = ", ".join(k.split("(")[0] for k, _ in eager[:4])
    calls = sum(n for _, n in eager)
    change = (f"put {function or 'the function that runs these ops'} under jax.jit (decorate it with @jax.jit, or "
              f"jit the whole step that calls it), so its {calls:.3g} ops per step compile into one program that XLA "
              f"fuses, instead of one dispatch per op")
    return [Match(
        "eager_ops", idle,
        f"the step runs {calls:.3g} one-op programs per step ({names}, …), each dispatched from Python as the "
        f"function runs eagerly ({dispatches:.3g} dispatches per step)" + (f", from {line}" if line else "")
        + f", and the device idles {idle:g}% of the step",
        module=eager[0][0], line=line, function=function,
        params={"change": change, "calls": round(calls, 1)},
        facts={"one_op_programs_per_step": round(calls, 1), "dispatches_per_step": dispatches,
               "device_idle_percent": idle})]


@dataclass
class Recompiles:
    """A jitted program compiled again inside the steps: its name, its compiled versions (first compiled first), each
    version's entry parameters' shapes and the positions whose shapes differ between versions."""

    name: str
    modules: list[HloModule]
    shapes: list[list[str]]
    changing: list[int]
    compiles_per_step: float
    compile_percent: float


def _recompiles(program: Program) -> Recompiles | None:
    step = program.step
    compiles = float(step.get("compiles_per_step_mean") or 0.0)
    share = float(step.get("compile_percent") or 0.0)
    if compiles < 0.5 or share < 5.0:
        return None
    by_name: dict[str, list[HloModule]] = {}
    for module in program.session.hlo_modules:
        by_name.setdefault(module.name, []).append(module)
    # A program the steps run (not one compiled per shape while the arrays were made), the user's program first: a
    # small program compiled per shape (jit_concatenate growing its input) feeds it
    ran = {module for module, _ in program.runs}
    name, modules = max(by_name.items(), key=lambda kv: (
        any(m.name in ran or m.display_name in ran for m in kv[1]), len(kv[1]) >= 2, _size(kv[1][0])))
    if len(modules) < 2:
        return None
    modules = sorted(modules, key=lambda m: m.program_id)
    shapes = [_entry_shapes(m) for m in modules]
    changing = [k for k in range(min(len(s) for s in shapes)) if len({s[k] for s in shapes}) > 1]
    return Recompiles(name, modules, shapes, changing, compiles, share)


def _compile_stake(program: Program, found: Recompiles) -> float:
    """The compiles' share of the step, or the device's idle share where that is larger (the trace and lowering
    before each compile leave the device idle too)."""
    idle = float(program.step.get("device_idle_percent") or found.compile_percent)
    return max(found.compile_percent, min(idle, 100.0))


def _compile_facts(found: Recompiles) -> dict:
    return {"compiles": len(found.modules), "compiles_per_step": found.compiles_per_step,
            "compile_percent": found.compile_percent}


JIT_WRAP_FRAME = re.compile(r"^\$api\.py:\d+ jit$")
"""jax.jit itself (making a jitted function), as the Python tracer names it: inside a step, the function is wrapped
again on every call."""


def _jit_wraps(program: Program) -> HostEvents:
    """The calls of jax.jit inside the steps, outermost ones."""
    wraps = _in_steps(program, program.host_events(PYTHON_TRACER_EVENT).where(JIT_WRAP_FRAME.search))
    return wraps.take(np.flatnonzero(outermost(np.ones(len(wraps), bool), wraps.thread, wraps.start_ps,
                                               wraps.end_ps)))


def _static_value_changes(program: Program, found: Recompiles) -> bool:
    """The same function compiled again with the same shapes while jax.jit runs only before the loop (the Python
    tracer shows every call of it): a value the compiles are keyed on changes. Where jax.jit runs inside the loop
    (a lambda or closure jitted per call), or the tracer did not run, it is recompile_per_shape's."""
    steps = float(program.step.get("steps") or 0)
    return not found.changing and steps > 0 and len(program.host_events(PYTHON_TRACER_EVENT)) > 0 and \
        len(_jit_wraps(program)) < steps / 2


@dataclass
class JitMadePerCall:
    """A user function that calls jax.jit and then the program it made, whose call misses jit's cache and compiles,
    on each of its calls in the capture: what making the program again costs per call."""

    frame: str  # the function, as the Python tracer names it
    calls: int  # its calls in the capture
    name: str  # the jitted program it makes and calls
    call_ms: float  # the function's time per call
    making_ms: float  # per call: jax.jit's wrap, and the jitted call up to the end of its compile (trace, lowering)
    compile_ms: float  # per call: the lowering and the compile alone
    held_by_steps: bool  # the profile's steps hold its calls (else they mark only the device's execution)


def _outermost(events: HostEvents) -> HostEvents:
    return events.take(np.flatnonzero(outermost(np.ones(len(events), bool), events.thread, events.start_ps,
                                                events.end_ps)))


def _jit_made_per_call(program: Program) -> JitMadePerCall | None:
    """The user function whose every call in the capture runs jax.jit and then calls what it made, that call tracing
    and compiling (every call of that program inside it does): a jitted function made per call, seen even where the
    capture holds one call and so one compile."""
    frames = program.host_events(PYTHON_TRACER_EVENT)
    wraps = frames.where(JIT_WRAP_FRAME.search)
    if not len(wraps):
        return None
    user = frames.where(program.is_user_frame)
    # The functions that run jax.jit, each with all its calls (those that make nothing too)
    wrapping = set(user.names[_contains_any(user, wraps)].astype(str))
    user = user.where(lambda n: n in wrapping)
    calls = _outermost(program.host_events(JITTED_CALL_EVENT))
    compiles = _outermost(program.host_events(COMPILE_EVENT))
    compiling = _contains_any(calls, compiles)
    per_frame: dict[str, list[tuple[float, float, float]]] = {}  # name -> per call (ms, making ms, compile ms)
    program_of: dict[str, str] = {}
    for i in range(len(user)):
        start, end, thread = user.start_ps[i], user.end_ps[i], user.thread[i]
        inside = np.flatnonzero((calls.thread == thread) & (calls.start_ps >= start) & (calls.end_ps <= end))
        made = [c for c in inside if compiling[c] and ((wraps.thread == thread) & (wraps.start_ps >= start)
                                                       & (wraps.end_ps <= calls.start_ps[c])).any()]
        name = str(user.names[i])
        if not made or any(not compiling[c] for c in inside if calls.names[c] == calls.names[made[0]]):
            per_frame.setdefault(name, []).append((0.0, -1.0, 0.0))  # a call that reuses what it made
            continue
        making = _step_ms_between(wraps, thread, start, end)
        compile_ms = 0.0
        for c in made:
            held = (compiles.thread == thread) & (compiles.start_ps >= calls.start_ps[c]) & \
                (compiles.end_ps <= calls.end_ps[c])
            making += float(compiles.end_ps[held].max() - calls.start_ps[c]) / PS_PER_MS
            compile_ms += float((compiles.end_ps[held] - compiles.start_ps[held]).sum()) / PS_PER_MS
        per_frame.setdefault(name, []).append((float(end - start) / PS_PER_MS, making, compile_ms))
        program_of[name] = str(calls.names[made[0]])
    found = [(name, rows) for name, rows in per_frame.items() if all(r[1] >= 0 for r in rows)]
    if not found:
        return None
    # The innermost such function: its caller holds the same calls and compiles
    name, rows = min(found, key=lambda kv: (-sum(r[1] for r in kv[1]), sum(r[0] for r in kv[1])))
    mine = user.where(lambda n: n == name)
    held = _step_ms(program, mine.start_ps, mine.end_ps)
    total = sum(r[0] for r in rows)
    return JitMadePerCall(name, len(rows), program_of[name].split("(", 1)[1].rstrip(")"), float(total / len(rows)),
                          float(sum(r[1] for r in rows) / len(rows)), float(sum(r[2] for r in rows) / len(rows)),
                          bool(held >= 0.9 * total and program.profiled_step_ms > held))


def _step_ms_between(events: HostEvents, thread: int, start: int, end: int) -> float:
    """The time the events of one thread inside [start, end] take, in ms."""
    inside = (events.thread == thread) & (events.start_ps >= start) & (events.end_ps <= end)
    return float((events.end_ps[inside] - events.start_ps[inside]).sum()) / PS_PER_MS


@idiom("recompile_per_shape", "host_structure",
       "A jitted program is compiled again inside the steps",
       "{change}",
       "jax.jit compiles once per distinct function, argument shape and static value: a shape, a function object or "
       "a baked-in Python value that changes between calls makes every such call compile, and the device waits for "
       "the compiler",
       gain=(0.8, 1.0))
def recompile_per_shape(program: Program) -> list[Match]:
    found = _recompiles(program)
    if found is None:
        made = _jit_made_per_call(program)
        return [_jit_made_per_call_match(program, made)] if made is not None else []
    if _static_value_changes(program, found):
        return []
    name, shapes, changing = found.name, found.shapes, found.changing
    line, function = _function_line(program, found.modules[0])
    stem = name.removeprefix("jit_")
    if not changing:
        change = (f"jit {stem} once, outside the loop (update = jax.jit({stem}) at module level), and pass what "
                  f"changes between calls as an argument of array type (a jnp.asarray(lr) operand), not through "
                  f"functools.partial, a lambda or a closure made per call: each new function object or Python value "
                  f"is a new trace and compile; static_argnums would compile again for every new value")
        return [Match(
            "recompile_per_shape", _compile_stake(program, found),
            f"the program {name} was compiled {len(found.modules)} times in the capture ({found.compiles_per_step:g} "
            f"compiles per step, {found.compile_percent:g}% of the step) with the same argument shapes "
            f"({', '.join(shapes[0][:3])}): what changes is the function or a constant baked into it, not a shape",
            module=name, line=line, function=function, params={"change": change}, facts=_compile_facts(found))]
    position = changing[0]
    sizes = sorted({_leading_change(s[position], shapes[0][position]) for s in shapes} - {None})
    steps_of_one = len(sizes) >= 2 and all(b - a == 1 for a, b in zip(sizes, sizes[1:]))
    seen = ", ".join(sorted({s[position] for s in shapes}, key=natural_order)[:4])
    if steps_of_one:
        change = (f"give {stem}'s argument {position} a fixed size: allocate the whole buffer once (its final length) "
                  f"and write each new element at a position, buf = jax.lax.dynamic_update_slice(buf, x, (i, ...)) "
                  f"with i a traced index (or buf.at[i].set(x)), masking the unused tail, so {name} compiles once "
                  f"instead of once per length")
    else:
        change = (f"pad argument {position} of {stem} to a few fixed sizes (bucket the lengths, e.g. to the next "
                  f"multiple of 64 or power of two) and mask the padding, so {name} compiles once per bucket; "
                  f"check with jax.config.update('jax_log_compiles', True) which argument changes")
    return [Match(
        "recompile_per_shape", _compile_stake(program, found),
        f"the program {name} was compiled {len(found.modules)} times in the capture ({found.compiles_per_step:g} "
        f"compiles per step, {found.compile_percent:g}% of the step) for argument {position} of shapes {seen}"
        + (", growing by one element per call" if steps_of_one else ""),
        module=name, line=line, function=function,
        params={"change": change, "position": position},
        facts={**_compile_facts(found), "argument_shapes": seen})]


def _jit_made_per_call_match(program: Program, made: JitMadePerCall) -> Match:
    """recompile_per_shape where the capture shows jax.jit run inside the function that calls what it made: the
    change is to make it once; its stake is the making's share of the profiled steps where they hold the function's
    calls, else of the function's own calls (steps that mark only the device's execution hold no compile)."""
    line, function = _frame_line(made.frame)
    module = _module(program, f"jit_{made.name}")
    call_line = _stack_line(module, function, line) or line
    stake = (program.step_percent(made.making_ms * made.calls) if made.held_by_steps else
             round(min(100.0 * made.making_ms / made.call_ms, 100.0), 2) if made.call_ms > 0 else 0.0)
    change = (f"build the jitted function once, where the loop is set up, not inside {function} (which calls what it "
              f"makes at {call_line}): make update = jax.jit(functools.partial({made.name}, **settings)) once, before "
              f"the loop (or jit {made.name} once, naming the settings it takes by keyword in static_argnames), and "
              f"call update in {function}; a jax.jit wrapper, functools.partial or lambda made anew on each call "
              f"misses jit's cache, so each call traces, lowers and compiles again. If a bound value changes between "
              f"calls (a learning rate's schedule), pass it as an array argument (jnp.float32(lr)) of the function "
              f"jitted once")
    return Match(
        "recompile_per_shape", stake,
        f"the function {function} ({line}) calls jax.jit and then the program it made, jit_{made.name}, which misses "
        f"jit's cache "
        f"and is traced, lowered and compiled again: {made.making_ms:,.4g} ms of the {made.call_ms:,.4g} ms a call "
        f"of {function} takes ({made.compile_ms:,.4g} ms in the lowering and compile), "
        + ("in its one call in the capture" if made.calls == 1 else
           f"in each of its {made.calls} calls in the capture"),
        module=f"jit_{made.name}", line=call_line, function=function, params={"change": change},
        facts={"compiles": made.calls, "making_ms_per_call": round(made.making_ms, 1),
               "compile_ms_per_call": round(made.compile_ms, 1),
               **({} if made.held_by_steps else {"loop_step_ms": round(made.call_ms, 3)})})


def _stack_line(module: HloModule | None, function: str, line: str) -> str:
    """The line in `function` (of `line`'s file) that the program's Python stacks pass through: where the function
    calls the jitted program (the Python tracer names a function by the line it begins on)."""
    file = line.split(":", 1)[0]
    for path, number, name in ((f[0], f[1], f[2]) for f in (module.stack_frames if module is not None else ())):
        if path.rsplit("/", 1)[-1] == file and name.rsplit(".", 1)[-1] == function:
            return f"{short_path(path)}:{number}"
    return ""


def _leading_change(shape: str, first: str) -> int | None:
    """The size of the first dimension in which `shape` differs from `first` (both like 's32[1,17]')."""
    a = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])]
    b = [int(d) for d in re.findall(r"\d+", first.split("[", 1)[-1])]
    if len(a) != len(b):
        return None
    return next((x for x, y in zip(a, b) if x != y), a[-1] if a else None)


@idiom("static_argument_per_value", "host_structure",
       "A jitted function is compiled again for every call with the same shapes: a static value changes per call",
       "{change}",
       "jax.jit compiles one program per value of a static argument (static_argnums, static_argnames), keyed by its "
       "hash: a learning rate, a step count or a new object passed there every call makes every call trace and "
       "compile again with the same shapes; as a traced argument one compiled program serves every value",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#static-argument-per-value",
       alternatives=("where the value must stay static (it sets a shape or a Python branch), round it to a few values "
                     "(a schedule's stages) so the compiles stop after the first of each: premise, one compile per "
                     "value kept",))
def static_argument_per_value(program: Program) -> list[Match]:
    """The same program compiled again in every step with the same argument shapes, jax.jit called once: a value in
    its cache key (a static argument) changes between calls."""
    found = _recompiles(program)
    if found is None or not _static_value_changes(program, found):
        return []
    # The call that compiled: the user's line around the jitted call with a compile inside it
    frames = program.host_events(PYTHON_TRACER_EVENT)
    calls = program.host_events(JITTED_CALL_EVENT)
    calls = calls.take(np.flatnonzero(outermost(np.ones(len(calls), bool), calls.thread, calls.start_ps, calls.end_ps)))
    compiling = calls.take(np.flatnonzero(_contains_any(calls, program.host_events(COMPILE_EVENT))))
    line, function = (_caller(program, frames, int(compiling.start_ps[0]), int(compiling.end_ps[0]))
                      if len(compiling) else ("", ""))
    def_line, traced = _function_line(program, found.modules[0])
    stem = found.name.removeprefix("jit_")
    where = f" at {line}" if line else ""
    change = (f"make the argument of {stem} that changes on every call{where} a traced one: take it out of "
              f"static_argnums / static_argnames and pass it as an array (jnp.float32(lr), jnp.int32(step)), so one "
              f"compiled program serves every value; keep static only what sets a shape or a Python branch. "
              f"jax.config.update('jax_explain_cache_misses', True) names the argument whose value changes")
    return [Match(
        "static_argument_per_value", _compile_stake(program, found),
        f"the program {found.name} (its arguments {', '.join(found.shapes[0][:3]) or 'none'}) was compiled "
        f"{len(found.modules)} times in the capture ({found.compiles_per_step:g} compiles per step, "
        f"{found.compile_percent:g}% of the step) with the same argument shapes and the same function"
        + (f", called{where}" if line else "") + ": what changes between calls is a value its compile is keyed on",
        module=found.name, line=line or def_line, function=function or traced, params={"change": change},
        facts=_compile_facts(found))]


@dataclass
class CallbackSite:
    """One callback in a compiled program: its kind, the user's line, its program and timed op, the while loop whose
    body runs it (None outside any loop) and its runs per step, as the trace counts them."""

    kind: str
    line: str
    function: str
    module: str
    op: str
    loop: str | None
    per_step: float


def _callback_sites(program: Program) -> list[CallbackSite]:
    """Every callback the compiled programs make (the send or custom call that leaves the device), most run first."""
    steps = float(program.step.get("steps") or 0)
    out: dict[tuple[str, str], CallbackSite] = {}
    for graph in program.graphs:
        module = program.module_key(graph.module)
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode not in ("custom-call", "send", "recv") or not CALLBACK.search(ins.op_name or ""):
                continue
            op = graph.timed_op(site)
            loop = graph.loop_of(site.computation)
            runs = program.runs.get((module, op), 0)
            if (module, op) not in out:
                line, function = program.line_of(graph, site)
                out[(module, op)] = CallbackSite(CALLBACK.search(ins.op_name).group(0), line, function, module, op,
                                                 loop.name if loop is not None else None,
                                                 runs / steps if steps > 0 else 0.0)
    return sorted(out.values(), key=lambda c: (-c.per_step, c.loop is None))


MIN_LOOP_CALLBACKS_PER_STEP = 4.0
"""A callback run at least this many times per step inside a device loop: each trip stops the loop for a round trip
to the host, where one callback after the loop would make one."""


@idiom("callback_in_step", "host_structure",
       "The compiled step calls back into Python on every call",
       "{change}",
       "a callback leaves the compiled program: the device waits while the host copies the operands out, runs the "
       "Python function and copies the result back, on every call (inside a loop, on every trip of it)",
       gain=(0.6, 1.0))
def callback_in_step(program: Program) -> list[Match]:
    step = program.step
    callbacks = float(step.get("callbacks_per_step_mean") or 0.0)
    sites = _callback_sites(program)
    idle = float(step.get("device_idle_percent") or 0.0)
    if not sites or (callbacks < 1 and idle < MIN_IDLE_PERCENT):
        return []
    found = sites[0]
    in_loop = found.loop is not None and found.per_step >= MIN_LOOP_CALLBACKS_PER_STEP
    callback_percent = program.step_percent(sum(s.total_ms for s in program.stats if s.category == "host_callback"))
    # On a CPU the callback runs as one of the device's ops, on its cores: its own time is the device's too. On an
    # accelerator its ops are the device waiting for the host; a loop's op spans them, so the step's breakdown counts
    # that wait as busy, not idle: their own time is the stake there
    on_device = callback_percent if program.platform == "CPU" else 0.0
    waits = callback_percent if program.platform != "CPU" and in_loop else 0.0
    call = {"pure_callback": "jax.pure_callback", "io_callback": "jax.experimental.io_callback",
            "debug_callback": "jax.debug.callback / jax.debug.print"}.get(found.kind, "the host callback")
    at = found.line or "the callback"
    if in_loop:
        change = (f"take the callback at {at} ({call}) out of the loop body: carry what it reads in the loop's state "
                  f"(history = history.at[i].set(value), an array of the loop's length made before it) and make one "
                  f"callback with the whole array after the loop, so the {found.per_step:.3g} round trips per step to "
                  f"the host become one; where the host must see progress during the loop, call it every k trips "
                  f"inside jax.lax.cond(i % k == 0, ...)")
    else:
        change = (f"compute at {at} with jnp inside the jitted step instead of calling back into Python ({call}); "
                  f"where the callback only logs, drop it from the step and log a value fetched every N steps")
    if program.platform == "CPU":  # the host is the device: the callback's work stays on the same cores either way
        change += ("; on a CPU the callback's own work stays on these cores whichever library runs it, and jnp sorts "
                   "in full where NumPy partitions (percentile, quantile, median): there call it on fewer elements "
                   "or every few steps rather than port it")
    runs = (f"{found.per_step:.3g} times per step inside a loop the device runs (HLO {found.loop}), a round trip to "
            f"the host on every trip" if in_loop else f"{callbacks:g} callbacks per step")
    return [Match(
        "callback_in_step", min(max(idle + on_device, waits), 100.0),
        f"the step's compiled program calls {call} ({runs})"
        + (f" at {found.line}" if found.line else "") + f", and the device idles {idle:g}% of the step"
        + (f"; the callbacks themselves run as device ops for {on_device:g}% of it" if on_device >= 1 else "")
        + (f"; the device waits in the callbacks' transfers {waits:g}% of it" if waits >= 1 else ""),
        module=found.module, ops=[found.op], line=found.line, function=found.function, params={"change": change},
        facts={"callbacks_per_step": round(found.per_step, 1) if in_loop else callbacks, "device_idle_percent": idle,
               **({"callback_op_percent": on_device} if on_device >= 1 else {}),
               **({"callback_wait_percent": waits} if waits >= 1 else {})})]


PYTHON_TRACER_EVENT = re.compile(r"^\$")
"""JAX's Python tracer names each call `$<file>:<line> <function>` (or `$<module> <name>` for a C function)."""
DEVICE_WORK_EVENT = re.compile("|".join(p.pattern for p in (DISPATCH_EVENT, SYNC_EVENT, COMPILE_EVENT,
                                                             HOST_TRANSFER_EVENT, CALLBACK_EVENT)))
"""A host event that launches, waits for, compiles or copies device work: a frame with none inside is host work."""
HOST_PUT_EVENT = re.compile(r"^DevicePut$")
"""One array put on a device from the host (jax.device_put, an argument of a jitted call, jnp.asarray)."""
SHIPPED_EVENT = re.compile(r"BufferFromHostBuffer\((?P<dtype>[a-z]+\d*)\[(?P<shape>[\d,]*)\]\)")
"""The runtime's copy of a host buffer for a device, named with its type and shape (PjRt's C API)."""
FLOAT_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8}
CONVERSION_FRAME = re.compile(r" astype$")
"""NumPy's type conversion, as the Python tracer names it (`$<unknown> astype`)."""
MIN_SHIPPED_FLOAT_BYTES = 1 << 20
"""A floating batch shipped per step at least this large: smaller arrays cost their launch, not their bytes."""
MAX_PYTHON_SHARE = 0.5
"""Above this share of its time in the user's own nested Python frames, a host function is Python per element."""
MIN_HOST_PERCENT = 30.0
"""The host's own work (or its side of the copies) takes at least this share of the step."""


def _step_ms(program: Program, starts: np.ndarray, ends: np.ndarray) -> float:
    """The time these intervals cover inside the steps' windows, in ms."""
    win_s, win_e = program.step_windows
    return float(covered(starts, ends, win_s, win_e).sum()) / PS_PER_MS if len(starts) else 0.0


def _in_steps(program: Program, events: HostEvents) -> HostEvents:
    win_s, win_e = program.step_windows
    index = np.searchsorted(win_s, events.start_ps, side="right") - 1
    inside = (index >= 0) & (events.start_ps < win_e[np.clip(index, 0, None)]) if len(win_s) else index < -1
    return events.take(np.flatnonzero(inside))


def _contains_any(frames: HostEvents, events: HostEvents) -> np.ndarray:
    """Per frame: whether one of `events` of its thread starts inside it."""
    out = np.zeros(len(frames), dtype=bool)
    for thread in np.unique(frames.thread):
        mine = np.flatnonzero(frames.thread == thread)
        starts = np.sort(events.start_ps[events.thread == thread])
        out[mine] = np.searchsorted(starts, frames.end_ps[mine], side="left") > \
            np.searchsorted(starts, frames.start_ps[mine], side="left")
    return out


def _host_work(program: Program) -> tuple[HostEvents, HostEvents]:
    """The user's functions that run on the host with no device call, sync or copy inside (outermost ones), and
    every Python-tracer frame (to look inside them)."""
    frames = program.host_events(PYTHON_TRACER_EVENT)
    user = frames.named(program.is_user_frame)
    if not user.any():
        return frames.take(np.flatnonzero(user)), frames
    busy = _contains_any(frames, program.host_events(DEVICE_WORK_EVENT))
    pure = user & ~busy
    pure &= outermost(pure, frames.thread, frames.start_ps, frames.end_ps)
    return frames.take(np.flatnonzero(pure)), frames


def _python_share(program: Program, outer: HostEvents, frames: HostEvents) -> float:
    """The share of the outer frames' time spent in the user's Python frames nested in them: their own functions
    and comprehensions called per element, where NumPy's array operations leave none."""
    user = frames.where(program.is_user_frame)
    order = np.argsort(outer.start_ps)
    starts, ends = outer.start_ps[order], outer.end_ps[order]
    at = np.searchsorted(starts, user.start_ps, side="right") - 1
    held = (at >= 0) & (user.end_ps <= ends[np.clip(at, 0, None)]) & \
        ~((user.start_ps == starts[np.clip(at, 0, None)]) & (user.end_ps == ends[np.clip(at, 0, None)]))
    total = float((ends - starts).sum())
    return float(covered(user.start_ps[held], user.end_ps[held], starts, ends).sum()) / total if total else 0.0


def _frame_line(name: str) -> tuple[str, str]:
    """("file:line", function) of a Python-tracer frame's name."""
    frame = python_frame(name)
    return (frame.short, frame.function) if frame else ("", "")


@idiom("host_preprocessing", "host_structure",
       "The host prepares each batch in NumPy and ships it as floats while the device waits",
       "{change}",
       "the host converts and normalises every element of the batch on one thread and the runtime copies (and, on a "
       "TPU, re-tiles) the wider floating array for the device, while the device idles; shipped as loaded and "
       "converted in the jitted step, the same arithmetic is one fused pass on the device over a 2-4x smaller copy",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#host-preprocessing")
def host_preprocessing(program: Program) -> list[Match]:
    """NumPy work on the host between the device's calls, and a large floating array shipped each step."""
    step = program.step
    idle = float(step.get("device_idle_percent") or 0.0)
    steps = float(step.get("steps") or 0)
    if idle < MIN_IDLE_PERCENT or steps <= 0:
        return []
    puts = _in_steps(program, program.host_events(HOST_PUT_EVENT))
    shipped = _in_steps(program, program.host_events(SHIPPED_EVENT))
    if len(puts) + len(shipped) < steps / 2:
        return []  # the step takes no array from the host
    floats: dict[str, list[int]] = {}  # each floating array shipped -> its size, once per copy
    for name in shipped.names:
        found = SHIPPED_EVENT.search(str(name))
        if found["dtype"] in FLOAT_BYTES:
            floats.setdefault(f"{found['dtype']}[{found['shape']}]", []).append(_shipped_bytes(found))
    float_bytes = sum(map(sum, floats.values())) / steps
    work, frames = _host_work(program)
    host_ms = _step_ms(program, work.start_ps, work.end_ps)
    host_percent = program.step_percent(host_ms)
    transfer_percent = float(step.get("host_transfer_percent") or 0.0)
    if not len(work) or host_percent + transfer_percent < MIN_HOST_PERCENT:
        return []
    names = work.names.astype(str)
    top = max(np.unique(names), key=lambda n: _step_ms(program, work.start_ps[names == n], work.end_ps[names == n]))
    line, function = _frame_line(top)
    top_frames = work.take(np.flatnonzero(names == top))
    if _python_share(program, top_frames, frames) > MAX_PYTHON_SHARE:
        return []  # Python per element (an input pipeline's work: its own finding), not NumPy's array operations
    inside = frames.where(CONVERSION_FRAME.search)
    converts = bool(len(inside)) and bool(_contains_any(top_frames, inside).any())
    # The profile names what was shipped where the runtime names its copies; elsewhere a conversion on the host
    # (NumPy's astype in the function) is what says the batch left the host wider than it was loaded.
    if float_bytes < MIN_SHIPPED_FLOAT_BYTES and not (converts and not len(shipped)):
        return []
    largest = max(floats, key=lambda k: floats[k][0]) if floats else ""
    what_shipped = (f"ships {largest} ({floats[largest][0] / 2 ** 20:.3g} MiB) to the device {len(floats[largest])} "
                    f"times in the {steps:g} steps profiled" if largest else
                    "converts the batch's type there (NumPy's astype) before it is put on the device")
    dtype = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}.get(largest.split("[")[0],
                                                                                          "a floating type")
    change = (f"ship the batch as it is loaded (uint8 pixels, integer ids: not {dtype}) "
              f"with jax.device_put and move what {function or 'the host function'} ({line or 'its line'}) computes "
              f"into the jitted step, written in jnp (x = images.astype(jnp.float32) / 255 and the normalisation "
              f"after it; random flips or crops from a boolean mask or jax.random), so the host neither computes "
              f"nor copies the floating batch")
    stake = round(min(idle, host_percent + transfer_percent), 2)
    return [Match(
        "host_preprocessing", stake,
        f"the host runs {function or 'a function of the program'}"
        + (f" ({line})" if line else "") + f" for {host_percent:.3g}% of the step between the device's calls, with "
        f"no device work inside it, and {what_shipped}"
        + (f"; the runtime's side of the copies holds {transfer_percent:.3g}% of the step" if transfer_percent >= 1
           else "") + f"; the device idles {idle:g}% of the step",
        line=line, function=function, params={"change": change},
        facts={"host_function_percent": host_percent, "host_transfer_percent": transfer_percent,
               "device_idle_percent": idle,
               **({"shipped_float_mib_per_step": round(float_bytes / 2 ** 20, 2), "shipped": largest} if largest
                  else {"converts_on_host": True})})]


MIN_ELEMENT_TRANSFERS = 32.0
"""Copies per step, each of one element of a list, before their count is the step's cost."""
BURST_GAP_MS = 1.0
"""Copies less than this apart are one pass over a list (each element's Python and launch between them)."""
MIN_BURST = 8
READ_EVENT = re.compile(r"^\$\S+\.py:\d+ (__float__|__int__|__index__|__bool__|item|tolist|__array__|device_get)$")
"""A read of one device value by the host (float(x), int(x), x.item(), np.asarray(x)), as the Python tracer names
it: a method of JAX's array, written in Python (NumPy's own, in C, have no file and line)."""


def _bursts(program: Program, events: HostEvents) -> list[tuple[int, int, int, int]]:
    """(first, last, start, end) of each run of events less than BURST_GAP_MS apart within one step, of at least
    MIN_BURST."""
    out, first = [], 0
    step = np.searchsorted(program.step_windows[0], events.start_ps, side="right")
    for i in range(1, len(events) + 1):
        if i == len(events) or events.start_ps[i] - events.end_ps[i - 1] > BURST_GAP_MS * PS_PER_MS or \
                step[i] != step[i - 1]:
            if i - first >= MIN_BURST:
                out.append((first, i - 1, int(events.start_ps[first]), int(events.end_ps[i - 1])))
            first = i
    return out


def _one_per_call(program: Program, puts: HostEvents) -> HostEvents:
    """The puts, those made for one jitted call's arguments counted once (the call stands for them): a call that takes
    many host arrays is one transfer of its arguments, a list converted element by element is a call per element."""
    calls = program.host_events(JITTED_CALL_EVENT)
    calls = calls.take(np.flatnonzero(outermost(np.ones(len(calls), bool), calls.thread, calls.start_ps, calls.end_ps)))
    owner = np.full(len(puts), -1, dtype=np.int64)
    for thread in np.unique(puts.thread):
        mine = np.flatnonzero(calls.thread == thread)
        index = np.flatnonzero(puts.thread == thread)
        before = np.searchsorted(calls.start_ps[mine], puts.start_ps[index], side="right") - 1
        held = (before >= 0) & (calls.end_ps[mine][np.clip(before, 0, None)] >= puts.end_ps[index])
        owner[index[held]] = mine[before[held]]
    alone = np.flatnonzero(owner < 0)
    taken = np.unique(owner[owner >= 0])
    events = HostEvents.joined([puts.take(alone), calls.take(taken)])
    return events.take(np.argsort(events.start_ps, kind="stable"))


def _caller(program: Program, frames: HostEvents, start: int, end: int) -> tuple[str, str]:
    """The user's innermost frame that holds [start, end] whole: the line that loops over the list."""
    holds = (frames.start_ps <= start) & (frames.end_ps >= end)
    for i in np.flatnonzero(holds)[np.argsort((frames.end_ps - frames.start_ps)[holds], kind="stable")]:
        if program.is_user_frame(str(frames.names[i])):
            return _frame_line(str(frames.names[i]))
    return "", ""


@idiom("per_element_transfers", "host_structure",
       "Each step moves a list between host and device one element at a time",
       "{change}",
       "every jnp.asarray or float() of one element is its own copy, with its own Python, dispatch and (for a read) "
       "wait for the device: a list of n elements costs n of them, where one array of the whole list costs one",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#per-element-transfers")
def per_element_transfers(program: Program) -> list[Match]:
    """Many small host->device puts (or device->host reads) per step, one per element of a Python list."""
    steps = float(program.step.get("steps") or 0)
    if steps <= 0:
        return []
    # The program run most is one that only stages or re-types an array (jnp.asarray's copy of one element): where
    # the device marks steps per execution, those steps are the elements, not the user's step (a loop of the user's
    # own jitted calls, each read back, is python_loop_of_calls)
    calls = calls_per_step_of(program)
    elements_as_steps = bool(calls) and calls[0][0].split("(")[0] in SETUP_OPS
    # A function run eagerly puts its Python scalars and constants op by op: those puts are eager_ops' own cost
    reads = ("read", program.host_events(READ_EVENT))  # Python-tracer events: the frames themselves only if found
    kinds = (reads,) if _eager(program, calls) else \
        (("put", _one_per_call(program, program.host_events(HOST_PUT_EVENT))), reads)
    found = []
    for kind, events in kinds:
        events = _in_steps(program, events)
        events = events.take(np.flatnonzero(outermost(np.ones(len(events), bool), events.thread, events.start_ps,
                                                      events.end_ps)))
        bursts = _bursts(program, events)
        count = sum(b[1] - b[0] + 1 for b in bursts) / steps
        if bursts and steps >= MIN_BURST * len(bursts) and elements_as_steps:
            # Steps marked per program execution (a device's Steps line) count each element's own copy program as
            # a step: a pass over the list spans many of them, and the pass is the loop's step
            count = max(count, sum(b[1] - b[0] + 1 for b in bursts) / len(bursts))
        if count >= MIN_ELEMENT_TRANSFERS:
            found.append((kind, events, bursts, count))
    if not found:
        return []
    kind, events, bursts, count = max(found, key=lambda f: f[3])
    # The first read of a run waits for the device's work, and one read stays after the change: the rest is the cost
    starts = np.array([events.end_ps[b[0]] if kind == "read" else b[2] for b in bursts], np.int64)
    burst_ms = _step_ms(program, starts, np.array([b[3] for b in bursts], np.int64))
    stake = program.step_percent(burst_ms)
    largest = max(bursts, key=lambda b: b[1] - b[0])
    # The frame that holds the pass's middle half: a copy of the step before or after can join a pass at its ends
    quarter = (largest[1] - largest[0]) // 4
    line, function = _caller(program, program.host_events(PYTHON_TRACER_EVENT),
                             int(events.start_ps[largest[0] + quarter]), int(events.end_ps[largest[1] - quarter]))
    each_us = 1e3 * burst_ms / max(sum(b[1] - b[0] + 1 for b in bursts), 1)
    where = f" at {line}" if line else ""
    if kind == "put":
        change = (f"build the batch on the host as one array (np.stack of the elements' NumPy arrays, np.asarray "
                  f"of the list) and pass it to the jitted step, or jax.device_put it once, instead of jnp.asarray "
                  f"or jnp.array of each element{where} ({count:.3g} copies per step, then a stack of them)")
        what = f"puts {count:.3g} arrays on the device per step, one per element of a list{where}"
    else:
        change = (f"read the values together: stack them inside the jitted step (jnp.stack, or return them as one "
                  f"array) and fetch them with one jax.device_get, every N steps where they are only logged, "
                  f"instead of float() or .item() on each{where} ({count:.3g} reads per step)")
        what = f"reads {count:.3g} values back from the device per step, one at a time{where}"
    return [Match(
        "per_element_transfers", stake,
        f"the step {what}: {each_us:.3g} µs each, {stake:.3g}% of the step in all",
        line=line, function=function, params={"change": change, "count": round(count, 1)},
        facts={f"{kind}s_per_step": round(count, 1), "per_element_us": round(each_us, 1),
               "element_transfers_percent": stake})]


MAX_READS_PER_STEP = 2.5
"""A read or two per step (the loss, a metric): more are a loop of calls or reads of a list (their own idioms)."""
MIN_OVERLAP_PERCENT = 10.0
TRACED_CHUNKS_MIN = 1_000
"""A host copy that records at least this many innermost events (the runtime re-tiling a batch chunk by chunk) is
timed by them, not by its span: between them the profiler records each one, which a run without it does not."""
RUNTIME_EVENT = re.compile(r"^[^$]")
"""Every host event but the Python tracer's frames: the runtime's own."""


def _copy_work_ratio(program: Program) -> float:
    """The host copies' own work over their spans in the steps (1 where no copy records many chunks): a copy that
    records each chunk it re-tiles spends most of its traced span recording them (the same copy's span varies several
    fold between steps while its chunks' time stays put)."""
    copies = _in_steps(program, program.host_events(HOST_TRANSFER_EVENT))
    copies = copies.take(np.flatnonzero(outermost(np.ones(len(copies), bool), copies.thread, copies.start_ps,
                                                  copies.end_ps)))
    if not len(copies):
        return 1.0
    events = program.host_events(RUNTIME_EVENT)
    order = np.lexsort((-events.end_ps, events.start_ps, events.thread))
    start, end, thread = events.start_ps[order], events.end_ps[order], events.thread[order]
    # innermost: the next event of its thread starts after it ends
    innermost = np.ones(len(start), dtype=bool)
    innermost[:-1] = ~((thread[1:] == thread[:-1]) & (start[1:] < end[:-1]))
    start, end, thread = start[innermost], end[innermost], thread[innermost]
    wall = work = 0.0
    for a, b, t in zip(copies.start_ps, copies.end_ps, copies.thread):
        mine = np.flatnonzero(thread == t)
        lo, hi = np.searchsorted(start[mine], [a, b])
        inside = mine[lo:hi][end[mine[lo:hi]] <= b]
        wall += float(b - a)
        work += float((end[inside] - start[inside]).sum()) if len(inside) >= TRACED_CHUNKS_MIN else float(b - a)
    return work / wall if wall > 0 else 1.0


READ_CALLS = {"__float__": "float()", "__int__": "int()", "__index__": "int()", "__bool__": "bool()",
              "item": ".item()", "tolist": ".tolist()", "__array__": "np.asarray()", "device_get": "jax.device_get"}
"""The user's call behind each read the Python tracer names (READ_EVENT's methods)."""


def _read_call(name: str) -> str:
    method = str(name).rsplit(" ", 1)[-1]
    return READ_CALLS.get(method, method)


def _step_reads(program: Program) -> HostEvents | None:
    """The reads of a device value in the steps (the outermost READ_EVENT frames), where every step reads, but for one
    at the capture's edge (its read fell outside the capture), and at most MAX_READS_PER_STEP times; else None."""
    steps = float(program.step.get("steps") or 0)
    # A read of a value (float(loss), np.asarray of a metric): a benchmark's block_until_ready per step is a
    # measurement's wait, not a read the program needs
    waits = _in_steps(program, program.host_events(READ_EVENT))
    waits = waits.take(np.flatnonzero(outermost(np.ones(len(waits), bool), waits.thread, waits.start_ps,
                                                waits.end_ps)))
    if steps <= 0 or not max(1.0, min(0.9 * steps, steps - 1)) <= len(waits) <= MAX_READS_PER_STEP * steps:
        return None
    return waits


@idiom("read_each_step", "host_structure",
       "The loop reads a value back every step, so the host's work and the device's never overlap",
       "{change}",
       "JAX dispatches a jitted call and returns at once, so the host prepares the next batch (and the runtime copies "
       "it to the device) while the device runs this one; a read of a result (float(loss), .item(), np.asarray) waits "
       "for the device to finish first, so the host's work, the copy and the device's work run one after the other",
       gain=(0.8, 1.0), measured="docs/reference/measurements.md#read-each-step",
       alternatives=("read the previous step's value instead of this one's: jax.copy_to_host_async(value) after the "
                     "call and float() of it a step later, when its copy has long finished",))
def read_each_step(program: Program) -> list[Match]:
    """One blocking read per step, with the host's own work, its copies to the device and the device's work in
    series around it: without the read they overlap, and a step takes the longest of them."""
    step = program.step
    steps = float(step.get("steps") or 0)
    dispatches = float(step.get("dispatches_per_step_mean") or 0.0)
    idle = float(step.get("device_idle_percent") or 0.0)
    host_work = float(step.get("host_other_percent") or 0.0)
    copy_span = float(step.get("host_transfer_percent") or 0.0)
    device = 100.0 - idle
    if steps <= 0 or dispatches >= MIN_CALLS_PER_STEP:
        return []
    waits = _step_reads(program)
    if waits is None:
        return []
    # The copies as long as their own work, the step as long as it would be with them so (the profiler's recording
    # of a copy's chunks is no part of the program's time)
    copy_work = copy_span * _copy_work_ratio(program) if copy_span > 0 else 0.0
    step_at_work = 100.0 - copy_span + copy_work
    parts = {"host": host_work, "copy": copy_work, "device": device}
    if step_at_work <= 0 or 100 * min(host_work + copy_work, device) / step_at_work < MIN_OVERLAP_PERCENT:
        return []
    reads = len(waits) / steps
    line, function = _caller(program, program.host_events(PYTHON_TRACER_EVENT), int(waits.start_ps[0]),
                             int(waits.end_ps[0]))
    read = _read_call(waits.names[0])
    # Overlapped, a step takes the longest of the three; the others' time leaves it
    stake = round(100 * (sum(parts.values()) - max(parts.values())) / step_at_work, 2)
    if stake < MIN_OVERLAP_PERCENT:
        return []
    change = (f"stop reading the value back every step{f' at {line}' if line else ''} ({read}): keep it on the "
              f"device (append the array to a list, or accumulate it in the step's state) and read it every N steps "
              f"with one jax.device_get, checking jnp.isfinite there or inside the step, so the host prepares the "
              f"next batch while the device runs this one")
    shares = {k: round(100 * v / step_at_work, 3) for k, v in parts.items()}
    copies = (f", the runtime's copies of its inputs to the device {shares['copy']:.3g}%"
              + (" (timed by their own work: the profiler's recording of their chunks is left out)"
                 if copy_work < 0.5 * copy_span else "") if copy_work >= 1 else "")
    return [Match(
        "read_each_step", stake,
        f"the loop reads a value back from the device {'once' if 0.7 <= reads < 1.5 else f'{reads:.3g} times'} per "
        f"step ({read}"
        + (f", in {function} at {line}" if line else "") + f"); the host's own work between the device's calls "
        f"holds {shares['host']:.3g}% of the step{copies} and the device computes {shares['device']:.3g}% of it, one "
        f"after the other",
        line=line, function=function, params={"change": change},
        facts={"reads_per_step": round(reads, 2), "host_work_percent": shares["host"],
               "copy_work_percent": shares["copy"], "device_busy_percent": shares["device"]})]


MIN_READ_BYTES = 1 << 20
"""An array read back per step at least this large: smaller reads cost their wait, not their bytes."""
MIN_REDUCTION_OF_READ = 0.25
"""The host's reduction after a read takes at least this share of the read's own time: a pass over the whole array the
copy wrote reads as many bytes as it wrote (a reduction of a small slice of it, or of another array, takes far less)."""
REDUCTION_FRAME = re.compile(r"^\$(<unknown>|numpy|fromnumeric\.py:\d+|_methods\.py:\d+) _?(?P<op>nanargmax|nanargmin|"
                             r"argmax|argmin|amax|amin|max|min|sum|mean|argsort|argpartition|sort|partition|any|all|"
                             r"count_nonzero)$")
"""A NumPy reduction, sort or partition as the Python tracer names it: an array's method in C (`$<unknown> argmax`),
NumPy's function (`$fromnumeric.py:1229 argmax`) or a method's Python wrapper (`$_methods.py:41 _amax`)."""
ON_DEVICE = {"argsort": "jax.lax.top_k(y, k)", "argpartition": "jax.lax.top_k(y, k)",
             "partition": "jax.lax.top_k(y, k)", "sort": "jax.lax.top_k(y, k) (or jnp.sort(y, axis=-1))",
             "amax": "jnp.max(y, axis=-1)", "amin": "jnp.min(y, axis=-1)"}
"""The jnp call for a NumPy reduction whose name differs (a sort or partition kept to its top k: jax.lax.top_k); the
others are jnp's of the same name, along the axis NumPy reduced."""


MODULE_NAME_UNSAFE = re.compile(r"[^\w.-]")
"""What JAX replaces by `_` in a jitted function's name to name its program (`<lambda>`: `jit__lambda`)."""


def _module_called(program: Program, function: str) -> HloModule | None:
    """The program a jitted function's call runs (PjitFunction(<function>)): `jit_` and its name made safe, trailing
    underscores dropped (as the compiled program's name drops them)."""
    name = f"jit_{MODULE_NAME_UNSAFE.sub('_', function)}".rstrip("_")
    return next((m for m in program.session.hlo_modules if m.name.rstrip("_") == name), None)


def _last_call_before(calls: HostEvents, thread: int, start: int) -> int | None:
    """The index of the last call of the thread that began before `start`, or None."""
    mine = np.flatnonzero((calls.thread == thread) & (calls.start_ps < start))
    return int(mine[-1]) if len(mine) else None


def _output(module: HloModule | None) -> tuple[str, int]:
    """The largest array the module returns: its shape ('f32[2048,21843]') and bytes; ('', 0) where unknown."""
    entry = module.computations.get(module.entry) if module is not None else None
    root = entry.by_name.get(entry.root) if entry is not None else None
    if root is None:
        return "", 0
    arrays = root.tuple_shapes if root.dtype == "tuple" else ((root.dtype, root.dims),)
    if not arrays:
        return "", 0
    dtype, dims = max(arrays, key=lambda a: elements(a[1]) * DTYPE_BYTES.get(a[0], 4))
    return f"{dtype}[{','.join(map(str, dims))}]", elements(dims) * DTYPE_BYTES.get(dtype, 4)


@idiom("reduced_on_host", "host_structure",
       "Each step copies a large result to the host only to reduce it there",
       "{change}",
       "a read copies the whole array across the host link and NumPy then reads every element of it again on one "
       "host thread, while the device idles; reduced in the jitted function, the device reads the array once from its "
       "own memory and only the reduction's small result crosses the link",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#reduced-on-host", platforms=("TPU", "GPU"),
       alternatives=("where the host must keep the whole array, copy it in a narrower type (astype(jnp.bfloat16) in "
                     "the jitted function: half the bytes; it can change ties) or start its copy with "
                     "jax.copy_to_host_async(y) and read it a step later, so the copy overlaps the next step's work",))
def reduced_on_host(program: Program) -> list[Match]:
    """Every step reads a large array a jitted call returned (np.asarray, jax.device_get) and runs a NumPy reduction
    over it (argmax, max, sum, a sort or partition for the top k) before the next call: the copy and the host's pass
    hold the step, where the device could reduce it and return a small result."""
    reads = _step_reads(program)
    if reads is None:
        return []
    frames = program.host_events(PYTHON_TRACER_EVENT)
    calls = program.host_events(JITTED_CALL_EVENT)
    calls = calls.take(np.flatnonzero(outermost(np.ones(len(calls), bool), calls.thread, calls.start_ps, calls.end_ps)))
    # The host's work after each read lasts until its thread next launches, waits for or copies device work
    device_work = program.host_events(DEVICE_WORK_EVENT)
    reductions = _in_steps(program, frames.where(REDUCTION_FRAME.search))
    reductions = reductions.take(np.flatnonzero(outermost(np.ones(len(reductions), bool), reductions.thread,
                                                          reductions.start_ps, reductions.end_ps)))
    # Each read of a large array a jitted call returned, and the reductions its thread runs after it
    held = np.zeros(len(reductions), dtype=bool)
    large = np.zeros(len(reads), dtype=bool)
    outputs: dict[str, tuple[int, str, str]] = {}  # shape -> its bytes, the jitted function, its program
    for i in range(len(reads)):
        thread, end = reads.thread[i], reads.end_ps[i]
        call = _last_call_before(calls, thread, int(reads.start_ps[i]))
        if call is None:
            continue
        function = str(calls.names[call]).removeprefix("PjitFunction(").removesuffix(")")
        module = _module_called(program, function)
        shape, size = _output(module)
        if size < MIN_READ_BYTES:
            continue
        large[i] = True
        outputs[shape] = (size, function, module.name)
        later = device_work.start_ps[(device_work.thread == thread) & (device_work.start_ps >= end)]
        until = int(later.min()) if len(later) else int(program.step_windows[1][-1])
        held |= (reductions.thread == thread) & (reductions.start_ps >= end) & (reductions.end_ps <= until)
    if not held.any():
        return []
    shape = max(outputs, key=lambda k: outputs[k][0])
    read_bytes, stem, module_name = outputs[shape]
    reads = reads.take(np.flatnonzero(large))
    reduced = reductions.take(np.flatnonzero(held))
    read_ms = _step_ms(program, reads.start_ps, reads.end_ps)
    reduce_ms = _step_ms(program, reduced.start_ps, reduced.end_ps)
    if reduce_ms < MIN_REDUCTION_OF_READ * read_ms:
        return []
    stake = program.step_percent(read_ms + reduce_ms)
    if stake < MIN_OVERLAP_PERCENT:
        return []
    names = reduced.names.astype(str)
    top = max(np.unique(names), key=lambda n: _step_ms(program, reduced.start_ps[names == n],
                                                       reduced.end_ps[names == n]))
    op = REDUCTION_FRAME.search(top)["op"]
    on_device = ON_DEVICE.get(op, f"jnp.{op}(y, axis=-1)")
    # Reduced on the device, the array is read once from its memory, on every read
    roof = program.roof_ms(hbm_bytes=read_bytes)
    needed = program.step_percent(roof * len(reads)) if roof is not None else None
    line, function = _caller(program, frames, int(reads.start_ps[0]), int(reads.end_ps[0]))
    read = _read_call(reads.names[0])
    steps = float(program.step.get("steps") or 0)
    mib = read_bytes / 2 ** 20
    where = f" at {line}" if line else ""
    change = (f"take the {op} on the device: return {on_device} from {stem} (y the {shape} array it returns now, "
              f"reduced along the axis NumPy reduces), or from a jitted function that calls {stem}, and read that "
              f"small result{where} instead of the whole array ({mib:.3g} MiB); where the host then compares it with "
              f"labels and counts the hits, pass the labels in and return the count too (jnp.sum(pred == labels)), "
              f"one number per step. This holds if nothing else on the host reads the whole array")
    return [Match(
        "reduced_on_host", stake,
        f"each step reads {stem}'s output {shape} ({mib:.3g} MiB) back to the host ({read}"
        + (f" in {function} at {line}" if line else "")
        + f", {'once' if 0.7 <= len(reads) / steps < 1.5 else f'{len(reads) / steps:.3g} times'} per step), taking "
        f"{program.step_percent(read_ms):.3g}% of the step, and NumPy's {op} then runs over it on the host for "
        f"{program.step_percent(reduce_ms):.3g}% of the step before the next call; the device computes "
        f"{100 - float(program.step.get('device_idle_percent') or 0.0):.3g}% of the step",
        module=module_name, line=line, function=function, needed_percent=needed,
        params={"change": change, "reduction": op},
        facts={"read_mib_per_step": round(mib * len(reads) / steps, 2), "read_percent": program.step_percent(read_ms),
               "host_reduction_percent": program.step_percent(reduce_ms), "read_shape": shape})]


MIN_UPLOADED_WEIGHT_BYTES = 1 << 20
"""Weights shipped per step at least this large: smaller arrays cost their launch, not their bytes."""


def _weight_parameters(program: Program, module: HloModule) -> dict[int, HloInstruction]:
    """The program's entry parameters that a dot or a convolution reads as its weights (a dot's right-hand operand, a
    convolution's kernel), through fusions and re-typing: position -> the parameter."""
    graph = next(g for g in program.graphs if g.module is module)
    out: dict[int, HloInstruction] = {}
    for site in graph.sites():
        if site.instruction.opcode in ("dot", "convolution"):
            origin = graph.origin(graph.operand(site, 1))
            if origin is not None and origin.computation.name == module.entry and \
                    origin.instruction.opcode == "parameter" and origin.instruction.dtype in FLOAT_BYTES:
                out[origin.instruction.parameter_number] = origin.instruction
    return out


@idiom("weights_uploaded_each_step", "host_structure",
       "The weights are copied from the host to the device on every step",
       "{change}",
       "a jitted call given NumPy arrays copies each of them to the device before the program can start, on every "
       "call: weights kept as NumPy cross the host link every step, where device arrays made once stay in the "
       "device's memory between calls",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#weights-uploaded-each-step")
def weights_uploaded_each_step(program: Program) -> list[Match]:
    """The step's program takes its weights (the operands its matmuls multiply by) from host arrays on every call."""
    steps = float(program.step.get("steps") or 0)
    calls = [(k, n) for k, n in calls_per_step_of(program) if k.split("(")[0] not in SETUP_OPS]
    if steps <= 0 or not calls:
        return []
    key, _ = calls[0]
    module = _module(program, key)
    if module is None:
        return []
    weights = _weight_parameters(program, module)
    weight_bytes = sum(nbytes(w) for w in weights.values())
    if not weights or weight_bytes < MIN_UPLOADED_WEIGHT_BYTES:
        return []
    calls_of, shipped, counts, shipped_bytes = _shipped_in_calls(program, module)
    if len(shipped):  # the runtime names each copy's type and shape: the weights' own shapes shipped on every call
        needed: dict[str, int] = {}
        for w in weights.values():
            needed[w.shape_text.split("{")[0]] = needed.get(w.shape_text.split("{")[0], 0) + 1
        uploaded = sum(nbytes(w) for w in weights.values() if counts.get(w.shape_text.split("{")[0], 0)
                       >= needed[w.shape_text.split("{")[0]] * len(calls_of))
        events = shipped
    else:  # copies named without shapes (a CPU's): every weight operand's worth of host arrays put per call, and
        # more than the program's other arguments (a batch from NumPy) could account for alone
        puts = _in_steps(program, program.host_events(HOST_PUT_EVENT))
        inside = puts.take(np.flatnonzero(_within_any(puts, calls_of)))
        others = len(_entry_shapes(module)) - len(weights)
        uploaded = weight_bytes if len(weights) >= 2 and len(inside) >= max(len(weights), others + 1) * steps else 0
        events = inside
    if uploaded < MIN_UPLOADED_WEIGHT_BYTES:
        return []
    put_percent = program.step_percent(_step_ms(program, events.start_ps, events.end_ps))
    stake = max(float(program.step.get("host_transfer_percent") or 0.0), put_percent)
    # Where the device records its program's executions, a call's program starts only once its arguments have
    # crossed: the device's wait over the loop's span, the weights' share of the bytes shipped, is what they cost
    # (the copies' own host events show only the re-tiling, not the link's transfer)
    wait = _device_wait_percent(program, module, calls_of)
    share = min(uploaded * len(calls_of) / shipped_bytes, 1.0) if shipped_bytes else 1.0
    if wait is not None:
        stake = max(stake, wait * share)
    stake = round(min(stake, 100.0), 2)
    line, function = _calling_line(program, calls_of)
    mib = uploaded / 2 ** 20
    shapes = ", ".join(dict.fromkeys(w.shape_text.split("{")[0] for w in weights.values()))
    where = f" at {line}" if line else ""
    change = (f"put the weights on the device once, before the loop: params = jax.device_put(params) (a pytree of "
              f"NumPy arrays becomes one of device arrays), and pass those{where}, keeping the updated ones the step "
              f"returns, so the {len(weights)} weight arrays ({mib:.3g} MiB) stop crossing the host link every step")
    waits = (f"; the device waits {wait:.3g}% of the loop's time for its calls' arguments, "
             f"{100 * share:.3g}% of whose bytes are these weights" if wait is not None else "")
    return [Match(
        "weights_uploaded_each_step", stake,
        f"the program {module.name} multiplies by {len(weights)} weight operands ({shapes}; {mib:.3g} MiB) that "
        f"are copied from host arrays on every call{where} ({len(calls_of)} calls in the capture){waits}: the "
        f"copies hold {stake:.3g}% of the step",
        module=key, line=line, function=function, params={"change": change},
        facts={"weight_operands": len(weights), "uploaded_mib_per_step": round(mib, 2),
               "host_transfer_percent": round(max(float(program.step.get("host_transfer_percent") or 0.0),
                                                  put_percent), 2),
               **({"device_wait_percent": round(wait, 2), "weight_share_of_shipped_percent": round(100 * share, 1),
                   "loop_step_ms": round(_loop_step_ms(program, module, calls_of), 4)}
                  if wait is not None else {})})]


def _shipped_in_calls(program: Program, module: HloModule) -> tuple[HostEvents, HostEvents, dict[str, int], int]:
    """The module's jitted calls, the host-buffer copies the runtime makes inside them (named with their type and
    shape; none on a CPU), how many of each type and shape, and their bytes."""
    calls_of = _program_calls(program, module)
    shipped = program.host_events(SHIPPED_EVENT)
    shipped = shipped.take(np.flatnonzero(_within_any(shipped, calls_of)))
    counts: dict[str, int] = {}
    total = 0
    for name in shipped.names.astype(str):
        found = SHIPPED_EVENT.search(name)
        counts[f"{found['dtype']}[{found['shape']}]"] = counts.get(f"{found['dtype']}[{found['shape']}]", 0) + 1
        total += _shipped_bytes(found)
    return calls_of, shipped, counts, total


def _calling_line(program: Program, calls_of: HostEvents) -> tuple[str, str]:
    """The user's line and function around the program's first call the steps hold (where calls run ahead of the
    device, none ending inside a step, the first call); ("", "") where the capture holds no call."""
    if not len(calls_of):
        return "", ""
    first = next((i for i in range(len(calls_of)) if len(program.step_windows[0])
                  and calls_of.end_ps[i] >= program.step_windows[0][0]), 0)
    return _caller(program, program.host_events(PYTHON_TRACER_EVENT), int(calls_of.start_ps[first]),
                   int(calls_of.end_ps[first]))


def _step_program_shipped(program: Program) -> tuple[HloModule, HostEvents, dict[str, int], int] | None:
    """The program the steps call most, its calls, and the host-buffer copies made inside them (how many of each type
    and shape, their bytes); None where no call ships a named copy."""
    calls = [(k, n) for k, n in calls_per_step_of(program) if k.split("(")[0] not in SETUP_OPS]
    module = _module(program, calls[0][0]) if calls else None
    if module is None:
        return None
    calls_of, _, counts, shipped_bytes = _shipped_in_calls(program, module)
    return (module, calls_of, counts, shipped_bytes) if len(calls_of) and shipped_bytes else None


MIN_UPLOADED_MASK_BYTES = 16 << 20
"""A mask shipped per call at least this large: its copy, not its launch, is what the call waits for."""
MASK_USES = frozenset({"add", "subtract", "multiply", "select", "maximum", "minimum", "compare", "and", "or", "not"})
"""What reads a mask or an additive bias: one element of it per element of the array it masks."""


def _mask_argument(graph, parameter: HloInstruction) -> tuple[list[Site], str] | None:
    """The ops that read an argument, where each uses it only element by element against a larger array (a mask or
    an additive bias broadcast over it): (those ops, the largest array they make); None where anything else reads
    it (a matmul, a gather, a reduction: it is data, not a mask)."""
    entry = graph.module.computations[graph.module.entry]
    uses = list(graph.users(Site(entry, parameter)))
    if not uses or any(u.instruction.opcode not in MASK_USES for u in uses):
        return None
    widest = max(uses, key=lambda u: elements(u.instruction.dims))
    if elements(widest.instruction.dims) <= elements(parameter.dims):
        return None
    return uses, widest.instruction.shape_text.split("{")[0]


@idiom("mask_uploaded_each_step", "host_structure",
       "A large mask is copied from the host to the device on every step",
       "{change}",
       "a jitted call given a NumPy array copies it to the device before the program can start, on every call: a "
       "mask or bias of one value per pair of positions is the square of what it is made from, and built inside the "
       "jitted function it is a few fused compares that never cross the host link",
       gain=(0.5, 0.75), measured="docs/reference/measurements.md#mask-uploaded-each-step",
       alternatives=("where the mask must come from the host, pass it as bool (jnp.where(mask, 0.0, -1e9) inside "
                     "the jitted function makes the bias): a quarter of a float32 mask's bytes; its premise that the "
                     "copy, not the device's work, is what the call waits for",
                     "where the mask is the same on every step, put it on the device once, before the loop "
                     "(jax.device_put(mask)), and pass that array"),
       platforms=("TPU", "GPU"))
def mask_uploaded_each_step(program: Program) -> list[Match]:
    """The step's program takes a large argument from a host array on every call and uses it only element by element
    against a larger array (an attention mask or bias broadcast over heads), where it could be built on the device
    from what it is made of."""
    found = _step_program_shipped(program)
    if found is None:
        return []
    module, calls_of, counts, shipped_bytes = found
    graph = next(g for g in program.graphs if g.module is module)
    entry = module.computations[module.entry]
    out = []
    for parameter in (i for i in entry.instructions if i.opcode == "parameter"):
        shape = parameter.shape_text.split("{")[0]
        if nbytes(parameter) < MIN_UPLOADED_MASK_BYTES or counts.get(shape, 0) < len(calls_of) or \
                parameter.parameter_number in _weight_parameters(program, module):
            continue
        found = _mask_argument(graph, parameter)
        wait = _device_wait_percent(program, module, calls_of)
        if found is None or wait is None:
            continue
        uses, widest = found
        share = min(nbytes(parameter) * len(calls_of) / shipped_bytes, 1.0)
        stake = round(min(wait * share, 100.0), 2)
        if stake < MIN_MASK_STAKE_PERCENT:
            continue
        line, function = _calling_line(program, calls_of)
        use_line, use_function = next((program.line_of(graph, u) for u in uses if program.line_of(graph, u)[0]),
                                      ("", ""))
        name = parameter.op_name or re.sub(r"\.\d+$", "", parameter.name)
        # Integer arguments shipped with it whose shape its leading dimensions share: what such a mask is made from
        # (ids per position, compared pairwise)
        leading = shape.split("]")[0].rsplit(",", 1)[0] + "]"
        sources = [s for s in _entry_shapes(module) if s != shape and s.split("[")[0][0] in "su"
                   and "[" + s.split("[", 1)[1] == "[" + leading.split("[", 1)[1] and counts.get(s, 0) >= len(calls_of)]
        mib = nbytes(parameter) / 2 ** 20
        opcodes = ", ".join(sorted({opcode_name(u.instruction) for u in uses}))
        made_of = (f" from the {sources[0]} argument{'s' if len(sources) > 1 else ''} shipped with it (ids per "
                   f"position, {_shape_bytes(sources[0]) * len(sources) / 2 ** 10:,.0f} KiB)" if sources else "")
        stem = module.name.removeprefix("jit_")
        change = (f"stop passing the {shape} {name} to {stem}" + (f" at {line}" if line else "")
                  + f"; pass what it is made of instead and build it inside the jitted function{made_of}, e.g. "
                  f"same = ids[:, :, None] == ids[:, None, :]; {name} = jnp.where(same, 0.0, -1e9), so "
                  f"{mib:,.0f} MiB stop crossing the host link every step")
        out.append(Match(
            "mask_uploaded_each_step", stake,
            f"the program {module.name} takes {name} ({shape}, {mib:,.0f} MiB) from a host array on every call "
            f"({len(calls_of)} calls in the capture)" + (f" at {line}" if line else "")
            + f", and uses it only element by element: {len(uses)} elementwise ops ({opcodes}) making {widest}"
            + (f" at {use_line}" if use_line else "")
            + f"; the device waits {wait:.3g}% of the loop's time for its calls' arguments, {100 * share:.3g}% of "
            f"whose bytes are this array",
            module=module.name, line=line or use_line, function=function or use_function,
            params={"change": change},
            facts={"mask_shape": shape, "mask_mib": round(mib, 1), "device_wait_percent": round(wait, 2),
                   "mask_share_of_shipped_percent": round(100 * share, 1), "made_of": sources[:2],
                   "loop_step_ms": round(_loop_step_ms(program, module, calls_of), 4)}))
    return out


MIN_UPLOADED_DATA_BYTES = 16 << 20
"""Data arguments shipped per call at least this large together (each of at least MIN_UPLOADED_WEIGHT_BYTES): their
copy, not the launch, is what the call waits for."""
JNP_TYPES = {"f64": "float64", "f32": "float32", "bf16": "bfloat16", "f16": "float16", "s64": "int64", "s32": "int32",
             "s16": "int16", "s8": "int8", "u8": "uint8", "u32": "uint32", "pred": "bool_"}


@idiom("data_uploaded_each_step", "host_structure",
       "Large data arrays are copied from the host to the device on every call",
       "{change}",
       "a jitted call given NumPy arrays converts them to the program's types and copies them to the device before "
       "the program can start, on every call; arrays put on the device once stay in its memory between calls, and "
       "each call then only launches the program; its premise that the arrays are the same on every call (a graph, a "
       "dataset, a table the process keeps)",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#data-uploaded-each-step",
       alternatives=("where each step's arrays are new (a batch), put the next one on the device while this step runs "
                     "(jax.device_put of the next batch before this step's result is read: double buffering)",
                     "casting the arrays on the host once (x.astype(np.float32)) saves only the conversion: they are "
                     "still copied on every call"),
       platforms=("TPU", "GPU"))
def data_uploaded_each_step(program: Program) -> list[Match]:
    """The step's program takes large arguments from host arrays on every call that are neither the weights its
    matmuls multiply by (weights_uploaded_each_step) nor a mask used element by element (mask_uploaded_each_step):
    the data it reads, shipped again with every call."""
    found = _step_program_shipped(program)
    if found is None:
        return []
    module, calls_of, counts, shipped_bytes = found
    graph = next(g for g in program.graphs if g.module is module)
    weights = _weight_parameters(program, module)
    entry = module.computations[module.entry]
    data = [i for i in entry.instructions if i.opcode == "parameter" and i.parameter_number not in weights
            and nbytes(i) >= MIN_UPLOADED_WEIGHT_BYTES and counts.get(i.shape_text.split("{")[0], 0) >= len(calls_of)
            and _mask_argument(graph, i) is None]
    uploaded = sum(nbytes(i) for i in data)
    # Arrays the host builds between the calls (NumPy preprocessing each batch) are new on every call: that is
    # host_preprocessing's, and putting them on the device once is no change to make
    wait = _device_wait_percent(program, module, calls_of) if uploaded >= MIN_UPLOADED_DATA_BYTES and \
        not host_preprocessing(program) else None
    if wait is None:
        return []
    share = min(uploaded * len(calls_of) / shipped_bytes, 1.0)
    stake = round(min(wait * share, 100.0), 2)
    if stake < MIN_MASK_STAKE_PERCENT:
        return []
    line, function = _calling_line(program, calls_of)
    names = [i.op_name or re.sub(r"\.\d+$", "", i.name) for i in data]
    shapes = [i.shape_text.split("{")[0] for i in data]
    puts = "; ".join(f"{n} = jnp.asarray({n}, jnp.{JNP_TYPES.get(i.dtype, i.dtype)})" for n, i in zip(names, data))
    mib = uploaded / 2 ** 20
    stem = module.name.removeprefix("jit_")
    change = (f"put {', '.join(names)} on the device once, at start-up before the loop ({puts}, in the program's own "
              f"types: a float64 or int64 host array is converted once, not on every call), and pass those device "
              f"arrays to {stem}"
              + (f" at {line}" if line else "") + f", so {mib:,.0f} MiB stop crossing the host link on every call")
    return [Match(
        "data_uploaded_each_step", stake,
        f"the program {module.name} takes {len(data)} large argument{'s' if len(data) > 1 else ''} "
        f"({', '.join(f'{n} {s}' for n, s in zip(names, shapes))}; {mib:,.0f} MiB) from host arrays on every call "
        f"({len(calls_of)} calls in the capture)" + (f" at {line}" if line else "")
        + f"; the device waits {wait:.3g}% of the loop's time for its calls' arguments, {100 * share:.3g}% of whose "
        f"bytes are these arrays",
        module=module.name, line=line, function=function, params={"change": change},
        facts={"data_arguments": shapes, "uploaded_mib_per_call": round(mib, 1), "device_wait_percent": round(wait, 2),
               "data_share_of_shipped_percent": round(100 * share, 1),
               "loop_step_ms": round(_loop_step_ms(program, module, calls_of), 4)})]


MIN_MASK_STAKE_PERCENT = 5.0
"""A mask's copies holding less of the loop than this are not what it waits for."""


def _shape_bytes(shape: str) -> int:
    """The bytes of an array written like 's32[32,1024]'."""
    dtype, dims = shape.split("[", 1)
    return DTYPE_BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.rstrip("]").split(",") if d]))


def _program_calls(program: Program, module: HloModule) -> HostEvents:
    """The Python calls of the module's jitted function in the capture, outermost ones (the runtime nests a call's
    events in one of the same name)."""
    stem = module.name.removeprefix("jit_")
    calls = program.host_events(JITTED_CALL_EVENT).where(lambda n: n == f"PjitFunction({stem})")
    return calls.take(np.flatnonzero(outermost(np.ones(len(calls), bool), calls.thread, calls.start_ps,
                                               calls.end_ps)))


def _shipped_bytes(found: re.Match) -> int:
    """The bytes of one copy the runtime names with its type and shape."""
    return _shape_bytes(f"{found['dtype']}[{found['shape']}]")


def _device_wait_percent(program: Program, module: HloModule, calls: HostEvents) -> float | None:
    """The share of the loop's span (the program's first call to the end of its last execution on a device) in
    which no device runs it: where calls are dispatched ahead, each execution waits for its arguments. None where
    no device plane records the program's executions (a TPU's `XLA Modules` line does), or only one."""
    span = _loop_span_ps(program, module, calls)
    if span is None:
        return None
    (low, high), (starts, ends) = span
    busy = float(covered(starts, ends, np.array([low]), np.array([high]))[0])
    return 100.0 * (1.0 - busy / (high - low))


def _loop_step_ms(program: Program, module: HloModule, calls: HostEvents) -> float | None:
    """The loop's own period: its span over its calls, where the device's step marks (one execution to the next)
    are shorter than what the user's loop takes per call because each execution first waits for its arguments."""
    span = _loop_span_ps(program, module, calls)
    return None if span is None else (span[0][1] - span[0][0]) / len(calls) / 1e9


def _loop_span_ps(program: Program, module: HloModule,
                  calls: HostEvents) -> tuple[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None:
    """(first call's start, last execution's end) of the module's calls, with its executions' (starts, ends) on
    the devices; None where no device plane records two executions or more."""
    starts, ends = [], []
    for plane in program.session.device_planes(with_events=True):
        spans = module_spans(plane)
        if spans is not None:
            mine = spans[2] == module.name
            starts.append(spans[0][mine])
            ends.append(spans[1][mine])
    if not starts or sum(map(len, starts)) < 2 or not len(calls):
        return None
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    low, high = int(calls.start_ps.min()), int(ends.max())
    return None if high <= low else ((low, high), (starts, ends))


def _within_any(events: HostEvents, frames: HostEvents) -> np.ndarray:
    """Per event: whether one of `frames` of its thread holds it whole."""
    out = np.zeros(len(events), dtype=bool)
    for thread in np.unique(events.thread):
        mine = np.flatnonzero(frames.thread == thread)
        if not len(mine):
            continue  # no frame on this thread holds any of its events
        order = mine[np.argsort(frames.start_ps[mine], kind="stable")]
        index = np.flatnonzero(events.thread == thread)
        at = np.searchsorted(frames.start_ps[order], events.start_ps[index], side="right") - 1
        held = (at >= 0) & (frames.end_ps[order][np.clip(at, 0, None)] >= events.end_ps[index])
        out[index] = held
    return out


BOOLEAN_INDEX_FRAME = re.compile(r"^\$indexing\.py:\d+ _?expand_bool_indices$")
"""JAX turning a boolean index (x[mask]) into the indices of the mask's true elements, as the Python tracer names it:
it needs the mask's values on the host (NumPy's nonzero), so a mask on the device is read back first."""
NUMPY_READ_FRAME = re.compile(r"^\$numpy (asarray|array)$")
"""NumPy reading an array into host memory, as the Python tracer names it (a C function of the numpy module)."""
MIN_MASK_TRIPS = 4.0
"""Boolean indexes whose mask is read back, per call of the function looping over them, before the loop is the cost."""
GROUP_REDUCTIONS = {
    "_mean": ("mean", "sums = jax.ops.segment_sum(x, labels, num_segments={groups}); means = sums / "
              "jnp.bincount(labels, length={groups})[:, None]", "jnp.mean(x, axis=0, where=mask[:, None])"),
    "_reduce_sum": ("sum", "sums = jax.ops.segment_sum(x, labels, num_segments={groups})",
                    "jnp.sum(x, axis=0, where=mask[:, None])"),
    "_reduce_max": ("max", "maxima = jax.ops.segment_max(x, labels, num_segments={groups})",
                    "jnp.max(x, axis=0, where=mask[:, None], initial=-jnp.inf)"),
    "_reduce_min": ("min", "minima = jax.ops.segment_min(x, labels, num_segments={groups})",
                    "jnp.min(x, axis=0, where=mask[:, None], initial=jnp.inf)"),
}
"""The reduction each trip applies to the rows it selected (jnp's jitted function, by the name its call carries): the
one segment reduction over the labels that computes every group's at once, and the masked reduction that keeps the
loop's shapes static."""


def _innermost_holders(frames: HostEvents, events: HostEvents) -> np.ndarray:
    """Per event: the index of the innermost of `frames` (of its thread) that holds it whole, -1 where none."""
    out = np.full(len(events), -1, dtype=np.int64)
    for i in range(len(events)):
        holds = np.flatnonzero((frames.thread == events.thread[i]) & (frames.start_ps <= events.start_ps[i])
                               & (frames.end_ps >= events.end_ps[i]))
        if len(holds):
            out[i] = holds[np.argmax(frames.start_ps[holds])]
    return out


def _comprehension(name: str) -> bool:
    """A frame of a comprehension, lambda or generator expression (`<listcomp>`): a loop, not a function of its own."""
    return _frame_line(name)[1].startswith("<")


@dataclass
class FrameLoop:
    """A user's loop seen from the Python tracer's frames: the user frames that hold a repeated event (each a loop, or
    the function whose body loops), how many of the events each holds, the loops' time and the time of the calls of
    the function they run in."""

    user: HostEvents  # the user's frames around the events
    loops: np.ndarray  # indices into `user`: each loop's frame
    trips: np.ndarray  # per loop: the events it holds
    loop_ps: float
    step_ps: float
    steps: int  # the calls of the function the loops run in
    step_function: str
    loop_name: str


def _frame_loop(program: Program, frames: HostEvents, events: HostEvents, min_trips: float) -> FrameLoop | None:
    """The user's loops that hold `events` (at least min_trips each on average), timed from the first event to the
    last (one trip's share added for the time before the first), within the function that runs them."""
    user = frames.where(program.is_user_frame)
    user = user.take(np.flatnonzero(_contains_any(user, events)))  # the frames around the events alone
    holder = _innermost_holders(user, events)
    loops, trips = np.unique(holder[holder >= 0], return_counts=True)
    if not len(loops) or trips.mean() < min_trips:
        return None
    loop_name = str(user.names[loops[0]])
    # The function the loop runs in: the comprehension's caller, or the function whose body loops
    steps = _innermost_holders(user.where(lambda n: not _comprehension(n)), user.take(loops)) \
        if _comprehension(loop_name) else np.arange(len(loops))
    outer = user.where(lambda n: not _comprehension(n)) if _comprehension(loop_name) else user.take(loops)
    loop_ps = 0.0
    for i, n in zip(loops, trips):
        mine = np.flatnonzero(holder == i)
        span = float(events.end_ps[mine].max() - events.start_ps[mine].min()) * n / max(n - 1, 1)
        loop_ps += float(user.end_ps[i] - user.start_ps[i]) if _comprehension(loop_name) else \
            min(span, float(user.end_ps[i] - user.start_ps[i]))
    held = np.unique(steps[steps >= 0])
    step_ps = float((outer.end_ps[held] - outer.start_ps[held]).sum()) if len(held) else 0.0
    if step_ps <= 0:
        return None
    return FrameLoop(user, loops, trips, loop_ps, step_ps, len(held), _frame_line(str(outer.names[held[0]]))[1],
                     loop_name)


def _calls_per_trip(program: Program, loop: FrameLoop, count: float) -> dict[str, float]:
    """The jitted functions the loops call (outermost calls), by the name the call carries, per trip, most first."""
    calls = _outermost(program.host_events(JITTED_CALL_EVENT))
    calls = calls.take(np.flatnonzero(_within_any(calls, loop.user.take(loop.loops))))
    names, counts = np.unique(calls.names.astype(str), return_counts=True)
    return {str(names[k]): counts[k] / count for k in np.argsort(-counts, kind="stable")}


@idiom("boolean_mask_in_loop", "host_structure",
       "A Python loop indexes an array with a boolean mask on every trip, reading the mask back to the host",
       "{change}",
       "x[mask] has as many rows as the mask has true values, so JAX reads the mask back to the host (a device sync) "
       "to find them, uploads their indices and runs the gather and each op after it as its own dispatch, on every "
       "trip, while the device idles; jax.jit refuses such an index (NonConcreteBooleanIndexError), so the loop "
       "cannot be jitted as written, where one reduction over the labels has static shapes and computes every group "
       "in one program",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#boolean-mask-in-loop")
def boolean_mask_in_loop(program: Program) -> list[Match]:
    """A user's loop whose every trip indexes with a boolean mask read back from the device (the Python tracer's
    frames): one sync, one upload and a few one-op programs per trip."""
    frames = program.host_events(PYTHON_TRACER_EVENT)
    masks = _outermost(frames.where(BOOLEAN_INDEX_FRAME.search))
    if len(masks) < MIN_MASK_TRIPS:
        return []
    read = _contains_any(masks, program.host_events(SYNC_EVENT))
    if program.platform == "CPU":  # the device's memory is the host's: NumPy reads the mask with no copy or sync
        read |= _contains_any(masks, frames.where(NUMPY_READ_FRAME.search))
    masks = masks.take(np.flatnonzero(read))
    loop = _frame_loop(program, frames, masks, MIN_MASK_TRIPS)
    if loop is None:
        return []
    # The indexing line where the gather's program recorded it (its trace's stack), else the loop's frame
    line, function = _function_line(program, _module(program, "jit_gather"))
    if not line:
        line, function = _frame_line(loop.loop_name)
    user, loops, trips, loop_ps, step_ps = loop.user, loop.loops, loop.trips, loop.loop_ps, loop.step_ps
    step_function = loop.step_function
    count = float(trips.sum())
    per_trip = _calls_per_trip(program, loop, count)
    executions = _outermost(program.host_events(EXECUTE_EVENT))  # one execution's helper events nest in it
    dispatches = float(_within_any(executions, user.take(loops)).sum()) / count
    puts = float(_within_any(program.host_events(HOST_PUT_EVENT), user.take(loops)).sum()) / count
    reduced = next((GROUP_REDUCTIONS[k] for k in GROUP_REDUCTIONS if per_trip.get(f"PjitFunction({k})", 0) >= 0.5),
                   None)
    compares = per_trip.get("PjitFunction(equal)", 0.0) >= 0.5
    groups = round(count / len(loops))
    indexed = _entry_shapes(_module(program, "jit_gather"))[:1]
    labels = _entry_shapes(_module(program, "jit_equal"))[:1]
    at = f"the loop at {line}" + (f" in {step_function}" if step_function else "")
    if reduced is not None:
        kind, segment, masked = reduced
        change = (f"replace {at} (per trip a boolean index x[labels == c] and a {kind} of the rows it selects, "
                  f"{groups} trips) by one segment reduction over the labels, in one jitted function: "
                  + segment.format(groups=groups)
                  + (f" (or a one-hot matmul, jax.nn.one_hot(labels, {groups}, dtype=x.dtype).T @ x, divided by the "
                     f"counts)" if kind == "mean" else f" (or a one-hot matmul, jax.nn.one_hot(labels, {groups}, "
                                                        f"dtype=x.dtype).T @ x)" if kind == "sum" else "")
                  + f", under @jax.jit with the rest of {step_function or 'the step'}; its premise: each trip's mask "
                  f"{'compares' if compares else 'is'} one array of labels, valued 0 to {groups - 1}, "
                  f"{'with' if compares else 'equal to'} the loop's value. The loop cannot go under jax.jit as written "
                  f"(a boolean index's shape is its mask's count of true values: NonConcreteBooleanIndexError); "
                  f"where the loop stays, {masked} reads no mask back and keeps its shapes static, so it can")
    else:
        change = (f"replace the boolean index x[mask] in {at} by an operation of static shape, so nothing is read "
                  f"back: jnp.where(mask[:, None], x, 0) with the mask as the weights of the reduction after it, or "
                  f"jnp.nonzero(mask, size=n, fill_value=0) with a bound n; then the loop's {groups} trips can run in "
                  f"one jitted function (jax.vmap over the loop's values, or jax.lax.map). As written jax.jit refuses "
                  f"it (NonConcreteBooleanIndexError)")
    return [Match(
        "boolean_mask_in_loop", round(float(min(100.0 * loop_ps / step_ps, 100.0)), 2),
        f"{at} runs {count / len(loops):.3g} trips per call, each indexing "
        + (f"{indexed[0]} " if indexed else "an array ") + "with a boolean mask"
        + (f" made by comparing {labels[0]} with the loop's value" if compares and labels else "")
        + ": per trip the mask is read back to the host"
        + (" (NumPy's asarray: a wait for the device)" if program.platform == "CPU" else
           " (a device-to-host transfer and a sync)") + f" to find its true elements, "
        f"{puts:.3g} arrays are put on the device and {dispatches:.3g} programs are dispatched "
        f"({', '.join('jit_' + n.removeprefix('PjitFunction(').rstrip(')') for n in list(per_trip)[:5])}); "
        f"the loop takes "
        f"{loop_ps / PS_PER_MS / loop.steps:,.4g} ms of the {step_ps / PS_PER_MS / loop.steps:,.4g} ms a call of "
        f"{step_function or 'its function'} takes",
        line=line, function=function, params={"change": change, "groups": groups},
        facts={"mask_reads_per_call": round(count / len(loops), 1), "dispatches_per_trip": round(dispatches, 1),
               "puts_per_trip": round(puts, 1), "loop_step_ms": round(step_ps / PS_PER_MS / loop.steps, 3)})]


SCALAR_READ_FRAME = re.compile(r"^\$array\.py:\d+ (__int__|__float__|__bool__|__index__|__complex__|item|tolist)$")
"""A jax.Array converted to a Python value (int(x), float(x), x.item()), as the Python tracer names it: the host waits
for the device and copies the value back."""
READ_CALLS = {"__int__": "int()", "__float__": "float()", "__bool__": "bool()", "__index__": "an index",
              "__complex__": "complex()", "item": ".item()", "tolist": ".tolist()"}
MIN_READ_TRIPS = 4.0
"""Values read back per call of the function looping over them, before the loop's structure is the cost."""
COMPARES = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
"""One-op programs comparing an array with the loop's value (pred == c): every value's compare is one broadcast."""


@idiom("eager_loop_reads_each_trip", "host_structure",
       "A Python loop runs its ops one by one and reads a value back to the host on every trip",
       "{change}",
       "each trip dispatches its ops from Python one at a time, as one-op programs, and each int() or float() waits "
       "for the device and copies the value back, so the device idles between the trips' small programs; computing "
       "every trip's values in one jitted function is one dispatch and one read for the whole loop, its premise that "
       "no trip reads a value an earlier trip computed",
       gain=(0.9, 1.0), measured="docs/reference/measurements.md#eager-loop-reads-each-trip",
       alternatives=("a jax.lax.fori_loop or jax.lax.scan over the trips inside one jitted function, the values "
                     "collected in the carry and read once after it: for trips that do depend on each other",))
def eager_loop_reads_each_trip(program: Program) -> list[Match]:
    """A user's loop whose trips run one-op programs (ops called eagerly) and convert a value to a Python number
    (the Python tracer's frames): a sync and several dispatches per trip."""
    frames = program.host_events(PYTHON_TRACER_EVENT)
    reads = _outermost(frames.where(SCALAR_READ_FRAME.search))
    reads = reads.take(np.flatnonzero(~_within_any(reads, frames.where(BOOLEAN_INDEX_FRAME.search))))
    if len(reads) < MIN_READ_TRIPS:
        return []
    loop = _frame_loop(program, frames, reads, MIN_READ_TRIPS)
    if loop is None:
        return []
    count = float(loop.trips.sum())
    calls = {k.removeprefix("PjitFunction(").rstrip(")"): n for k, n in _calls_per_trip(program, loop, count).items()}
    one_op = {k: n for k, n in calls.items()
              if f"jit_{k}" not in SETUP_OPS and _single_op(_module(program, f"jit_{k}"))}
    # The trips are the ops' own, run eagerly: at least one one-op program per read, of two kinds or more, and at
    # least twice the calls of larger programs (a jitted body called per trip is python_loop_of_calls')
    eager = sum(one_op.values())
    if len(one_op) < 2 or eager < 1.0 or eager < 2 * (sum(calls.values()) - eager):
        return []
    # Each kind of op runs at least once a trip: the least run one counts the trips
    trips = max(round(count * min(one_op.values()) / len(loop.loops)), 1)
    reads_per_trip = count / len(loop.loops) / trips
    busiest = max(one_op, key=one_op.get)
    line, function = _function_line(program, _module(program, f"jit_{busiest}"))
    if not line:
        line, function = _frame_line(loop.loop_name)
    at = f"the loop at {line}" + (f" in {loop.step_function}" if loop.step_function else "")
    ops_per_trip = eager * count / len(loop.loops) / trips
    kinds = sorted({SCALAR_READ_FRAME.search(str(n)).group(1) for n in reads.names})
    read_as = " or ".join(READ_CALLS[k] for k in kinds)
    compared = next((k for k in COMPARES if k in one_op), None)
    shapes = _entry_shapes(_module(program, f"jit_{compared}")) if compared else []
    against_value = compared is not None and len(shapes) == 2 and shapes[1].endswith("[]") and "[]" not in shapes[0]
    if against_value:
        rank = shapes[0].count(",") + 1
        axes = ", ".join(str(a) for a in range(rank)) + ("," if rank == 1 else "")
        change = (f"compute every trip of {at} at once, in one jitted function: compare against all {trips} values "
                  f"on a new last axis, x[..., None] == jnp.arange({trips}) for x of {shapes[0]}, reduce over the "
                  f"array's own axes, jnp.sum(..., axis=({axes})), for one count per value, and read the {trips} "
                  f"results back once with np.asarray after the call, instead of "
                  f"{reads_per_trip:.3g} {read_as} reads and {ops_per_trip:.3g} eager ops per trip")
    else:
        change = (f"compute every trip of {at} at once, in one jitted function: write one trip's body as a function "
                  f"of the loop's value and call jax.vmap(body)(jnp.arange({trips})) under @jax.jit, then read the "
                  f"{trips} results back once with np.asarray after the call, instead of {reads_per_trip:.3g} "
                  f"{read_as} reads and one dispatch per op on every trip")
    operand = shapes[0] if against_value else \
        next((s[0] for k in one_op if (s := _entry_shapes(_module(program, f"jit_{k}")))), "")
    per_call = loop.step_ps / PS_PER_MS / loop.steps
    return [Match(
        "eager_loop_reads_each_trip", round(float(min(100.0 * loop.loop_ps / loop.step_ps, 100.0)), 2),
        f"{at} runs {trips} trips per call, each dispatching {ops_per_trip:.3g} one-op programs "
        f"({', '.join('jit_' + k for k in list(one_op)[:5])})" + (f" on {operand}" if operand else "")
        + (f", comparing it with the loop's value ({shapes[1]})" if against_value else "")
        + f", and converting {reads_per_trip:.3g} values to Python numbers ({read_as}: a wait for the device and a "
        f"copy back each); the loop takes {loop.loop_ps / PS_PER_MS / loop.steps:,.4g} ms of the "
        f"{per_call:,.4g} ms a call of {loop.step_function or 'its function'} takes",
        line=line, function=function, params={"change": change, "trips": trips},
        facts={"trips_per_call": trips, "reads_per_trip": round(reads_per_trip, 2),
               "one_op_programs_per_trip": round(ops_per_trip, 1), "loop_step_ms": round(per_call, 3)})]
