"""The rule engine: a deterministic investigator that needs no network.

Each rule reads the health snapshot and the broad tools' outputs, and when its signal is
present forms a hypothesis with a score (the share of step or op time at stake). The
strongest hypotheses get the follow-up tool calls (at most four, counted by the caller),
and each becomes a finding whose evidence quotes tool outputs by name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xdiag.investigators import advice
from xdiag.analysis.roofline import EXTRA_PASSES_DEFECT_PERCENT, MEMORY_BOUND_FINDING_MIN_PERCENT
from xdiag.investigators.health import (DMA_STALL_MAX_PERCENT, DOMINANT_EFFICIENCY_MIN_PERCENT, OOM_RISKS_ABOVE_LOW,
                                       is_latency_bound, low_intensity_share)
from xdiag.model import Diagnosis, Evidence, Finding, FollowUpCall, Status, ToolResult

CallTool = Callable[[str, dict[str, Any], str], ToolResult | None]
"""call_tool(name, args, hypothesis) -> result, or None once the follow-up budget is spent."""


@dataclass
class Hypothesis:
    key: str
    score: float  # percent of step time (or op time) at stake; orders hypotheses and sets priority
    title: str
    whats_happening: str
    evidence: list[Evidence]
    expected_impact: str
    fix: str
    follow_up: tuple[str, dict[str, Any]] | None = None
    extra_evidence: Callable[[ToolResult], list[Evidence]] | None = field(default=None, repr=False)
    ops: frozenset[tuple[str, str]] = frozenset()  # (module, op) whose time the finding stakes, where it names them
    inflates: frozenset[tuple[str, str]] = frozenset()  # (module, op) reading the bytes this finding's ops write

    @property
    def priority(self) -> str:
        return "P0" if self.score >= 40 else "P1" if self.score >= 15 else "P2"

    def finding(self) -> Finding:
        return Finding(priority=self.priority, key=self.key, title=self.title, whats_happening=self.whats_happening,
                       evidence=self.evidence, expected_impact=self.expected_impact, fix=self.fix)


def _s(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    r = results.get(tool)
    return r.summary if r is not None and r.ok else {}


def _d(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    r = results.get(tool)
    return r.detail if r is not None and r.ok else {}


def _ev(tool: str, metric: str, value: Any, note: str = "") -> Evidence:
    return Evidence(tool=tool, metric=metric, value=value, note=note)


def _shape_note(row: dict, key: str = "shape") -> str:
    """"; shape S" where the profile gives the op's shape, else nothing: never a placeholder."""
    shape = row.get(key) or row.get("converted_shape")
    return f"; shape {shape}" if shape else ""


def _saving(step_ms: float | None, share: float) -> str:
    if not step_ms:
        return f"up to {share:.0f}% of step time"
    after = step_ms * (1 - share / 100)
    return f"up to {share:.0f}% shorter steps: {step_ms:.3g} ms → about {after:.3g} ms if this time were removed"


def _events_evidence(result: ToolResult) -> list[Evidence]:
    s = result.summary
    out = [_ev("aggregate_xplane_events", f"events matching {s.get('pattern')!r}", s.get("matches"),
               f"{s.get('total_ms')} ms in total, mean {s.get('mean_us')} µs")]
    top = result.detail.get("top_names", [])[:3]
    if top:
        out.append(_ev("aggregate_xplane_events", "top matching events",
                       ", ".join(f"{t['name']} ({t['total_ms']} ms)" for t in top)))
    return out


def _neighborhood_evidence(result: ToolResult) -> list[Evidence]:
    s = result.summary
    out = [_ev("get_hlo_neighborhood", f"{s.get('op')} in {s.get('module')}", s.get("shape"),
               f"opcode {s.get('opcode')}; framework op {s.get('framework_op') or 'unknown'}")]
    if s.get("producers"):
        out.append(_ev("get_hlo_neighborhood", "fed by", ", ".join(s["producers"][:4])))
    if s.get("consumers"):
        out.append(_ev("get_hlo_neighborhood", "used by", ", ".join(s["consumers"][:4])))
    if s.get("source"):
        out.append(_ev("get_hlo_neighborhood", "source line", s["source"]))
    return out


_STRAGGLER_FIX = {
    "host_other": "Fix that host's input path: prefetch and preprocess its batches in background workers, check its "
    "data shard (size, storage, decoding cost) against the others', and look for host-side contention (other "
    "processes, CPU throttling) on that machine.",
    "compute": "Balance the work: give that participant a shard the same size as the others' (sequence lengths, "
    "padding, uneven batch split), and check its hardware (clocks, thermal throttling, a degraded device or link).",
}


def _straggler_hypothesis(results: dict[str, ToolResult], step_ms: float | None) -> Hypothesis | None:
    """The participant that arrives last at the collectives, from get_hosts' alignment of collective instances."""
    hosts = _s(results, "get_hosts")
    name = hosts.get("straggler")
    if not name or not step_ms:
        return None
    kind = "Host" if hosts.get("participant_level") == "hosts" else "Device"
    who = name
    if hosts.get("straggler_rank") is not None:  # a rank of a distributed job, as its trace numbers it
        kind, who = "Rank", f"{hosts['straggler_rank']} ({name})"
    wait = hosts["straggler_caused_wait_ms_per_step"]
    wait_share = round(100 * wait / step_ms, 2)
    cause = hosts.get("straggler_cause")
    cause_text = (_d(results, "get_hosts").get("straggler_cause") or "") if cause else ""
    excess = hosts.get("straggler_cause_excess_ms_per_step")
    own = (f" Its own step shows why: {cause_text} — {excess:.3g} ms per step more than its peers."
           if cause else " Its own step breakdown does not show a cause that its peers lack.")
    evidence = [
        _ev("get_hosts", "straggler", name, f"participants: {hosts.get('participant_level')}"),
        _ev("get_hosts", "straggler_last_arrival_share_percent", hosts["straggler_last_arrival_share_percent"],
            f"of {hosts.get('collective_instances')} collective instances, aligned on their end"),
        _ev("get_hosts", "arrival_skew_ms_mean", hosts.get("arrival_skew_ms_mean"),
            f"max {hosts.get('arrival_skew_ms_max')} ms"),
        _ev("get_hosts", "straggler_caused_wait_ms_per_step", wait, "each other participant waits this long per step"),
        _ev("get_step_trace", "step_time_ms_mean", step_ms),
    ]
    if who != name:
        evidence.insert(1, _ev("get_hosts", "straggler_rank", hosts["straggler_rank"], "its rank, as its trace says"))
    if cause:
        evidence.append(_ev("get_hosts", "straggler_cause", cause, f"+{excess} ms per step over its peers"))
    return Hypothesis(
        "straggler_host", wait_share,
        f"{kind} {who} is a straggler: the others wait for it at every collective",
        f"{kind} {who} arrives last at {hosts['straggler_last_arrival_share_percent']}% of the "
        f"{hosts.get('collective_instances')} collective instances (arrival skew {hosts.get('arrival_skew_ms_mean')} ms "
        f"on average); every other participant waits {wait:.3g} ms per step inside the collective for it "
        f"({wait_share}% of the {step_ms:.4g} ms step), so all step times match the slowest one's.{own}",
        evidence,
        f"Up to {wait_share:.0f}% shorter steps for every participant: {step_ms:.4g} ms → about "
        f"{step_ms - wait:.3g} ms if it arrived with the others.",
        _STRAGGLER_FIX.get(cause or "", "Profile that participant alone: compare its input pipeline, its share of "
                           "the work and its hardware health with the others'."),
        follow_up=("get_hosts", {}),
    )


