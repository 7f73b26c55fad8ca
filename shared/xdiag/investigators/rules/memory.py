"""The memory finding: an out-of-memory risk above LOW, the largest buffers that make the peak, and the lever for
what holds them."""

from __future__ import annotations

from typing import Any

from xdiag.investigators import advice
from xdiag.investigators.health import OOM_RISKS_ABOVE_LOW, HealthSnapshot
from xdiag.investigators.rules.hypothesis import Hypothesis, detail, evidence, failure_reason, summary
from xdiag.investigators.rules.registry import Facts, rule
from xdiag.model import ToolResult
from xdiag.sizes import readable_size

LARGEST_BUFFERS_NAMED = 3
"""How many of the largest buffers a memory-pressure finding names."""


def _largest_buffers(results: dict[str, ToolResult]) -> list[dict]:
    """get_peak_allocations' largest buffers, largest first, each as {name, mib, shape, made_by, argument}: rows of
    XProf's memory viewer (instruction, size) or of the HLO (value, shape, opcode, framework op)."""
    rows = detail(results, "get_peak_allocations").get("buffers") or []
    buffers = [{"name": r.get("value") or r.get("instruction"), "mib": r.get("size_mib"), "shape": r.get("shape"),
                "made_by": r.get("framework_op"),
                "argument": r["opcode"] == "parameter" if r.get("opcode") else None, "donated": r.get("donated")}
               for r in rows if (r.get("value") or r.get("instruction")) and r.get("size_mib")]
    return sorted(buffers, key=lambda b: -b["mib"])


def _live_together(allocations: dict) -> bool:
    """Whether get_peak_allocations' buffers are live at once (the largest of those live together at the HLO's
    peak, or XProf's memory viewer's buffers at the peak), so that a sum of them is memory held at once."""
    said = allocations.get("buffers_are")
    return said is None or str(said).startswith("the largest of the")


def _buffer_text(b: dict) -> str:
    shape = f" {b['shape'].split('{')[0]}" if b.get("shape") else ""
    kind = {True: "an argument", False: "a value the step computes"}.get(b["argument"], "")
    if b["argument"] and b.get("donated") is not None:
        kind += ", donated" if b["donated"] else ", not donated"
    about = ", ".join(x for x in (readable_size(b["mib"] * 2**20), kind, b.get("made_by") and f"from {b['made_by']}")
                      if x)
    return f"{b['name']}{shape} ({about})"


def _memory_limit_text(memory: dict[str, Any]) -> str:
    """'31.2 GiB', or where the allocator may use less than the device has: '144 GiB the allocator may use (192 GiB
    device memory)': the headroom is measured against the limit that runs out first."""
    capacity, limit = memory.get("capacity_gib"), memory.get("allocator_limit_gib")
    if limit is None:
        return f"{capacity} GiB"
    return f"{limit} GiB the allocator may use ({capacity} GiB device memory)"


