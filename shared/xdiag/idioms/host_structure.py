"""Idioms of how the host's Python drives the device: the step's time goes to the loop's structure, not to any op.

- python_loop_of_calls: a Python loop calls one jitted program many times per step (reading a value back after each
  call, or feeding it one request at a time), so the device idles between calls.
- recompile_per_shape: a jitted program is compiled again inside the steps because an argument's shape changes
  between calls (an array that grows by one element per call, or batches of varying size).
- callback_in_step: the compiled step calls back into Python (jax.pure_callback, io_callback, jax.debug.callback),
  and the device waits for the host on every call.

Their stake is the whole time the structure costs (the device's idle share of the step, or the compiles'), not the
slice the breakdown files as dispatch: a loop moved into one program drops its dispatches, waits and idle together.
"""

from __future__ import annotations

import re

from xdiag.analysis.xprof.common import natural_order
from xdiag.idioms.catalogue import Match, idiom
from xdiag.idioms.program import Program, calls_per_step_of
from xdiag.profile.space import HloModule

MIN_CALLS_PER_STEP = 4.0
MIN_IDLE_PERCENT = 30.0
SETUP_OPS = frozenset(f"jit_{op}" for op in ("convert_element_type", "broadcast_in_dim", "iota", "copy", "reshape",
                                              "squeeze", "expand_dims", "concatenate", "full", "zeros_like"))
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
       gain=(0.7, 1.0))
def python_loop_of_calls(program: Program) -> list[Match]:
    step = program.step
    idle = float(step.get("device_idle_percent") or 0.0)
    calls = [(k, n) for k, n in calls_per_step_of(program) if k.split("(")[0] not in SETUP_OPS]
    if not calls or idle < MIN_IDLE_PERCENT:
        return []
    key, per_step = calls[0]
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
    one_call_steps = dispatches <= 1.5 and per_step <= 1.5 and launch >= MIN_IDLE_PERCENT and \
        float(step.get("steps") or 0) >= 2 * MIN_CALLS_PER_STEP and (device_us <= TINY_CALL_US or one_row)
    if not one_call_steps and (per_step < MIN_CALLS_PER_STEP or dispatches < MIN_CALLS_PER_STEP):
        return []
    line, function = _function_line(program, module)
    if _eager(program, calls):
        return []  # eager_ops
    reads = syncs >= per_step / 2 and syncs >= 0.5
    name = key.split("(")[0]
    reads_text = "one blocking read" if syncs == 1 else f"{syncs:.3g} blocking reads"
    counted = (f"{per_step:.3g} calls and {syncs:.3g} reads of a value per step" if not one_call_steps else
               f"{float(step.get('steps') or 0):.0f} calls in the capture, each read as a step")
    if one_row:
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


@idiom("recompile_per_shape", "host_structure",
       "A jitted program is compiled again inside the steps",
       "{change}",
       "jax.jit compiles once per distinct function, argument shape and static value: a shape, a function object or "
       "a baked-in Python value that changes between calls makes every such call compile, and the device waits for "
       "the compiler",
       gain=(0.8, 1.0))
def recompile_per_shape(program: Program) -> list[Match]:
    step = program.step
    compiles = float(step.get("compiles_per_step_mean") or 0.0)
    share = float(step.get("compile_percent") or 0.0)
    if compiles < 0.5 or share < 5.0:
        return []
    by_name: dict[str, list[HloModule]] = {}
    for module in program.session.hlo_modules:
        by_name.setdefault(module.name, []).append(module)
    # The user's program first: a small program compiled per shape (jit_concatenate growing its input) feeds it
    name, modules = max(by_name.items(), key=lambda kv: (len(kv[1]) >= 2, _size(kv[1][0])))
    if len(modules) < 2:
        return []
    shapes = [_entry_shapes(m) for m in sorted(modules, key=lambda m: m.program_id)]
    changing = [k for k in range(min(len(s) for s in shapes)) if len({s[k] for s in shapes}) > 1]
    line, function = _function_line(program, modules[0])
    stem = name.removeprefix("jit_")
    idle = float(step.get("device_idle_percent") or share)
    if not changing:
        change = (f"jit {stem} once, outside the loop (update = jax.jit({stem}) at module level), and pass what "
                  f"changes between calls as an argument of array type (a jnp.asarray(lr) operand), not through "
                  f"functools.partial, a lambda or a closure made per call: each new function object or Python value "
                  f"is a new trace and compile; static_argnums would compile again for every new value")
        return [Match(
            "recompile_per_shape", max(share, min(idle, 100.0)),
            f"the program {name} was compiled {len(modules)} times in the capture ({compiles:g} compiles per step, "
            f"{share:g}% of the step) with the same argument shapes ({', '.join(shapes[0][:3])}): what changes is "
            "the function or a constant baked into it, not a shape",
            module=name, line=line, function=function, params={"change": change},
            facts={"compiles": len(modules), "compiles_per_step": compiles, "compile_percent": share})]
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
        "recompile_per_shape", max(share, min(idle, 100.0)),
        f"the program {name} was compiled {len(modules)} times in the capture ({compiles:g} compiles per step, "
        f"{share:g}% of the "
        f"step) for argument {position} of shapes {seen}"
        + (", growing by one element per call" if steps_of_one else ""),
        module=name, line=line, function=function,
        params={"change": change, "position": position},
        facts={"compiles": len(modules), "compiles_per_step": compiles, "compile_percent": share,
               "argument_shapes": seen})]