def _hypotheses(health: dict[str, Any], results: dict[str, ToolResult]) -> list[Hypothesis]:
    step = _s(results, "get_step_trace")
    b = health.get("breakdown_percent", {})
    step_ms = health.get("step_time_ms")
    steps_n = step.get("steps") or 0
    out: list[Hypothesis] = []
    if not step:
        return out
    compute = b.get("compute", 0.0)
    host_other = b.get("host_other", 0.0)
    dispatch = b.get("dispatch", 0.0)
    compute_ms = (step_ms or 0) * compute / 100
    dispatches = step.get("dispatches_per_step_mean") or 0
    ops_per_step = step.get("ops_per_step_mean") or 0
    base = [
        _ev("get_step_trace", "step_time_ms_mean", step_ms, f"over {steps_n} steps ({step.get('step_source')})"),
        _ev("get_step_trace", "compute_percent", compute),
    ]

    # Too little work per step: the device finishes its work quickly and fixed per-step costs dominate.
    small_work = compute < 50 and compute_ms < 1.0 and dispatches <= 3 and (step_ms or 0) < 10
    if small_work:
        out.append(Hypothesis(
            "low_utilization", 100 - compute,
            "Too little work per step: fixed per-step overhead dominates",
            f"Each step keeps the device busy for only {compute_ms:.3g} ms of {step_ms:.3g} ms "
            f"({compute}%); the rest is per-step overhead ({_overhead_text(b)}) that does not shrink with the work, "
            "so the hardware mostly waits.",
            base + [_ev("get_step_trace", "dispatches_per_step_mean", dispatches),
                    _ev("get_step_trace", "ops_per_step_mean", ops_per_step),
                    _ev("get_utilization_viewer", "busy_percent_mean", _s(results, "get_utilization_viewer").get("busy_percent_mean"))],
            f"Throughput per step can grow ~{100 / max(compute, 1):.3g}× before the device becomes the limit "
            f"(device busy {compute}% now).",
            advice.more_work_per_step(_context(results)),
        ))

    # Op-by-op dispatch: many small jitted dispatches per step.
    if (dispatches >= 20 and dispatch >= 10) or (dispatches >= 3 and dispatch >= 20):
        score = dispatch
        out.append(Hypothesis(
            "dispatch_overhead", score,
            "Op-by-op dispatch: the step runs as many small separately dispatched computations",
            f"Each step dispatches {dispatches:.0f} separate computations from Python; each pays launch and "
            f"Python overhead, and the device computes only {compute}% of the step.",
            base + [_ev("get_step_trace", "dispatches_per_step_mean", dispatches),
                    _ev("get_step_trace", "dispatch_percent", dispatch),
                    _ev("get_step_trace", "ops_per_step_mean", ops_per_step)],
            _saving(step_ms, score),
            _sentence(advice.compile_whole_step(_context(results))),
            follow_up=("aggregate_xplane_events", {"pattern": r"^(PjitFunction|PmapFunction)\(", "line": "python"}),
            extra_evidence=_events_evidence,
        ))

    # Recompilation: compile events inside the measured steps.
    compiles = step.get("compiles_per_step_mean") or 0
    compile_pct = b.get("compile", 0.0)
    with_compiles = step.get("steps_with_compiles") or 0
    if compile_pct >= 5 or (with_compiles >= 2 and compiles > 0):
        recompiled = _s(results, "list_hlo_modules").get("recompiled_names") or {}
        ev = base + [_ev("get_step_trace", "compile_percent", compile_pct),
                     _ev("get_step_trace", "steps_with_compiles", with_compiles, f"of {steps_n} steps"),
                     _ev("get_step_trace", "compiles_per_step_mean", compiles)]
        if recompiled:
            ev.append(_ev("list_hlo_modules", "recompiled_names", recompiled, "module name -> compiled versions"))
        out.append(Hypothesis(
            "recompilation", max(compile_pct, 15.0),
            "Recompilation inside the training loop",
            f"{with_compiles} of {steps_n} steps compile a program ({compile_pct}% of step time); a jitted "
            "function is being retraced, typically because an input shape, dtype or a static argument changes.",
            ev,
            _saving(step_ms, compile_pct),
            advice.static_shapes(_context(results)),
            follow_up=("aggregate_xplane_events", {"pattern": r"compile|lower_sharding_computation|lower_jaxpr"}),
            extra_evidence=_events_evidence,
        ))

    # Blocking host <-> device syncs and host callbacks.
    sync_pct = b.get("host_sync", 0.0)
    syncs = step.get("syncs_per_step_mean") or 0
    callbacks = step.get("callbacks_per_step_mean") or 0
    callback_share = (_s(results, "get_hlo_op_profile").get("category_percent") or {}).get("host_callback", 0.0)
    busy = compute + b.get("collective", 0.0) + b.get("transfer", 0.0)
    callback_step = round(callback_share * busy / 100, 2)  # callbacks run as device ops: their share of the step
    largest_wait = _largest_non_compute(b) == "host_sync" and sync_pct >= 15
    # One wait at the end of a step is the usual pattern (and on a fast device its latency shows as
    # host_sync time); several waits per step, host callbacks, or a wait that is the step's largest
    # non-compute time are the problem.
    if (((syncs >= 2 and sync_pct >= 5) or callbacks >= 1 or callback_share >= 5 or (largest_wait and not small_work))
            and max(sync_pct, callback_step) >= 1):
        wait_name, wait_ms = step.get("largest_sync_event"), step.get("largest_sync_event_ms")
        # Say only what was measured: a wait count or share of 0 is no evidence and must not read as a finding.
        what = [f"the host waits on device results {syncs:g} times per step"] if syncs else []
        if callbacks:
            what.append(f"calls back into Python {callbacks:g} times per step")
        if callback_share:
            what.append(f"host callbacks take {callback_share}% of device op time ({callback_step}% of the step)")
        score = min(max(sync_pct, callback_step), 100.0)
        out.append(Hypothesis(
            "host_sync", score,
            "Blocking host–device synchronisation inside the step",
            _sentence(("; ".join(what) or "the host blocks on the device")
                      + (f"; {sync_pct}% of step time is spent blocked with no device op running, which also stops "
                         "the host from queueing the next step" if sync_pct else "; the device waits while Python runs")
                      + (f"; the longest wait is {wait_name} ({wait_ms:.4g} ms in all)" if wait_name else "")),
            base + ([_ev("get_step_trace", "host_sync_percent", sync_pct)] if sync_pct else [])
            + ([_ev("get_step_trace", "syncs_per_step_mean", syncs)] if syncs else [])
            + ([_ev("get_step_trace", "largest_sync_event", wait_name, f"{wait_ms} ms in all")] if wait_name else [])
            + ([_ev("get_step_trace", "callbacks_per_step_mean", callbacks)] if callbacks else [])
            + ([_ev("get_hlo_op_profile", "category_percent.host_callback", callback_share)] if callback_share else []),
            _saving(step_ms, score),
            _sentence(advice.sync_fix(_context(results), wait_name, bool(callbacks or callback_share))),
            follow_up=("aggregate_xplane_events", {"pattern": r"np\.asarray|device_get|Await|ToLiteral|callback|__array__|item|block_until_ready"}),
            extra_evidence=_events_evidence,
        ))

    # Warm-up: the first call of a jitted function takes far longer than its later ones (or a GPU runtime call far
    # longer than its call's median: module loading, context creation).
    warm_up = b.get("warm_up", 0.0)
    if warm_up >= 5 and step.get("first_call_ms"):
        first_ms, later_ms = step["first_call_ms"], step.get("later_call_ms_median")
        runtime = step.get("warm_up_is_a_runtime_call")
        slow = step.get("slow_runtime_calls", 0)
        happening = (
            f"{slow} GPU runtime call{'s take' if slow != 1 else ' takes'} far longer than {'their' if slow != 1 else 'its'} "
            f"call's median ({', '.join(step.get('slow_runtime_call_examples') or [])}): one-time work (loading a kernel's module on first use, creating the context, a stream or a "
            f"library handle, growing the allocator), not per-call overhead, {warm_up}% of step time."
            if runtime else
            f"The first call of {step.get('warm_up_function')} takes {first_ms:.4g} ms against {later_ms:.3g} ms for "
            f"the later calls (median): a one-time cost (compilation cache lookup, buffer allocation, autotuning, "
            f"loading the program) that falls inside the measured steps, {warm_up}% of step time.")
        out.append(Hypothesis(
            "warm_up", warm_up,
            "One-time GPU runtime calls (initialisation, module loading) far longer than the others" if runtime
            else "The first call is a warm-up far longer than the later calls",
            happening,
            base + [_ev("get_step_trace", "warm_up_percent", warm_up),
                    _ev("get_step_trace", "first_call_ms", first_ms, str(step.get("warm_up_function"))),
                    _ev("get_step_trace", "later_call_ms_median", later_ms)],
            _saving(step_ms, warm_up) + "; paid once per process, so it matters for short jobs and for timing",
            _sentence(advice.warm_up_fix(_context(results))),
        ))

    # Input pipeline / host-bound: the step's time is host work the device waits for.
    if host_other >= HOST_BOUND_MIN_PERCENT and not small_work:
        out.append(Hypothesis(
            "input_bound", host_other,
            "Host-bound step: the device waits for host work outside the compiled step",
            f"{host_other}% of each step ({(step_ms or 0) * host_other / 100:.3g} ms) has no device op, "
            "compilation, transfer or dispatch running: the host is busy in Python or input processing "
            "(data loading, preprocessing, batching) while the device idles.",
            base + [_ev("get_step_trace", "host_other_percent", host_other),
                    _ev("get_step_trace", "device_idle_percent", step.get("device_idle_percent"))],
            _saving(step_ms, host_other),
            advice.feed_input(_context(results)),
            follow_up=("aggregate_xplane_events", {"pattern": ".", "line": "python"}),
            extra_evidence=_events_evidence,
        ))

    # Collectives.
    collective = b.get("collective", 0.0)
    op_collective = (_s(results, "get_hlo_op_profile").get("category_percent") or {}).get("collective", 0.0)
    if collective >= 15 or op_collective >= 30:
        ops = [o for o in _d(results, "get_hlo_op_profile").get("ops", []) if o.get("category") == "collective"]
        ev = base + [_ev("get_step_trace", "collective_percent", collective),
                     _ev("get_hlo_op_profile", "category_percent.collective", op_collective)]
        if ops:
            ev.append(_ev("get_hlo_op_profile", f"top collective {ops[0]['op']}", ops[0]["total_ms"],
                          f"ms over {ops[0]['count']} runs{_shape_note(ops[0])}"))
        unseen = (_s(results, "get_hosts").get("not_available") or {}).get("straggler")
        if unseen and _s(results, "get_hosts").get("ranks_not_in_session"):
            # A lone rank's time in a collective is its transfer and its wait for the last rank, which only the
            # other ranks' traces tell apart.
            ev.append(_ev("get_hosts", "not_available.straggler", unseen))
        out.append(Hypothesis(
            "collectives", max(collective, op_collective * compute / 100),
            "Collective communication dominates the step",
            f"Collective ops (all-reduce, all-gather, …) take {op_collective}% of op time and the devices spend "
            f"{collective}% of the step only communicating; compute per device is too small to hide it."
            + (" Part of that time may be waiting for a slower rank, which this session cannot show: "
               f"{unseen}." if unseen and _s(results, "get_hosts").get("ranks_not_in_session") else ""),
            ev,
            _saving(step_ms, collective),
            _sentence(_collective_fix(ops[0] if ops else None, step, health, _context(results))),
            follow_up=("get_hlo_neighborhood", {"op": ops[0]["op"], "module": ops[0]["module"]}) if ops and ops[0].get("module") else None,
            extra_evidence=_neighborhood_evidence,
        ))

    out += _compiler_hypotheses(health, results, base, out)
    out += _roofline_hypotheses(health, results, base, out)
    out += _transfer_hypotheses(health, results, base)
    out += _unfused_kernel_hypotheses(health, results, base)
    out += _opaque_kernel_hypotheses(health, results, base, out)

    pressure = memory_pressure_hypothesis(health, results)
    if pressure is not None:
        out.append(pressure)

    # A straggler: the participant the others wait for at the collectives, named with its own cause.
    straggler = _straggler_hypothesis(results, step_ms)
    if straggler is not None:
        out.append(straggler)
    else:
        hosts = _s(results, "get_hosts")
        if (hosts.get("step_time_spread_percent") or 0) >= 20:
            out.append(Hypothesis(
                "straggler_host", min(hosts["step_time_spread_percent"], 60.0),
                f"Host {hosts['slowest_host']} is a straggler",
                f"Its mean step time is {hosts['step_time_spread_percent']}% above the fastest host's; the hosts do "
                "not run in lockstep, so the slowest one sets the pace of whatever waits for all of them.",
                [_ev("get_hosts", "step_time_spread_percent", hosts["step_time_spread_percent"]),
                 _ev("get_hosts", "slowest_host", hosts["slowest_host"])],
                f"Up to {hosts['step_time_spread_percent']:.0f}% faster steps on the other hosts.",
                "Compare that host's input pipeline and hardware health; balance data shards.",
                follow_up=("get_hosts", {}),
            ))
    # Nothing above explains an idle device: say so with the numbers, rather than stay silent.
    idle = round(100 - compute - b.get("collective", 0.0) - b.get("transfer", 0.0), 2)
    if compute < 80 and idle >= 10 and not any(h.score >= 15 for h in out):
        util = _s(results, "get_utilization_viewer")
        devices = _d(results, "get_utilization_viewer").get("devices", [])
        out.append(Hypothesis(
            "device_idle", idle,
            f"Devices idle for {idle}% of the step with no single host-side cause in the trace",
            f"The devices compute {compute}% of the step; the host is busy outside the compiled step "
            f"{host_other}% of it, and no compile, sync or dispatch explains the rest."
            + (f" Device busy time ranges from {util.get('busy_percent_min')}% ({util.get('least_busy_device')}) "
               f"to {util.get('busy_percent_max')}% across {util.get('devices')} devices." if devices else ""),
            base + [_ev("get_step_trace", "device_idle_percent", step.get("device_idle_percent")),
                    _ev("get_step_trace", "host_other_percent", host_other)]
            + ([_ev("get_utilization_viewer", "busy_percent_min", util.get("busy_percent_min"), util.get("least_busy_device", "")),
                _ev("get_utilization_viewer", "busy_percent_max", util.get("busy_percent_max"))] if devices else []),
            _saving(step_ms, idle),
            "Find what the devices wait for: capture again with host_tracer_level=2 and python_tracer_level=1 to "
            "see host activity; balance work across devices if some are much less busy; check the input "
            "pipeline and inter-device dependencies.",
        ))
    kept = [h for h in _reconcile(out, b, step_ms, step) if h.key in NOT_TIME_FINDINGS or h.score >= MIN_FINDING_PERCENT]
    return _causes_first(sorted(kept, key=lambda h: -h.score))


