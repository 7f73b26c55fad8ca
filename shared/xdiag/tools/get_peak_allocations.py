"""get_peak_allocations: which buffers make up the memory peak?"""

from __future__ import annotations

from xdiag.analysis.op_stats import op_stats
from xdiag.analysis.xprof.session_views import try_view
from xdiag.cost.hlo import shape_bytes
from xdiag.errors import NotAvailable
from xdiag.profile.space import HloComputation, HloInstruction, HloModule, Session
from xdiag.tools.common import xprof_source
from xdiag.tools.registry import ToolOutput, tool

MIB = 2**20
GIB = 2**30


@tool(
    "get_peak_allocations",
    "The largest buffers of the busiest HLO module at its memory peak (XProf's memory viewer on TPU/GPU); on "
    "CPU the largest values the module's HLO defines, by shape.",
    parameters={"module": {"type": "string", "description": "HLO module name or name(id); default the busiest"}},
)
def get_peak_allocations(session: Session, module: str | None = None) -> ToolOutput:
    """summary: module, largest_buffer, largest_buffer_shape, largest_buffer_mib, and without XProf's buffer
    assignment (CPU, or no memory viewer) hlo_values_live_at_once_gib (an estimate from the HLO, beside the
    measured peak of get_memory_profile; never above that peak or the device's memory: where the HLO's order puts
    more live at once, None and hlo_values_live_at_once_not_shown_because), hlo_values_live_at_once_at, basis,
    buffers_are (what the listed buffers are: the largest of those live together at that point, so that their sum
    is never above it), donated_arguments (the entry parameters the HLO's input/output aliasing reuses). detail:
    buffers (top 20; an argument's `donated` says whether it is).
    """
    target = session.module(module) if module else None
    if module and target is None:
        raise NotAvailable(f"no HLO module named {module!r} in this profile")
    if target is None:
        target = busiest_module(session)
    if target is None:
        raise NotAvailable("the profile carries no HLO modules to size buffers from")
    if session.platform != "CPU":
        view, reason = try_view(session, "peak_allocations", module=target.display_name)
        if view is not None:
            summary = {k: v for k, v in view.items() if k != "detail"}
            modules = view.get("detail", {}).get("modules") or [{}]
            buffers = modules[0].get("top_buffers", [])
            return ToolOutput({"module": target.display_name, **summary, **_with_donation(buffers, target)},
                              {"xprof": view, "buffers": buffers}, xprof_source())
    values = _device_values(target.entry_computation, target)
    if not values:
        raise NotAvailable(f"module {target.display_name} defines no sized values in device memory")
    live_bytes, live_at, together = _live_at_once(target.entry_computation, target)
    largest = max(values, key=lambda v: v["size_mib"])
    bound = memory_bound(session)
    summary = {
        **_with_donation(values, target),
        "module": target.display_name,
        "largest_buffer": largest["value"],
        "largest_buffer_shape": largest["shape"],
        "largest_buffer_mib": largest["size_mib"],
        "hlo_values_live_at_once_gib": round(live_bytes / GIB, 4),
        "hlo_values_live_at_once_at": live_at,
        "basis": (
            "HLO value sizes (the profile has no buffer assignment): the entry computation's values in device "
            "memory that are live together in its scheduled order (tuples and bitcasts hold no buffer of their "
            "own, an async copy's destination is live from its start, an in-place scatter or dynamic-update-slice "
            "is its operand's buffer; host-memory values left out; temporaries "
            "inside fusions and loop bodies not counted)"
        ),
    }
    live = [v for v in values if v["value"] in together]
    if bound is not None and live_bytes / GIB > bound[0]:
        # The HLO's order overstates what is live (XLA shares or reuses buffers it does not show): no figure above
        # what the device holds. The largest values are listed, each its own size, none summed.
        summary.update(hlo_values_live_at_once_gib=None, hlo_values_live_at_once_at=None,
                       hlo_values_live_at_once_not_shown_because=(
                           f"the HLO's order puts {live_bytes / GIB:.3g} GiB of values live at once, above {bound[1]}: "
                           "XLA shares or reuses buffers (a donated argument's, a copy made in place) that its order "
                           "does not show"),
                       buffers_are="the largest values the module defines, not all live at once")
        values.sort(key=lambda v: -v["size_mib"])
        return ToolOutput(summary, {"buffers": values[:20]}, "HLO shapes carried in the profile")
    live.sort(key=lambda v: -v["size_mib"])
    summary["buffers_are"] = f"the largest of the {len(live)} values live together at {live_at}"
    return ToolOutput(summary, {"buffers": live[:20]}, "HLO shapes carried in the profile")