def _leading_change(shape: str, first: str) -> int | None:
    """The size of the first dimension in which `shape` differs from `first` (both like 's32[1,17]')."""
    a = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])]
    b = [int(d) for d in re.findall(r"\d+", first.split("[", 1)[-1])]
    if len(a) != len(b):
        return None
    return next((x for x, y in zip(a, b) if x != y), a[-1] if a else None)


@idiom("callback_in_step", "host_structure",
       "The compiled step calls back into Python on every call",
       "{change}",
       "a callback leaves the compiled program: the device waits while the host copies the operands out, runs the "
       "Python function and copies the result back, on every call",
       gain=(0.6, 1.0))
def callback_in_step(program: Program) -> list[Match]:
    step = program.step
    callbacks = float(step.get("callbacks_per_step_mean") or 0.0)
    found: tuple[str, str, str] | None = None
    for graph in program.graphs:
        for site in graph.sites():
            ins = site.instruction
            if ins.opcode in ("custom-call", "send", "recv") and CALLBACK.search(ins.op_name or ""):
                line, function = program.line_of(graph, site)
                kind = CALLBACK.search(ins.op_name).group(0)
                found = (kind, line, function, program.module_key(graph.module), graph.timed_op(site))
                break
        if found:
            break
    idle = float(step.get("device_idle_percent") or 0.0)
    if found is None or (callbacks < 1 and idle < MIN_IDLE_PERCENT):
        return []
    kind, line, function, module, op = found
    # On a CPU the callback runs as one of the device's ops, on its cores: its own time is the device's too (on an
    # accelerator the device only waits for it, and that wait is its idle time)
    on_device = program.step_percent(sum(s.total_ms for s in program.stats if s.category == "host_callback")) \
        if program.platform == "CPU" else 0.0
    call = {"pure_callback": "jax.pure_callback", "io_callback": "jax.experimental.io_callback",
            "debug_callback": "jax.debug.callback / jax.debug.print"}.get(kind, "the host callback")
    change = (f"compute at {line or 'the callback'} with jnp inside the jitted step instead of calling back into "
              f"Python ({call}); where the callback only logs, drop it from the step and log a value fetched every "
              f"N steps")
    if program.platform == "CPU":  # the host is the device: the callback's work stays on the same cores either way
        change += ("; on a CPU the callback's own work stays on these cores whichever library runs it, and jnp sorts "
                   "in full where NumPy partitions (percentile, quantile, median): there call it on fewer elements "
                   "or every few steps rather than port it")
    return [Match(
        "callback_in_step", min(idle + on_device, 100.0),
        f"the step's compiled program calls {call} ({callbacks:g} callbacks per step)"
        + (f" at {line}" if line else "") + f", and the device idles {idle:g}% of the step"
        + (f"; the callbacks themselves run as device ops for {on_device:g}% of it" if on_device >= 1 else ""),
        module=module, ops=[op], line=line, function=function, params={"change": change},
        facts={"callbacks_per_step": callbacks, "device_idle_percent": idle,
               **({"callback_op_percent": on_device} if on_device >= 1 else {})})]