LARGEST_BUFFERS_NAMED = 3
"""How many of the largest buffers a memory-pressure finding names."""


def _largest_buffers(results: dict[str, ToolResult]) -> list[dict]:
    """get_peak_allocations' largest buffers, largest first, each as {name, mib, shape, made_by, argument}: rows of
    XProf's memory viewer (instruction, size) or of the HLO (value, shape, opcode, framework op)."""
    rows = _d(results, "get_peak_allocations").get("buffers") or []
    buffers = [{"name": r.get("value") or r.get("instruction"), "mib": r.get("size_mib"), "shape": r.get("shape"),
                "made_by": r.get("framework_op"),
                "argument": r["opcode"] == "parameter" if r.get("opcode") else None}
               for r in rows if (r.get("value") or r.get("instruction")) and r.get("size_mib")]
    return sorted(buffers, key=lambda b: -b["mib"])


def _buffer_text(b: dict) -> str:
    shape = f" {b['shape'].split('{')[0]}" if b.get("shape") else ""
    kind = {True: "an argument", False: "a value the step computes"}.get(b["argument"], "")
    about = ", ".join(x for x in (f"{b['mib']:g} MiB", kind, b.get("made_by") and f"from {b['made_by']}") if x)
    return f"{b['name']}{shape} ({about})"


def memory_pressure_hypothesis(health: dict[str, Any], results: dict[str, ToolResult]) -> Hypothesis | None:
    """Out-of-memory risk above LOW: the peak against the limit, the largest buffers that make it (get_peak_allocations)
    and the lever for what holds them: values the step computes (rematerialise, smaller micro-batches) or its
    arguments (donate, shard, offload)."""
    risk = health.get("oom_risk")
    if risk not in OOM_RISKS_ABOVE_LOW:
        return None
    mem = _s(results, "get_memory_profile")
    allocations = _s(results, "get_peak_allocations")
    largest = _largest_buffers(results)
    named = largest[:LARGEST_BUFFERS_NAMED]
    typed = [b for b in largest if b["argument"] is not None]
    argument_mib = sum(b["mib"] for b in typed if b["argument"])
    value_mib = sum(b["mib"] for b in typed if not b["argument"])
    values_first = value_mib >= argument_mib
    module = allocations.get("module") or allocations.get("peak_module")
    held = ""
    if typed:
        total = argument_mib + value_mib
        held = (f" Of the {len(typed)} largest buffers ({total / 1024:.3g} GiB), "
                f"{100 * value_mib / total:.0f}% are values the step computes (activations, gradients, temporaries) "
                f"and {100 * argument_mib / total:.0f}% its arguments (weights, optimizer state, the batch).")
    evidence = [_ev("get_memory_profile", "peak_memory_gib", mem.get("peak_memory_gib")),
                _ev("get_memory_profile", "capacity_gib", mem.get("capacity_gib")),
                *([_ev("get_memory_profile", "allocator_limit_gib", mem["allocator_limit_gib"])]
                  if mem.get("allocator_limit_gib") is not None else []),
                _ev("get_memory_profile", "headroom_percent", mem.get("headroom_percent")),
                _ev("get_memory_profile", "oom_risk", risk)]
    evidence += [_ev("get_peak_allocations", f"buffer {b['name']}", b["mib"], _buffer_text(b)) for b in named]
    if allocations.get("hlo_values_live_at_once_gib") is not None:
        evidence.append(_ev("get_peak_allocations", "hlo_values_live_at_once_gib",
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
           " Which buffers make the peak is not available: " + (_reason(results, "get_peak_allocations")
                                                                 or "get_peak_allocations reported no buffer sizes")
           + ".")
        + held,
        evidence,
        "Avoids an out-of-memory failure as batch or sequence length grows, and makes room for a larger batch.",
        advice.cut_peak_memory(_context(results), values_first),
    )