def memory_bound(session: Session) -> tuple[float, str] | None:
    """The most device memory the session's figures may show, GiB, and what it is: the peak XProf's memory profile
    measured (its allocation timeline), else the device's memory where its plane records it; None where neither is
    known. No buffer figure is above it (a 15.7 GiB chip was said to hold 21 GiB live at once)."""
    view, _ = try_view(session, "memory_profile") if session.platform != "CPU" else (None, None)
    if view and view.get("peak_hbm_gib"):
        return float(view["peak_hbm_gib"]), f"the {view['peak_hbm_gib']:g} GiB peak the memory profile measured"
    sizes = [float(p.stats["memory_size"]) for p in session.device_planes() if p.stats.get("memory_size")]
    if sizes:
        return max(sizes) / GIB, f"the device's {max(sizes) / GIB:.3g} GiB of memory"
    return None


def _with_donation(buffers: list[dict], module: HloModule) -> dict:
    """Marks each argument among `buffers` donated or not, from the module's input/output aliasing (an argument
    jax.jit donates is aliased to an output: the step's update reuses its buffer); the donated ones, by name."""
    for b in buffers:
        if b.get("opcode") == "parameter":
            b["donated"] = b.get("value") in module.donated_parameters
    return {"donated_arguments": sorted(module.donated_parameters)}

# Ops whose result is another value's buffer (or a tuple of them), not a new one.
_ALIASING = ("tuple", "get-tuple-element", "bitcast")


def _holds_no_buffer(ins: HloInstruction, by_name: dict[str, HloInstruction]) -> bool:
    """A result that is other values' buffers: a tuple, a bitcast, an async start's tuple (its operands, and the
    destination its done returns), a done whose start returned an array (the start's buffer)."""
    if ins.opcode in _ALIASING or ins.dtype == "tuple":
        return True
    start = _start_of(ins, by_name)
    return start is not None and start.dtype != "tuple"


_IN_PLACE = ("scatter", "dynamic-update-slice")


def _updated_in_place(ins: HloInstruction, computation: HloComputation, module: HloModule | None) -> str | None:
    """The operand whose buffer a scatter or dynamic-update-slice (alone, or at the root of a fusion) updates in
    place: the one of the result's shape. XLA writes such an update into its operand's buffer, copying the operand
    first (a copy of its own in the HLO) where it is still needed: a donated table's update is not a second table."""
    root = ins
    if ins.opcode == "fusion" and module is not None and ins.called and ins.called[0] in module.computations:
        called = module.computations[ins.called[0]]
        root = called.instructions[-1] if called.instructions else ins
        while root.opcode == "bitcast" and root.operands and root.operands[0] in called.by_name:
            root = called.by_name[root.operands[0]]
    if root.opcode not in _IN_PLACE:
        return None
    return next((o for o in ins.operands if (v := computation.by_name.get(o)) is not None
                 and v.dtype == ins.dtype and v.dims == ins.dims), None)


def _start_of(ins: HloInstruction, by_name: dict[str, HloInstruction]) -> HloInstruction | None:
    """The start of an async pair whose done `ins` is (copy-done of copy-start, all-gather-done, …)."""
    start = by_name.get(ins.operands[0]) if ins.operands and ins.opcode.endswith("-done") else None
    return start if start is not None and start.opcode.endswith("-start") else None


