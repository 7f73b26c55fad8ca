"""get_program_anatomy: what is the program made of, which parts hold the time, in which framework and phase?"""

from __future__ import annotations

from xdiag.analysis.anatomy import ProgramFacts, program_anatomy
from xdiag.analysis.device_peaks import session_peaks
from xdiag.analysis.op_stats import op_stats
from xdiag.analysis.recompute import rematerialised_time
from xdiag.analysis.roofline import loop_work
from xdiag.analysis.source_lines import is_library
from xdiag.errors import NotAvailable
from xdiag.idioms import recognise
from xdiag.idioms.memory_numerics import argument_copies_of
from xdiag.idioms.program import Program
from xdiag.profile.space import Session
from xdiag.profile.trace_json import KINETO, trace_format
from xdiag.tools.get_device_information import framework
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_program_anatomy",
    "What the program is made of: the components that hold its op time (attention materialising S×S scores or a "
    "fused kernel, paged / ragged paged attention, grouped matmul, matmuls, embeddings, recurrent loops, "
    "convolutions, elementwise ops, optimizer update, collectives, host transfers), each with its share, roofline "
    "efficiency and the user's lines; the phase and the framework; the facts a fix's premises read (Pallas kernels, "
    "donated arguments, devices, matmul precision); and the idioms it matches (a one-hot matmul for a lookup, a Python "
    "loop of jitted calls), each with its time.",
)
def get_program_anatomy(session: Session) -> ToolOutput:
    """summary: framework (refined from the library files the HLO's stacks name), runtime (what the trace says),
    platform, phase (training | inference | unknown: op-by-op kernels name no backward scope), step (decode |
    prefill, where the profile says), why (what the phase is read from), backward_share_percent, components [component, what, share_of_op_time_percent, ms, ops, kernel,
    roofline_efficiency_percent, efficiency_is_upper_bound, bound, lines (the user's), backward_share_percent,
    scores_shape, head_dim (the last dimension of the attention's q/k/v), masked (an op reads a boolean S×S mask),
    written_as (the attention as the program writes it, from its ops' einsum specs), pages_per_sequence (paged
    attention: the pages its page_indices hold per sequence)], pallas_kernels, devices, donated_arguments (entry parameters the busiest program's outputs alias;
    null without HLO), matmul_precision, argument_copies (copies of the programs' arguments that no output aliases:
    share_of_op_time_percent, ops, arguments, argument_count, shape, programs; null where none runs),
    rematerialised_op_percent, loop_trips_per_run; idioms (what the program does that an expert writes differently,
    from the idiom catalogue: idiom, stake_percent of the step, what (the ops' opcodes, shapes and counts), module,
    ops, line, function, needed_percent (the result's own work at the device's peaks), work_ratio (work done over
    work needed), params, cites (ops the what names without staking their time: the loop that runs them), facts).
    detail: library_files (the framework files the stacks name, at most 20)."""
    stats = op_stats(session)
    if not stats:
        raise NotAvailable("the profile holds no op executions to tell the program's parts from")
    total_ps = sum(s.total_ps for s in stats)
    peaks = session_peaks(session)
    rows = [s.row(total_ps, peaks) for s in stats]
    files = sorted({file for m in session.hlo_modules for file, *_ in m.stack_frames if file and is_library(file)})
    busiest = next((m for m in session.hlo_modules if stats[0].module in (m.name, m.display_name)), None)
    loops = loop_work(rows)
    precision = next((str(p) for s in stats[:5] for p in _precisions(session, s) if p), None)
    facts = ProgramFacts(
        framework=framework(session), library_files=tuple(files), platform=session.platform,
        program_names=tuple(m.name for m in session.hlo_modules),
        devices=len(session.device_planes()) or None,
        donated_arguments=len(busiest.donated_parameters) if busiest is not None else None,
        matmul_precision=precision,
        argument_copies=argument_copies_of(Program(session)),
        rematerialised_op_percent=rematerialised_time(session, rows).get("rematerialised_op_percent"),
        loop_trips_per_run=loops.get("loop_trips_per_run"), **_host_phase_marks(session))
    summary = program_anatomy(rows, facts)
    summary["idioms"] = [m.record() for m in recognise(session)]
    return ToolOutput(summary, {"library_files": files[:20]})


TRAINING_HOST_EVENTS = ("autograd::engine", "Optimizer.step", "Optimizer.zero_grad", "backward")
"""Host events only a training step records (PyTorch's autograd engine and optimizer)."""


def _host_phase_marks(session: Session) -> dict:
    """host_training_event (the first host event only training records) and host_ops_recorded (aten:: ops are in the
    trace, so an absence of autograd among them speaks), from a PyTorch (Kineto) trace's host ops; an xplane's phase
    is read from its HLO (and its host summaries keep no such names)."""
    if trace_format(session) != KINETO:
        return {}
    training, ops = None, False
    for plane in session.host_planes():
        for name in plane.event_names.values():
            ops = ops or name.startswith("aten::")
            if training is None and any(mark in name for mark in TRAINING_HOST_EVENTS):
                training = name[:80]
        if training:
            break
    return {"host_training_event": training, "host_ops_recorded": ops}


_PRECISIONS = {1: "HIGH", 2: "HIGHEST"}


def _precisions(session: Session, stat) -> list[str | None]:
    """The operand precisions above DEFAULT that the op's dots ask for (the HLO's precision_config)."""
    module = next((m for m in session.hlo_modules if stat.module in (m.name, m.display_name)), None)
    found = module.find(stat.name) if module is not None else None
    if not found:
        return []
    computation, ins = found
    inner = [ins] + [i for name in ins.called for i in (module.computations[name].instructions
                                                       if name in module.computations else ())]
    return [_PRECISIONS.get(p) for i in inner if i.opcode in ("dot", "convolution") for p in i.operand_precision]