def _reason(results: dict[str, ToolResult], tool: str) -> str | None:
    result = results.get(tool)
    return result.reason if result is not None and not result.ok else None


MIN_FINDING_PERCENT = 1.0
"""A finding must stake at least this share of the step: below it, it is noise in the report."""
NOT_TIME_FINDINGS = {"memory_pressure"}
"""Findings whose score is a risk level, not a share of step time."""
NON_COMPUTE = ("collective", "transfer", "compile", "warm_up", "host_sync", "dispatch", "host_other")


def _host_work_on_reads(out: list[Hypothesis], found: dict[str, Hypothesis], b: dict[str, float],
                        step_ms: float | None, step: dict[str, Any]) -> list[Hypothesis]:
    """Host time that begins where a read copying device arrays back ends is the host working on what it read
    (numpy on fetched weights or activations): its fix is the reads' fix (compute it on the device, fetch less), not
    an input pipeline's (prefetching cannot run ahead of data the device has not produced yet)."""
    sync, host_bound = found.get("host_sync"), found.get("input_bound")
    after_read = step.get("host_after_read_percent") or 0.0
    if sync is None or host_bound is None or after_read < host_bound.score / 2:
        return out
    sync.score = min(sync.score + after_read, 100.0)
    copies = b.get("transfer", 0.0)
    sync.whats_happening += (
        f" Right after the reads that copy arrays back (host–device copies take {copies}% of the step), the host works on "
        f"what they returned for another {after_read}% of it before it dispatches more work, with the device idle: "
        "that host time exists because of the reads, so it is counted here rather than as input work.")
    sync.evidence.append(_ev("get_step_trace", "host_after_read_percent", after_read,
                             f"of the {b.get('host_other')}% host time outside any traced call"))
    sync.expected_impact = _saving(step_ms, sync.score)
    sync.fix = _sentence(sync.fix.rstrip(".") + "; compute on the device (jnp) what the host computes on the arrays "
                         "it fetches, and fetch only that result, not whole arrays")
    host_bound.score = round(host_bound.score - after_read, 2)
    if host_bound.score < HOST_BOUND_MIN_PERCENT:
        found.pop("input_bound")
    return [h for h in out if h.key != "input_bound" or "input_bound" in found]


def _largest_non_compute(b: dict[str, float]) -> str | None:
    """The breakdown category, other than compute, that takes the most step time."""
    shares = {k: b.get(k) or 0.0 for k in NON_COMPUTE}
    key = max(shares, key=shares.get)
    return key if shares[key] > 0 else None


def _overhead_text(b: dict[str, float]) -> str:
    """The non-compute shares of the step that the breakdown measured, largest first."""
    parts = sorted(((k, b.get(k) or 0.0) for k in NON_COMPUTE), key=lambda kv: -kv[1])
    return ", ".join(f"{k.replace('_', ' ')} {v}%" for k, v in parts if v >= 1) or "no single host-side cause"


def _program(module: str | None) -> str:
    """An HLO module's name without the id the HLO checks add (`jit_step(8)` -> `jit_step`), as op rows name it."""
    return re.sub(r"\(\d+\)$", "", module or "")


def _causes_first(ranked: list[Hypothesis]) -> list[Hypothesis]:
    """A finding whose ops add the bytes that make another finding's ops slow (a widening convert writes the f32 copy
    that memory-bound reductions read back) is that symptom's cause: it stakes at least the symptom's time, comes
    before it, and each says how they are linked."""
    order = list(ranked)
    for cause in ranked:
        for symptom in ranked:
            shared = sorted(op for _, op in cause.inflates & symptom.ops)
            if symptom is cause or not shared:
                continue
            named = ", ".join(shared[:4])
            cause.score = max(cause.score, symptom.score)
            cause.whats_happening += (f" What these ops write is read by {named}, ops of the '{symptom.title}' "
                                      "finding: this is that finding's cause, so it comes first.")
            symptom.whats_happening += (f" {len(shared)} of these ops ({named}) read what the ops of the "
                                        f"'{cause.title}' finding write: that finding is their cause and comes first.")
            if order.index(cause) > order.index(symptom):
                order.remove(cause)
                order.insert(order.index(symptom), cause)
    return order


HOST_BOUND_MIN_PERCENT = 30.0
"""Host time outside every explained event (host_other) at which the step reads as host-bound."""


def _reconcile(out: list[Hypothesis], b: dict[str, float], step_ms: float | None,
               step: dict[str, Any]) -> list[Hypothesis]:
    """One cause, one finding: time a stronger explanation already accounts for is not reported twice."""
    found = {h.key: h for h in out}
    out = _host_work_on_reads(out, found, b, step_ms, step)
    straggler = found.get("straggler_host")
    if straggler is not None and "straggler_cause" in {e.metric for e in straggler.evidence}:
        waited = straggler.score
        collectives = found.get("collectives")
        if collectives is not None:
            # The others' wait for the straggler shows as collective time; it is the straggler's finding.
            collectives.score = max(collectives.score - waited, 0.0)
            if collectives.score < 5:
                out = [h for h in out if h.key != "collectives"]
        cause = next(e.value for e in straggler.evidence if e.metric == "straggler_cause")
        if cause == "host_other" and "input_bound" in found:
            out = [h for h in out if h.key != "input_bound"]  # the host time is the straggler's own, not everyone's
    if "unfused_kernels" in found and "dispatch_overhead" in found:
        # The framework's op-by-op launches are the launch gaps the unfused-kernels finding already stakes.
        out = [h for h in out if h.key != "dispatch_overhead"]
        found.pop("dispatch_overhead")
    dispatch = found.get("dispatch_overhead")
    if dispatch is not None and "input_bound" in found and "dispatches_per_step_mean" in {e.metric for e in dispatch.evidence}:
        dispatches = next(e.value for e in dispatch.evidence if e.metric == "dispatches_per_step_mean")
        if dispatches >= 20:
            # Op-by-op code: the host time between many small launches is the Python that drives them.
            host_other = found["input_bound"].score
            dispatch.score = min(dispatch.score + host_other, 100.0)
            dispatch.whats_happening += (
                f" Between the launches the host runs Python for another {host_other}% of the step with no device "
                "work: in op-by-op code that is the driving loop's own overhead, counted here rather than as input."
            )
            dispatch.evidence.append(_ev("get_step_trace", "host_other_percent", b.get("host_other")))
            dispatch.expected_impact = _saving(step_ms, dispatch.score)
            out = [h for h in out if h.key != "input_bound"]
    return out



_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8}
_ARRAY_SHAPE = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")


def _array_bytes(shape: str) -> int | None:
    """Bytes of one HLO array shape text ("f32[1048576]{0}"); None where the type is not a plain array."""
    match = _ARRAY_SHAPE.match(shape)
    if not match or match.group(1) not in _DTYPE_BYTES:
        return None
    return _DTYPE_BYTES[match.group(1)] * math.prod(int(d) for d in match.group(2).split(",") if d)