def _in_device_memory(ins: HloInstruction) -> bool:
    return ins.memory_space == 0 and shape_bytes(ins) > 0


def _device_values(computation: HloComputation, module: HloModule | None = None) -> list[dict]:
    """Each buffer the computation's instructions define in device memory, once (an in-place update is its
    operand's buffer)."""
    by_name = computation.by_name
    return [
        {"value": i.name, "shape": i.shape_text, "opcode": i.opcode, "size_mib": round(shape_bytes(i) / MIB, 4),
         "framework_op": i.op_name}
        for i in computation.instructions
        if not _holds_no_buffer(i, by_name) and _in_device_memory(i) and _updated_in_place(i, computation, module) is None
    ]


def _live_at_once(computation: HloComputation, module: HloModule | None = None) -> tuple[float, str, set[str]]:
    """The most bytes of device-memory values live together, in the computation's instruction order (XLA writes
    a scheduled module's entry in its schedule's order), and the instruction where that happens. A value is live
    from its definition (an async done's buffer from its start) to its last use, through the tuples and
    bitcasts that alias it (and the in-place updates that write into it); parameters from the start, the root's
    buffers to the end; a donated argument until its last use (the output aliased to it takes its buffer, and is
    counted as itself: counting the argument too put decode_streamed_b64's 3 GiB KV cache three times in 9.56 GiB
    where XProf's memory profile measured 6.7). Also the buffers live there: those that make that figure."""
    instructions = computation.instructions
    if not instructions:
        return 0.0, "", set()
    by_name = computation.by_name
    index = {i.name: n for n, i in enumerate(instructions)}
    done_of = {start.name: i.name for i in instructions if (start := _start_of(i, by_name)) is not None}
    spans: dict[str, list[int]] = {}  # buffer (its defining value) -> [first index, last index]
    stands_for: dict[str, set[str]] = {}  # a value -> the buffers it is
    for n, i in enumerate(instructions):
        in_place = _updated_in_place(i, computation, module)
        if _holds_no_buffer(i, by_name):
            stands_for[i.name] = set().union(*(stands_for.get(o, set()) for o in i.operands))
            if i.name in done_of:
                stands_for[i.name].add(done_of[i.name])  # the destination the start allocates
        elif in_place is not None:
            stands_for[i.name] = set(stands_for.get(in_place, ()))  # its operand's buffer, updated
        else:
            stands_for[i.name] = {i.name}
            if _in_device_memory(i):
                start = _start_of(i, by_name)
                spans[i.name] = [0 if i.opcode == "parameter" else index[start.name] if start else n, n]
        for operand in i.operands:
            for buffer in stands_for.get(operand, ()):
                if buffer in spans:
                    spans[buffer][1] = max(spans[buffer][1], n)
    last = len(instructions) - 1
    for buffer in stands_for.get(instructions[-1].name, ()):
        if buffer in spans:
            spans[buffer][1] = last  # the program's result
    owned = {name for name in spans if by_name[name].opcode == "parameter"
             and name not in (module.donated_parameters if module is not None else ())}
    for name in owned:
        spans[name][1] = last  # the caller owns the arguments it does not donate: live for the whole program
    live = [0.0] * len(instructions)
    for name, (first, end) in spans.items():
        for n in range(first, end + 1):
            live[n] += shape_bytes(by_name[name])
    peak = max(range(len(live)), key=live.__getitem__)
    together = {name for name, (first, end) in spans.items() if first <= peak <= end}
    return live[peak], instructions[peak].name, together


def busiest_module(session: Session) -> HloModule | None:
    """The HLO module the tool sizes by default: the busiest one the profile carries. Ops can name modules the
    profile does not carry (XLA's GPU autotuner compiles each candidate fusion as a module of its own, e.g.
    `gemm_fusion_dot.4`), so the busiest carried one, else the first."""
    carried = (session.module(s.module) for s in op_stats(session) if s.module)
    return next((m for m in carried if m is not None), session.hlo_modules[0] if session.hlo_modules else None)