def memory_pressure_hypothesis(health: HealthSnapshot, results: dict[str, ToolResult]) -> Hypothesis | None:
    """Out-of-memory risk above LOW: the peak against the limit, the largest buffers that make it (get_peak_allocations)
    and the lever for what holds them: values the step computes (rematerialise, smaller micro-batches) or its
    arguments (donate, shard, offload)."""
    risk = health.oom_risk
    if risk not in OOM_RISKS_ABOVE_LOW:
        return None
    mem = summary(results, "get_memory_profile")
    allocations = summary(results, "get_peak_allocations")
    largest = _largest_buffers(results)
    named = largest[:LARGEST_BUFFERS_NAMED]
    typed = [b for b in largest if b["argument"] is not None]
    argument_mib = sum(b["mib"] for b in typed if b["argument"])
    value_mib = sum(b["mib"] for b in typed if not b["argument"])
    values_first = value_mib >= argument_mib
    module = allocations.get("module") or allocations.get("peak_module")
    held = ""
    peak_mib = (mem.get("peak_memory_gib") or 0) * 1024
    if typed and _live_together(allocations) and not (peak_mib and argument_mib + value_mib > peak_mib):
        # A sum of buffers is said only of buffers live at once, and never above the measured peak.
        total = argument_mib + value_mib
        held = (f" Of the {len(typed)} largest buffers ({total / 1024:.3g} GiB), "
                f"{100 * value_mib / total:.0f}% are values the step computes (activations, gradients, temporaries) "
                f"and {100 * argument_mib / total:.0f}% its arguments (weights, optimizer state, the batch).")
    ev = [evidence("get_memory_profile", "peak_memory_gib", mem.get("peak_memory_gib")),
          evidence("get_memory_profile", "capacity_gib", mem.get("capacity_gib")),
          *([evidence("get_memory_profile", "allocator_limit_gib", mem["allocator_limit_gib"])]
            if mem.get("allocator_limit_gib") is not None else []),
          evidence("get_memory_profile", "headroom_percent", mem.get("headroom_percent")),
          evidence("get_memory_profile", "oom_risk", risk)]
    ev += [evidence("get_peak_allocations", f"buffer {b['name']} size_mib", b["mib"], _buffer_text(b)) for b in named]
    if allocations.get("hlo_values_live_at_once_gib") is not None and not (
            peak_mib and allocations["hlo_values_live_at_once_gib"] * 1024 > peak_mib * 1.05):
        ev.append(evidence("get_peak_allocations", "hlo_values_live_at_once_gib",
                           allocations["hlo_values_live_at_once_gib"],
                           f"at {allocations.get('hlo_values_live_at_once_at')}"))
    return Hypothesis(
        "memory_pressure", 50.0 if risk == "HIGH" else 15.0,
        f"Out-of-memory risk {risk}: the step's peak memory is near the limit",
        f"Peak memory {mem.get('peak_memory_gib')} GiB of {_memory_limit_text(mem)} "
        f"({mem.get('headroom_percent')}% headroom): a larger batch, a longer sequence or one more buffer may "
        "not fit."
        + (f" The largest buffers of {module or 'the busiest program'}: "
           + "; ".join(_buffer_text(b) for b in named) + "." if named else
           " Which buffers make the peak is not available: " + (failure_reason(results, "get_peak_allocations")
                                                                 or "get_peak_allocations reported no buffer sizes")
           + ".")
        + held,
        ev,
        "Avoids an out-of-memory failure as batch or sequence length grows, and makes room for a larger batch.",
        advice.cut_peak_memory(advice.context(summary(results, "get_device_information")),
                               _peak_holders(typed, values_first, summary(results, "get_device_information"))),
    )


def _peak_holders(typed: list[dict], values_first: bool, device: dict[str, Any]) -> advice.PeakHolders:
    """What the largest buffers say about the levers: whether the large arguments are donated already, whether
    matmul outputs make most of the computed values, and how many devices the job has."""
    arguments = [b for b in typed if b["argument"]]
    marked = [b for b in arguments if b.get("donated") is not None]
    large = [b for b in marked if b["mib"] >= DONATION_MATTERS_SHARE * sum(a["mib"] for a in arguments)]
    donated = all(b["donated"] for b in large) if large else None
    values = [b for b in typed if not b["argument"]]
    dot_mib = sum(b["mib"] for b in values if str(b.get("made_by") or "").rsplit("/", 1)[-1] in MATMUL_FRAMEWORK_OPS)
    largest = max(arguments, key=lambda b: b["mib"], default=None)
    return advice.PeakHolders(
        values_first=values_first, arguments_donated=donated,
        devices=device.get("device_count") if isinstance(device.get("device_count"), int) else None,
        dot_outputs_hold_values=bool(values) and dot_mib >= 0.5 * sum(b["mib"] for b in values),
        largest_argument=f"{_argument_name(largest)}, {readable_size(largest['mib'] * 2**20)}" if largest else "",
        largest_argument_dtype=str(largest.get("shape") or "").split("[")[0] if largest else "")


def _argument_name(buffer: dict) -> str:
    """An argument as the user's code names it: its path in the arguments' pytree (params['params']['Dense_0']), else
    its shape; never the HLO parameter's name, which names nothing in their code."""
    return buffer.get("made_by") or str(buffer.get("shape") or "").split("{")[0] or "an argument"


MATMUL_FRAMEWORK_OPS = ("dot_general", "dot", "matmul", "einsum")
"""The last part of a value's framework op that says a matrix product made it."""
DONATION_MATTERS_SHARE = 0.1
"""An argument holding at least this share of the large arguments' bytes decides whether donation is a lever."""


@rule("memory_pressure")
def memory_pressure(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    return memory_pressure_hypothesis(facts.health, facts.results)