def _collective_fix(top: dict | None, step: dict[str, Any], health: dict[str, Any], ctx: advice.Context) -> str:
    """What the top collective's own row shows: how often it runs per device and step, inside a loop or not,
    and which operand carries its bytes; the general levers only where the row shows nothing more."""
    generic = advice.communicate_less(ctx)
    if not top:
        return generic
    parts = []
    device_steps = (step.get("steps") or 0) * ((health.get("devices") or {}).get("active_devices") or 1)
    runs = top["count"] / device_steps if device_steps else 0
    scope = str(top.get("framework_op") or "")
    if runs >= 1.5 and ("while/body" in scope or "scan" in scope):
        parts.append(f"{top['op']} runs {runs:.3g} times per device and step inside a loop ({scope}), on the same "
                     "shapes each time: accumulate over the loop's iterations (micro-batches) and reduce once per step")
    sizes = [(s, b) for s in top.get("operand_shapes") or [] if (b := _array_bytes(s)) is not None]
    total = sum(b for _, b in sizes)
    if len(sizes) > 1 and total:
        shape, largest = max(sizes, key=lambda sb: sb[1])
        if largest >= 0.8 * total:
            parts.append(f"its operand {shape.split('{')[0]} carries {100 * largest / total:.0f}% of the "
                         f"{total / 1e6:.3g} MB each run sends: check that this buffer must be reduced every step, "
                         "and reduce it in bf16 or shard it instead of replicating it")
    return "; ".join(parts + ["otherwise " + generic]) if parts else generic


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _context(results: dict[str, ToolResult]) -> advice.Context:
    return advice.context(_s(results, "get_device_information"))


def _compiler_hypotheses(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence],
                         found: list[Hypothesis]) -> list[Hypothesis]:
    """Compiler inefficiencies read from the HLO: layout copies, materialised widening converts, unfused
    data movement."""
    b = health.get("breakdown_percent", {})
    compute, step_ms = b.get("compute", 0.0), health.get("step_time_ms")
    ctx = _context(results)
    layout = _s(results, "detect_layout_mismatch_copies")
    out: list[Hypothesis] = []
    for tool, key, title, happening, fix in (
        ("detect_layout_mismatch_copies", "layout_copies",
         "Layout-changing copies and transposes take a large share of op time",
         "Ops that only move data into another layout (transposes, layout copies) take {share}% of op time; "
         "the largest is {op} {shape} ({why})" + (", next to a convolution." if layout.get("top_op_next_to_convolution") else "."),
         _sentence(advice.layout_fix(ctx, bool(layout.get("top_op_next_to_convolution"))) + "; re-check with detect_layout_mismatch_copies")),
        ("detect_unnecessary_convert_reduce", "widening_converts",
         "Low-precision data is widened and written to memory before reductions",
         "Ops that convert {widening} and write the widened copy for a reduction to read back take {share}% of op "
         "time; the largest is {op} {shape}, which materialises the wider copy and moves twice the bytes.",
         "Reduce with an accumulator type instead of converting the input: jnp.sum(x, dtype=jnp.float32) "
         "or lax.dot_general(..., preferred_element_type=jnp.float32) so XLA fuses the widening into the "
         "reduction (it then widens in registers and writes nothing extra); keep activations in bf16 end to end."
         if ctx.framework in (None, "JAX") else
         "Reduce with an accumulator type instead of casting the whole input (tf.reduce_sum on bf16 with XLA, or "
         "torch.sum(x, dtype=torch.float32)), so the widening happens inside the reduction kernel."),
        ("detect_unfused_reshapes", "unfused_data_movement",
         "Data-movement ops run unfused",
         "Reshape/transpose/copy/broadcast ops run as separate kernels and take {share}% of op time; the "
         "largest is {op} {shape}.",
         "Let XLA fuse them: avoid optimization barriers and host round-trips between them, express the "
         "reshapes inside the compiled function, and prefer layouts that make reshapes bitcasts."),
    ):
        s = _s(results, tool)
        share = s.get("share_of_op_time_percent") or 0.0
        if share < 10 or not s.get("top_op"):
            continue
        if key == "unfused_data_movement" and any(h.key == "layout_copies" for h in found + out):
            continue  # the same ops, already reported as layout copies
        rows = _d(results, tool).get("ops") or [{}]
        top = rows[0]
        out.append(Hypothesis(
            key, share * compute / 100 if compute else share,
            title,
            happening.format(share=share, op=s["top_op"], shape=s.get("top_op_shape") or "",
                             why=s.get("top_op_why", ""), widening=s.get("widening", "")),
            base + [_ev(tool, "share_of_op_time_percent", share), _ev(tool, "count", s.get("count")),
                    _ev(tool, f"top op {s['top_op']}", top.get("total_ms"), f"ms over {top.get('count')} runs{_shape_note(top)}")],
            f"up to {share:.0f}% less op time; {_saving(step_ms, share * compute / 100 if compute else share)}",
            fix,
            follow_up=("get_hlo_neighborhood", {"op": s["top_op"], "module": top.get("module", "")}) if top.get("module") else None,
            extra_evidence=_neighborhood_evidence,
            ops=frozenset((_program(r.get("module")), r["op"]) for r in rows if r.get("op")),
            inflates=frozenset((_program(r.get("module")), reader) for r in rows for reader in r.get("read_by") or []),
        ))
    return out


def _roofline_hypotheses(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence],
                         found: list[Hypothesis]) -> list[Hypothesis]:
    """Memory-bound work that moves more bytes than it needs, and dominant ops far below their roof."""
    b = health.get("breakdown_percent", {})
    compute = b.get("compute", 0.0)
    ops = _s(results, "get_hlo_op_profile")
    ctx = _context(results)
    out: list[Hypothesis] = []
    low_share, low_ops = low_intensity_share(results)
    ridge = ops.get("ridge_flop_per_byte")
    below = f"below the device's ridge point ({ridge:g} FLOP/byte)" if ridge else "under 1 FLOP per byte moved"
    # Memory-bound work at its roof with ample arithmetic per byte is the nature of the work, not a defect; the
    # defect's reading (roofline.memory_bound_kind) decides the fix.
    waits = ops.get("memory_wait_percent") or 0.0
    if low_share is not None and (low_share + waits >= MEMORY_BOUND_FINDING_MIN_PERCENT and compute >= 30
            and ops.get("memory_bound_defect") and low_ops):
        out.append(_memory_bound_hypothesis(ops, low_share, low_ops, below, compute, base, ctx))
    # Thousands of dependent tiny steps: each op's fixed latency, not its bytes or FLOPs, sets the time.
    work = health.get("loop_work") or {}
    if is_latency_bound(work) and compute >= 30:
        share, efficiency = work["busiest_ops_share_percent"], work.get("busiest_ops_efficiency_percent")
        per_step = (health.get("per_step") or {}).get("ops_per_step_mean")
        out.append(Hypothesis(
            "latency_bound", share * (1 - (efficiency or 0) / 100) * compute / 100,
            "Latency-bound: thousands of dependent tiny steps in a loop",
            f"The busiest ops ({share}% of op time) run {work['loop_trips_per_run']:g} times per execution of their "
            f"loop, {work['busiest_ops_mean_us']} us each, at {efficiency}% of their roofline"
            + (f"; a step runs {per_step:g} ops" if per_step else "")
            + ". Each trip depends on the one before, so the device runs one tiny op after another: per-op latency "
            "sets the time, not memory bandwidth or arithmetic.",
            base + [_ev(tool, metric, value) for tool, metric, value in (
                ("get_hlo_op_profile", "loop_trips_per_run", work["loop_trips_per_run"]),
                ("get_hlo_op_profile", "busiest_ops_mean_us", work["busiest_ops_mean_us"]),
                ("get_hlo_op_profile", "busiest_ops_efficiency_percent", efficiency),
                ("get_step_trace", "ops_per_step_mean", per_step)) if value is not None],
            f"Each trip costs about the same whatever its size: k times more work per trip (batched sequences, a "
            f"wider hidden state) or k times fewer trips does up to k times the work in the same time; "
            f"{share}% of op time is at stake.",
            "Give each sequential step more work, or take fewer steps: batch more sequences through the loop at once, "
            "use larger hidden sizes, unroll the loop (lax.scan(..., unroll=k)) or process several time steps per "
            "trip (a chunked or parallel scan, e.g. jax.lax.associative_scan for linear recurrences).",
        ))
    # A busy device is not a healthy one when the ops that take most of its time run far below their roof.
    efficiency = ops.get("dominant_ops_roofline_efficiency_percent")
    roof = _s(results, "get_roofline_model")
    stall = roof.get("dma_stall_percent_of_top_ops")
    low_efficiency = efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT
    stalled = stall is not None and stall > DMA_STALL_MAX_PERCENT
    if (low_efficiency or stalled) and not any(h.key in ("memory_bound", "memory_transfers", "latency_bound")
                                               for h in found + out):
        share = ops.get("dominant_ops_share_percent") or 0.0
        bound = "compute" if "compute" in str(roof.get("op_time_bound_by", "")).lower() else "memory"
        lost = share * (1 - (efficiency or 100) / 100) if low_efficiency else share * stall / 100
        evidence = base + [_ev("get_hlo_op_profile", "dominant_ops", ", ".join(ops.get("dominant_ops") or [])),
                           _ev("get_hlo_op_profile", "dominant_ops_share_percent", share)]
        precision = ops.get("dominant_ops_matmul_precision")
        if precision:
            evidence.append(_ev("get_hlo_op_profile", "dominant_ops_matmul_precision", precision,
                                "operand precision of their matmuls, from the HLO's precision_config"))
        if efficiency is not None:
            evidence.append(_ev("get_hlo_op_profile", "dominant_ops_roofline_efficiency_percent", efficiency,
                                f"peaks: {ops.get('peak_tflops')} TFLOP/s, {ops.get('peak_hbm_gb_per_s')} GB/s ({ops.get('flops_source')})"))
        if stalled:
            evidence.append(_ev("get_roofline_model", "dma_stall_percent_of_top_ops", stall,
                                "time the busiest ops wait on their input copies (XProf)"))
        out.append(Hypothesis(
            "low_kernel_efficiency", lost * compute / 100,
            "The ops that take most of the time run far below their roofline",
            f"The busiest ops ({share}% of op time) reach "
            + (f"{efficiency}% of their roof" if efficiency is not None else "an unmeasured share of their roof")
            + (f" and wait on their input copies {stall}% of their time" if stalled else "")
            + (f"; their matmuls run at precision {precision}, whose extra passes the model's FLOPs do not count"
               if precision else "")
            + (": the device is busy, but not productive." if compute >= 30 else
               f"; the device computes only {compute}% of the step, and unproductively while it does."),
            evidence,
            f"Up to {lost:.0f}% of op time if they ran at their roof.",
            _sentence(advice.precision_fix(ctx, precision) if precision else advice.kernel_efficiency_fix(ctx, bound)),
        ))
    return out


def _memory_bound_hypothesis(ops: dict[str, Any], low_share: float, low_ops: list[dict], below: str, compute: float,
                             base: list[Evidence], ctx: advice.Context) -> Hypothesis:
    """One memory_bound finding whose title, impact and fix follow its kind: far below the bandwidth roof (the
    kernel), at it in loops that re-read the same data with little arithmetic per byte (the bytes per unit of
    work), else the passes a program makes over its data."""
    kind, waits = ops.get("memory_bound_kind"), ops.get("memory_wait_percent") or 0.0
    kind_bandwidth, intensity = ops.get("memory_bound_kind_bandwidth_percent"), ops.get("memory_intensity_flop_per_byte")
    ridge = ops.get("ridge_flop_per_byte")
    if kind == "below_bandwidth_roof":
        below_roof = [o for o in low_ops if (o.get("roofline_efficiency_percent") or 100) < 30] or low_ops
        top = max(below_roof, key=lambda o: o["total_ms"])
    else:
        top = max(low_ops, key=lambda o: o["total_ms"])
    evidence = base + [_ev("get_hlo_op_profile", "memory_bound_op_percent", low_share),
                       _ev("get_hlo_op_profile", f"{top['op']} arithmetic_intensity_flops_per_byte",
                           top["arithmetic_intensity_flops_per_byte"]),
                       _ev("get_hlo_op_profile", f"{top['op']} achieved_gb_per_s", top.get("achieved_gb_per_s"))]
    if kind is not None:
        evidence.append(_ev("get_hlo_op_profile", "memory_bound_kind", kind))
    if kind_bandwidth is not None:
        evidence.append(_ev("get_hlo_op_profile", "memory_bound_kind_bandwidth_percent", kind_bandwidth,
                            f"of {ops.get('peak_hbm_gb_per_s')} GB/s ({ops.get('bandwidth_source')})"))
    if waits:
        evidence.append(_ev("get_hlo_op_profile", "memory_wait_percent", waits,
                            "op time waiting for async copies from HBM into on-chip memory"))
    if ops.get("program_hbm_gb_per_s") is not None:
        evidence.append(_ev("get_hlo_op_profile", "program_hbm_gb_per_s", ops["program_hbm_gb_per_s"],
                            f"{ops['program_hbm_module']}'s HBM bytes over its op time, "
                            f"{ops['program_hbm_async_copy_share_percent']}% of them in its async copies into VMEM"))
    if ops.get("memory_passes") is not None:
        evidence.append(_ev("get_hlo_op_profile", "memory_passes", ops["memory_passes"],
                            "bytes the programs move per execution over the bytes they must read and write"))
    if (ops.get("memory_handed_on_percent") or 0) >= EXTRA_PASSES_DEFECT_PERCENT:
        evidence.append(_ev("get_hlo_op_profile", "memory_handed_on_percent", ops["memory_handed_on_percent"],
                            "op time moving arrays one kernel writes only for one other to read back"))
    share = round(low_share + waits, 2)
    whats = (f"{low_share}% of op time is in ops {below}" + (f" and {waits}% waits for data prefetched from HBM"
                                                             if waits else "")
             + "; " + " and ".join(ops.get("memory_bound_why") or [])
             + f". The largest is {top['op']} ({top.get('shape')}, {top['arithmetic_intensity_flops_per_byte']} "
             f"FLOP/byte at {top.get('achieved_gb_per_s')} GB/s).")
    follow_up = ("get_hlo_neighborhood", {"op": top["op"], "module": top.get("module", "")}) if top.get("module") else None
    staked = frozenset((_program(o.get("module")), o["op"]) for o in low_ops)
    if kind == "below_bandwidth_roof":
        # Half the gap to the roof (a better kernel rarely reaches it), or the extra passes, whichever is larger.
        recoverable = max(ops.get("memory_extra_pass_percent") or 0.0, low_share * (1 - (kind_bandwidth or 100) / 100) / 2)
        fix = advice.below_roof_fix(ctx)
        if (ops.get("memory_extra_pass_percent") or 0) >= 20:
            fix += "; and " + advice.fuse_passes(ctx)
        return Hypothesis(
            "memory_bound", recoverable * compute / 100, "Memory-bound ops run far below the HBM bandwidth roof",
            whats, evidence,
            f"The bytes themselves would take a fraction of this time at the roof: a better kernel or algorithm "
            f"recovers up to {recoverable:.0f}% of op time.",
            _sentence(fix), follow_up=follow_up, extra_evidence=_neighborhood_evidence,
            ops=staked)
    if kind == "at_bandwidth_roof" and ops.get("memory_bound_rereads_in_loops"):
        ceiling = 100 * intensity / ridge if intensity is not None and ridge else None
        recoverable = share * (1 - (ceiling or 0) / 100)
        fix = advice.more_work_per_byte(ctx)
        if (ops.get("memory_extra_pass_percent") or 0) >= 20:
            fix = advice.fuse_passes(ctx) + "; and " + fix
        return Hypothesis(
            "memory_bound", recoverable * compute / 100,
            "Memory-bound at the HBM bandwidth roof: a loop re-reads the same data with little arithmetic per byte",
            whats, evidence,
            (f"At {intensity:g} FLOP per byte this work can reach at most {ceiling:.2g}% of the compute peak: "
             if ceiling is not None else "")
            + "its time falls only with the bytes per unit of work; serving k rows or tokens per byte read does up "
            f"to k times the work in about the same time ({share:g}% of op time at stake).",
            _sentence(fix), follow_up=follow_up, extra_evidence=_neighborhood_evidence,
            ops=staked)
    passes = ops.get("memory_passes") or 1.0
    # Only the extra passes are recoverable (the data must still move once); bandwidth left unused, half of it.
    recoverable = max(ops.get("memory_extra_pass_percent") or 0.0,
                      low_share * (1 - (ops.get("memory_bandwidth_efficiency_percent") or 100) / 100) / 2)
    return Hypothesis(
        "memory_bound", recoverable * compute / 100, "Memory-bound ops move more bytes than the work needs",
        whats, evidence,
        f"Bandwidth-bound time shrinks only with the bytes moved: making {passes:g} passes one, or using the "
        f"bandwidth fully, cuts up to {recoverable:.0f}% of op time; the rest is the data's one necessary pass.",
        _sentence(advice.fuse_passes(ctx, bool(ops.get("memory_handed_on_by_product")))), follow_up=follow_up,
        extra_evidence=_neighborhood_evidence, ops=staked)


def _transfer_hypotheses(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence]) -> list[Hypothesis]:
    """Transfers between memory spaces (async copies, host offload, memcpy) dominating device time; what
    overlap can recover is bounded by the compute there is to overlap with."""
    b = health.get("breakdown_percent", {})
    compute, step_ms = b.get("compute", 0.0), health.get("step_time_ms")
    profile = _s(results, "get_hlo_op_profile")
    categories = profile.get("category_percent") or {}
    transfer_share = round(categories.get("async_copy", 0.0) + categories.get("memcpy", 0.0), 2)
    host_transfer = _s(results, "get_step_trace").get("host_transfer_percent") or 0.0
    if transfer_share < 30 and host_transfer >= 30:
        return [_host_transfer_hypothesis(health, results, base, host_transfer)]
    if transfer_share < 30:
        return []
    ops = [o for o in _d(results, "get_hlo_op_profile").get("ops", []) if o.get("category") in ("async_copy", "memcpy")]
    ev = base + [_ev("get_hlo_op_profile", "category_percent.async_copy+memcpy", transfer_share)]
    if ops:
        ev.append(_ev("get_hlo_op_profile", f"top transfer {ops[0]['op']}", ops[0]["total_ms"],
                      f"ms over {ops[0]['count']} runs{_shape_note(ops[0])}"))
    copies = profile.get("async_copies") or {}
    link = copies.get("link_gb_per_s")
    if copies:
        ev.append(_ev("get_hlo_op_profile", "async_copies.gb_per_copy", copies.get("gb_per_copy"),
                      f"{copies.get('copies')} copies, {copies.get('span_ms_mean')} ms from copy-start to copy-done on average"))
    if link:
        ev.append(_ev("get_hlo_op_profile", "async_copies.link_gb_per_s", link,
                      "bytes over each copy's service time on its link, median"))
    busy = compute + b.get("collective", 0.0) + b.get("transfer", 0.0)
    memory = _s(results, "get_memory_profile")
    compute_ms = (step_ms or 0) * compute / 100
    impact = (
        f"Overlap cannot hide more than the compute there is: compute is {compute}% of the step "
        f"({compute_ms:.3g} ms), so better overlap recovers at most that; the transfers themselves take "
        f"{b.get('transfer', transfer_share)}% of it"
        + (f" at {link:g} GB/s per copy on the host link, which bounds them" if link else "")
        + ". Only moving fewer bytes (or fewer times) shortens the step by more."
    )
    return [Hypothesis(
        "memory_transfers", max(b.get("transfer", 0.0), transfer_share * busy / 100),
        "Memory transfers dominate device time",
        f"{transfer_share}% of device op time is copies between memory spaces ("
        + ("async copy-start/copy-done, host offload" if _context(results).platform == "TPU" else
           "memcpy between host and device, async copies")
        + ") rather than computation"
        + (f"; the largest is {ops[0]['op']}" + (f" ({ops[0]['shape']})" if ops[0].get("shape") else "") if ops else "")
        + (f". Each copy moves {copies['gb_per_copy']:g} GB and up to {copies.get('copies_in_flight_max')} are in "
           f"flight at once: the copies already overlap each other and the compute, so the limit is the link "
           f"({link:g} GB/s), not a missing overlap" if copies and link else "")
        + (f". Before and around them the host prepares the copies (mapping host buffers for DMA, re-tiling them) "
           f"for {host_transfer}% of the step, with no device op running" if host_transfer >= 5 else "") + ".",
        ev + ([_ev("get_step_trace", "host_transfer_percent", host_transfer,
                   "host<->device copy work seen on the host's lines (DMA buffer mapping, Linearize/Delinearize)")]
              if host_transfer >= 5 else []),
        impact,
        _sentence(advice.transfer_fix(_context(results), memory.get("peak_memory_gib"),
                                      memory.get("allocator_limit_gib") or memory.get("capacity_gib"))),
        follow_up=("get_hlo_neighborhood", {"op": ops[0]["op"], "module": ops[0]["module"]})
        if ops and ops[0].get("module") else None,
        extra_evidence=_neighborhood_evidence,
    )]


def _host_transfer_hypothesis(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence],
                              host_transfer: float) -> Hypothesis:
    """Host<->device copies that the device's op lines do not show (device_put, np.asarray of a result): their
    time is read from the host's lines, and their fix is moving less or overlapping, not removing a wait."""
    b = health.get("breakdown_percent", {})
    step = _s(results, "get_step_trace")
    syncs = step.get("syncs_per_step_mean") or 0
    return Hypothesis(
        "memory_transfers", host_transfer,
        "Host–device transfers dominate the step",
        f"{host_transfer}% of each step copies data between host and device memory (putting arrays on the device, "
        f"reading results back: the host's transfer events and the DMAs they issue), while the device computes "
        f"{b.get('compute', 0.0)}% of it"
        + (f"; the host blocks on {syncs:g} reads per step until their copies finish" if syncs else "") + ".",
        base + [_ev("get_step_trace", "host_transfer_percent", host_transfer,
                    "host<->device copies seen on the host's lines (device_put, Linearize/Delinearize, DMAs)"),
                _ev("get_step_trace", "transfer_percent", b.get("transfer"))]
        + ([_ev("get_step_trace", "syncs_per_step_mean", syncs)] if syncs else []),
        _saving(health.get("step_time_ms"), host_transfer),
        _sentence(advice.host_transfer_fix(_context(results))),
        follow_up=("aggregate_xplane_events", {"pattern": r"device_put|DevicePut|Linearize|TransferToDevice|TransferFromDevice"}),
        extra_evidence=_events_evidence,
    )


UNFUSED_KERNEL_MAX_US = 50.0
"""Kernels shorter than this on average are small enough that launch gaps and one pass per op dominate."""


def _unfused_kernel_hypotheses(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence]) -> list[Hypothesis]:
    """Many small elementwise kernels that no compiler fused (a framework running op by op without XLA)."""
    b = health.get("breakdown_percent", {})
    compute = b.get("compute", 0.0)
    rows = _d(results, "get_hlo_op_profile").get("ops", [])
    unfused = [o for o in rows if o.get("category") == "elementwise" and not o.get("module")]
    share = round(sum(o["share_of_op_time_percent"] for o in unfused), 2)
    kernels = sum(o["count"] for o in unfused)
    mean_us = sum(o["total_ms"] for o in unfused) * 1e3 / kernels if kernels else 0.0
    per_step = _s(results, "get_step_trace").get("ops_per_step_mean") or 0
    if share < 50 or mean_us > UNFUSED_KERNEL_MAX_US or per_step < 100:
        return []
    ctx = _context(results)
    idle = 100 - compute - b.get("collective", 0.0) - b.get("transfer", 0.0)
    top = max(unfused, key=lambda o: o["total_ms"])
    return [Hypothesis(
        "unfused_kernels", share * compute / 100 / 2 + idle / 2,
        "Many small unfused elementwise kernels: the step is launch-bound",
        f"{share}% of device op time is {kernels} elementwise kernels with no compiled program behind them "
        f"(mean {mean_us:.3g} µs each, {per_step:g} kernels per step), each reading and writing its operands in "
        f"its own pass; between them the device idles {idle:.3g}% of the step waiting for the next launch"
        + (f" ({ctx.framework} ops run one kernel each)" if ctx.framework else "") + ".",
        base + [_ev("get_hlo_op_profile", "unfused elementwise share of op time", share),
                _ev("get_hlo_op_profile", f"top kernel {top['op'][:80]}", top["total_ms"], f"ms over {top['count']} launches"),
                _ev("get_step_trace", "ops_per_step_mean", per_step),
                _ev("get_device_information", "framework", ctx.framework)],
        "Fusing a chain of k elementwise ops into one kernel removes k-1 launches and k-1 passes over memory; "
        f"at stake: the launch gaps ({idle:.3g}% of the step) and most of the {share}% of op time.",
        _sentence(advice.compile_whole_step(ctx)
                  + ("; XLA fuses a dropout's RandomUniform, GreaterEqual, Cast and Mul into one kernel"
                     if ctx.framework == "TensorFlow" else "")),
    )]


OPAQUE_KERNEL_MIN_PERCENT = 20.0
"""A custom kernel whose FLOPs no one can count that holds this share of op time always gets a finding."""
OPAQUE_KERNEL_MAX_SCORE = 39.0
"""Its score stays under P0's 40: its loss is unknown, not measured."""


def _opaque_kernel_hypotheses(health: dict[str, Any], results: dict[str, ToolResult], base: list[Evidence],
                              found: list[Hypothesis]) -> list[Hypothesis]:
    """Custom kernels (Pallas/Mosaic, Triton, library calls) holding OPAQUE_KERNEL_MIN_PERCENT of op time whose work
    no cost model gives: their share, the bandwidth their operand and result bytes set as a floor, and how to see
    inside. Where another finding already names them, that one speaks for them."""
    rows = _d(results, "get_hlo_op_profile").get("ops", [])
    opaque = [o for o in rows if o.get("opcode") == "custom-call" and o.get("flops_per_run") is None]
    share = round(sum(o["share_of_op_time_percent"] for o in opaque), 2)
    named = {o["op"] for h in found for e in h.evidence for o in opaque if o["op"] in str(e.metric)}
    if share < OPAQUE_KERNEL_MIN_PERCENT or named:
        return []
    top = max(opaque, key=lambda o: o["share_of_op_time_percent"])
    compute = health.get("breakdown_percent", {}).get("compute", 0.0)
    peak_gb_s = (health.get("peaks") or {}).get("peak_hbm_gb_per_s")
    floor = top.get("achieved_gb_per_s_floor")
    floor_text = (f"; its operand and result bytes alone set a floor of {floor:,.0f} GB/s"
                  + (f" ({100 * floor / peak_gb_s:.0f}% of the HBM peak)" if peak_gb_s else "") if floor else "")
    return [Hypothesis(
        # Half the time it holds, and never P0: what it would gain is not known until it is costed.
        "opaque_kernel", min(share * compute / 100 / 2, OPAQUE_KERNEL_MAX_SCORE),
        "Custom kernels whose work no profile shows hold most of the op time",
        f"{share}% of op time is in {len(opaque)} custom kernel(s) that carry no cost estimate and whose FLOPs the HLO "
        f"does not say; the largest, {top['op'][:80]}, takes {top['share_of_op_time_percent']}%{floor_text}. How close "
        "they run to the hardware's roofs cannot be measured from this profile.",
        base + [_ev("get_hlo_op_profile", "custom kernels' share of op time (FLOPs unknown)", share),
                _ev("get_hlo_op_profile", f"{top['op'][:80]} share_of_op_time_percent", top["share_of_op_time_percent"],
                    f"{top['count']} runs, {top['avg_us']} µs each"),
                *([_ev("get_hlo_op_profile", f"{top['op'][:80]} achieved_gb_per_s_floor", floor, top.get("floor_basis", ""))]
                  if floor else [])],
        f"Unknown until the kernel is costed; these kernels hold {share}% of op time.",
        "Give the kernel a cost estimate (Pallas: pallas_call(..., cost_estimate=pl.CostEstimate(flops=..., "
        "transcendentals=..., bytes_accessed=...))) so that profiles rate it against the roofline; time its phases "
        "inside with named scopes (jax.named_scope, pltpu.trace in a Mosaic kernel) and compare its FLOPs over its "
        "time with the chip's peak.",
    )]


def _roofline_sentence(health: dict[str, Any]) -> str:
    """How well the device's ops use it while they run, beside XProf's window figure when that differs."""
    efficiency, bound = health.get("roofline_efficiency_percent"), health.get("bound_by")
    if efficiency is None or not bound:
        return ""
    peaks = health.get("peaks") or {}
    text = (f"While they run, the device's ops reach {efficiency}% of their {'compute' if bound == 'compute' else 'bandwidth'} "
            f"roof ({peaks.get('device_model') or 'device'} peaks from the {str(peaks.get('flops_source', 'profile')).split(' (')[0]})")
    xprof = health.get("xprof_roofline_efficiency_percent")
    if xprof is not None and abs(xprof - efficiency) > max(5.0, 0.2 * efficiency):
        text += (f"; XProf's {xprof}% is over the capture window, idle included, with its own FLOP counts "
                 "(get_roofline_model's xprof_note reconciles the two)")
    return text + ". "


def _flags_not_findings(health: dict[str, Any], keys: set[str]) -> str:
    """The health flags the report shows that are not findings, each with why: a flag never stands unexplained."""
    notes = []
    low, compute = health.get("low_intensity_op_percent"), (health.get("breakdown_percent") or {}).get("compute", 0.0)
    if low is not None:
        low = round(low + (health.get("memory_wait_percent") or 0), 2)  # waits for HBM prefetches count with them
    if health.get("memory_bound_is_defect") and "memory_bound" not in keys:
        passes = health.get("memory_passes")
        flag = f"the op profile's memory-bound defect ({low}% of op time" + (f", {passes:g} passes" if passes and passes > 1 else "") + ")"
        if (low or 0) < MEMORY_BOUND_FINDING_MIN_PERCENT:
            notes.append(f"{flag} is not a finding: under the {MEMORY_BOUND_FINDING_MIN_PERCENT:g}% of op time at which "
                         "it becomes one")
        elif compute < 30:
            notes.append(f"{flag} is not a finding: the devices compute only {compute}% of the step, so op time is "
                         "not where the step's time goes")
    efficiency = health.get("dominant_ops_roofline_efficiency_percent")
    if efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT and "low_kernel_efficiency" not in keys:
        covered = keys & {"memory_bound", "memory_transfers"}
        notes.append(f"the busiest ops' {efficiency}% of their roofline is not a finding of its own: "
                     + (f"the {' and '.join(sorted(covered)).replace('_', ' ')} finding covers the same ops" if covered
                        else f"the time it could recover is under {MIN_FINDING_PERCENT:g}% of the step"))
    return ("Not findings: " + "; ".join(notes) + ". ") if notes else ""


class RuleEngine:
    """Deterministic investigator: rules over the tool outputs, no network."""

    name = "rules"

    def investigate(self, health: dict[str, Any], results: dict[str, ToolResult], call_tool: CallTool) -> Diagnosis:
        if health.get("healthy"):
            b = health["breakdown_percent"]
            return Diagnosis(
                status=Status.OPTIMAL,
                summary=(
                    f"The workload is healthy: over {health['steps']} steps of {health['step_time_ms']:.4g} ms the "
                    f"devices compute {b.get('compute')}% of the time, with {b.get('host_other', 0)}% host work, "
                    f"{b.get('collective', 0)}% collectives and {b.get('compile', 0)}% compilation. "
                    f"The busiest op is {health.get('top_op')} ({health.get('top_op_share_percent')}% of op time, "
                    f"{health.get('top_category')}). " + _roofline_sentence(health)
                    + _flags_not_findings(health, set()) + "No follow-up investigation was needed."
                ),
                investigator=self.name,
            )
        hypotheses = _hypotheses(health, results)
        calls: list[FollowUpCall] = []
        for hypothesis in hypotheses:
            if hypothesis.follow_up is None:
                continue
            name, args = hypothesis.follow_up
            result = call_tool(name, args, hypothesis.title)
            if result is None:
                break  # the follow-up budget is spent
            calls.append(FollowUpCall(tool=name, args=args, hypothesis=hypothesis.title, status=result.status, reason=result.reason))
            if result.ok and hypothesis.extra_evidence:
                hypothesis.evidence.extend(hypothesis.extra_evidence(result))
        findings = [h.finding() for h in hypotheses]
        reasons = health.get("unhealthy_because", [])
        if not findings:
            summary = (
                "Not OPTIMAL: " + "; ".join(reasons) + ". No rule matched a known bottleneck pattern strongly enough "
                "to report a finding; see the key metrics and the tool outputs."
            )
        else:
            top = findings[0]
            b = health.get("breakdown_percent", {})
            summary = (
                f"{len(findings)} issue(s) found; the biggest: {top.title.lower()} ({top.priority}). "
                f"Steps take {health.get('step_time_ms'):.4g} ms, of which the devices compute {b.get('compute')}%. "
                + _roofline_sentence(health)
                + (f"Also: {', '.join(f.title.lower() for f in findings[1:3])}. " if len(findings) > 1 else "")
                + _flags_not_findings(health, {f.key for f in findings})
                + f"{len(calls)} follow-up tool call(s) gathered the evidence below."
            )
        return Diagnosis(
            status=Status.NEEDS_ATTENTION,
            summary=summary,
            findings=findings,
            hypotheses=[f"{h.title} (score {h.score:.1f})" for h in hypotheses],
            follow_up_calls=calls,
            investigator=self.name,
        )


def _memory_limit_text(memory: dict[str, Any]) -> str:
    """'31.2 GiB', or where the allocator may use less than the device has: '144 GiB the allocator may use (192 GiB
    device memory)': the headroom is measured against the limit that runs out first."""
    capacity, limit = memory.get("capacity_gib"), memory.get("allocator_limit_gib")
    if limit is None:
        return f"{capacity} GiB"
    return f"{limit} GiB the allocator may use ({capacity} GiB device memory)"
