"""Findings about the host's share of the step: too little work per step, op-by-op dispatch, blocking syncs and
callbacks, warm-up, host-bound input, and devices idle with no single host-side cause."""

from __future__ import annotations

import re

from xdiag.investigators import advice
from xdiag.investigators.rules.hypothesis import Hypothesis, evidence, events_evidence, saving, sentence
from xdiag.investigators.rules.registry import Facts, rule

NON_COMPUTE = ("collective", "transfer", "compile", "warm_up", "host_sync", "dispatch", "host_other")
HOST_BOUND_MIN_PERCENT = 30.0
"""Host time outside every explained event (host_other) at which the step reads as host-bound."""


def largest_non_compute(b: dict[str, float]) -> str | None:
    """The breakdown category, other than compute, that takes the most step time."""
    shares = {k: b.get(k) or 0.0 for k in NON_COMPUTE}
    key = max(shares, key=shares.get)
    return key if shares[key] > 0 else None


def overhead_text(b: dict[str, float]) -> str:
    """The non-compute shares of the step that the breakdown measured, largest first."""
    parts = sorted(((k, b.get(k) or 0.0) for k in NON_COMPUTE), key=lambda kv: -kv[1])
    return ", ".join(f"{k.replace('_', ' ')} {v}%" for k, v in parts if v >= 1) or "no single host-side cause"


@rule("low_utilization")
def low_utilization(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Too little work per step: the device finishes its work quickly and fixed per-step costs dominate."""
    if not facts.small_work:
        return None
    compute, step_ms = facts.compute, facts.step_ms
    return Hypothesis(
        "low_utilization", 100 - compute,
        "Too little work per step: fixed per-step overhead dominates",
        f"Each step keeps the device busy for only {facts.compute_ms:.3g} ms of {step_ms:.3g} ms "
        f"({compute}%); the rest is per-step overhead ({overhead_text(facts.breakdown)}) that does not shrink with "
        "the work, so the hardware mostly waits.",
        facts.base + [evidence("get_step_trace", "dispatches_per_step_mean", facts.dispatches),
                      evidence("get_step_trace", "ops_per_step_mean", facts.step.get("ops_per_step_mean") or 0),
                      evidence("get_utilization_viewer", "busy_percent_mean",
                               facts.summary("get_utilization_viewer").get("busy_percent_mean"))],
        f"Throughput per step can grow ~{100 / max(compute, 1):.3g}× before the device becomes the limit "
        f"(device busy {compute}% now).",
        advice.more_work_per_step(facts.context()),
    )


@rule("dispatch_overhead")
def dispatch_overhead(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Op-by-op dispatch: many small jitted dispatches per step."""
    dispatches, booked = facts.dispatches, facts.breakdown.get("dispatch", 0.0)
    # A call's own argument copies (host arrays passed to it) are booked as its dispatch: they are bytes crossing the
    # host link, which jitting more of the step does not remove, not launches
    dispatch = round(max(booked - float(facts.step.get("dispatch_copy_percent") or 0.0), 0.0), 2)
    if not ((dispatches >= 20 and dispatch >= 10) or (dispatches >= 3 and dispatch >= 20)):
        return None
    score = dispatch
    return Hypothesis(
        "dispatch_overhead", score,
        "Op-by-op dispatch: the step runs as many small separately dispatched computations",
        f"Each step dispatches {dispatches:.0f} separate computations from Python; each pays launch and "
        f"Python overhead, and the device computes only {facts.compute}% of the step.",
        facts.base + [evidence("get_step_trace", "dispatches_per_step_mean", dispatches),
                      evidence("get_step_trace", "dispatch_percent", dispatch),
                      evidence("get_step_trace", "ops_per_step_mean", facts.step.get("ops_per_step_mean") or 0)],
        saving(facts.step_ms, score, facts.step.get("device_idle_percent")),
        sentence(advice.compile_whole_step(facts.context())),
        follow_up=("aggregate_xplane_events", {"pattern": r"^(PjitFunction|PmapFunction)\(", "line": "python"}),
        extra_evidence=events_evidence,
    )


FETCH_EVENT = re.compile(r"__float__|__int__|__bool__|__index__|__array__|\bitem\b|tolist|device_get|asarray|"
                         r"_value\b|ToLiteral|numpy")
"""A host wait that reads a value from the device (a fetch), as the Python tracer names it ($array.py __float__)."""
FETCH_IDLE_MIN_PERCENT = 5.0
"""The share of the step a per-step fetch must idle the device (its wait, the value's copy, the next dispatch)."""


@rule("host_sync")
def host_sync(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Blocking host <-> device syncs and host callbacks."""
    b, step = facts.breakdown, facts.step
    sync_pct = b.get("host_sync", 0.0)
    syncs = step.get("syncs_per_step_mean") or 0
    callbacks = step.get("callbacks_per_step_mean") or 0
    callback_share = (facts.summary("get_hlo_op_profile").get("category_percent") or {}).get("host_callback", 0.0)
    busy = facts.compute + b.get("collective", 0.0) + b.get("transfer", 0.0)
    callback_step = round(callback_share * busy / 100, 2)  # callbacks run as device ops: their share of the step
    largest_wait = largest_non_compute(b) == "host_sync" and sync_pct >= 15
    wait_name, wait_ms = step.get("largest_sync_event"), step.get("largest_sync_event_ms")
    # A value fetched every step (float(loss), .item(), np.asarray) stops the host until the step ends: the copy
    # of the value, the dispatch of the next step and the host's Python between them then run while the device
    # idles, where without the fetch the host would have queued the next step ahead. The device's idle time in the
    # step is the fetch's cost (lstm_linen_train: one __float__ per step; 4.1% waiting + 2.2% copying + 4.3%
    # dispatching, 11.6% of the step idle; removing it took 14.7% off the program's step).
    fetch_idle = round(step.get("device_idle_percent")
                       or sync_pct + b.get("transfer", 0.0) + b.get("dispatch", 0.0), 2)
    fetches = (syncs >= 1 and bool(wait_name) and bool(FETCH_EVENT.search(str(wait_name)))
               and "block_until_ready" not in str(wait_name) and fetch_idle >= FETCH_IDLE_MIN_PERCENT
               # where copies hold the most of the idle the step is transfer-bound (memory_transfers' finding)
               and largest_non_compute(b) in ("host_sync", "dispatch"))
    # One wait at the end of a step is the usual pattern (and on a fast device its latency shows as
    # host_sync time); several waits per step, host callbacks, a wait that is the step's largest
    # non-compute time, or a value fetched every step whose wait idles the device are the problem.
    if not (((syncs >= 2 and sync_pct >= 5) or callbacks >= 1 or callback_share >= 5 or fetches
             or (largest_wait and not facts.small_work)) and max(sync_pct, callback_step) >= 1):
        return None
    # Say only what was measured: a wait count or share of 0 is no evidence and must not read as a finding.
    what = [f"the host waits on device results {'once' if syncs == 1 else f'{syncs:g} times'} per step"] if syncs else []
    if callbacks:
        what.append(f"calls back into Python {'once' if callbacks == 1 else f'{callbacks:g} times'} per step")
    if callback_share:
        what.append(f"host callbacks take {callback_share}% of device op time ({callback_step}% of the step)")
    if fetches:
        what.append(f"each wait fetches a value, so the copy of it ({b.get('transfer', 0.0)}% of the step) and the "
                    f"dispatch of the next step ({b.get('dispatch', 0.0)}%) also run with the device idle: it idles "
                    f"{fetch_idle}% of the step")
    score = min(max(sync_pct, callback_step, fetch_idle if fetches else 0.0), 100.0)
    return Hypothesis(
        "host_sync", score,
        "Blocking host–device synchronisation inside the step",
        sentence(("; ".join(what) or "the host blocks on the device")
                 + (f"; {sync_pct}% of step time is spent blocked with no device op running, which also stops "
                    "the host from queueing the next step" if sync_pct else "; the device waits while Python runs")
                 + (f"; the longest wait is {wait_name} ({wait_ms:.4g} ms in all)" if wait_name else "")),
        facts.base + ([evidence("get_step_trace", "host_sync_percent", sync_pct)] if sync_pct else [])
        + ([evidence("get_step_trace", "syncs_per_step_mean", syncs)] if syncs else [])
        + ([evidence("get_step_trace", "fetch_idle_percent", fetch_idle,
                     "the device's idle share of the step, which a per-step fetch serialises")] if fetches else [])
        + ([evidence("get_step_trace", "largest_sync_event", wait_name, f"{wait_ms} ms in all")] if wait_name else [])
        + ([evidence("get_step_trace", "callbacks_per_step_mean", callbacks)] if callbacks else [])
        + ([evidence("get_hlo_op_profile", "category_percent.host_callback", callback_share)]
           if callback_share else []),
        saving(facts.step_ms, score, facts.step.get("device_idle_percent")),
        sentence(advice.sync_fix(facts.context(), wait_name, bool(callbacks or callback_share))),
        follow_up=("aggregate_xplane_events",
                   {"pattern": r"np\.asarray|device_get|Await|ToLiteral|callback|__array__|item|block_until_ready"}),
        extra_evidence=events_evidence,
    )


@rule("warm_up")
def warm_up(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Warm-up: the first call of a jitted function takes far longer than its later ones (or a GPU runtime call far
    longer than its call's median: module loading, context creation)."""
    step = facts.step
    warm_up_share = facts.breakdown.get("warm_up", 0.0)
    if not (warm_up_share >= 5 and step.get("first_call_ms")):
        return None
    first_ms, later_ms = step["first_call_ms"], step.get("later_call_ms_median")
    runtime = step.get("warm_up_is_a_runtime_call")
    slow = step.get("slow_runtime_calls", 0)
    happening = (
        f"{slow} GPU runtime call{'s take' if slow != 1 else ' takes'} far longer than {'their' if slow != 1 else 'its'} "
        f"call's median ({', '.join(step.get('slow_runtime_call_examples') or [])}): one-time work (loading a kernel's module on first use, creating the context, a stream or a "
        f"library handle, growing the allocator), not per-call overhead, {warm_up_share}% of step time."
        if runtime else
        f"The first call of {step.get('warm_up_function')} takes {first_ms:.4g} ms against {later_ms:.3g} ms for "
        f"the later calls (median): a one-time cost (compilation cache lookup, buffer allocation, autotuning, "
        f"loading the program) that falls inside the measured steps, {warm_up_share}% of step time.")
    return Hypothesis(
        "warm_up", warm_up_share,
        "One-time GPU runtime calls (initialisation, module loading) far longer than the others" if runtime
        else "The first call is a warm-up far longer than the later calls",
        happening,
        facts.base + [evidence("get_step_trace", "warm_up_percent", warm_up_share),
                      evidence("get_step_trace", "first_call_ms", first_ms, str(step.get("warm_up_function"))),
                      evidence("get_step_trace", "later_call_ms_median", later_ms)],
        saving(facts.step_ms, warm_up_share) + "; paid once per process, so it matters for short jobs and for timing",
        sentence(advice.warm_up_fix(facts.context())),
    )


@rule("input_bound")
def input_bound(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Input pipeline / host-bound: the step's time is host work the device waits for."""
    host_other = facts.breakdown.get("host_other", 0.0)
    if not (host_other >= HOST_BOUND_MIN_PERCENT and not facts.small_work):
        return None
    return Hypothesis(
        "input_bound", host_other,
        "Host-bound step: the device waits for host work outside the compiled step",
        f"{host_other}% of each step ({(facts.step_ms or 0) * host_other / 100:.3g} ms) has no device op, "
        "compilation, transfer or dispatch running: the host is busy in Python or input processing "
        "(data loading, preprocessing, batching) while the device idles.",
        facts.base + [evidence("get_step_trace", "host_other_percent", host_other),
                      evidence("get_step_trace", "device_idle_percent", facts.step.get("device_idle_percent"))],
        saving(facts.step_ms, host_other, facts.step.get("device_idle_percent")),
        advice.feed_input(facts.context()),
        follow_up=("aggregate_xplane_events", {"pattern": ".", "line": "python"}),
        extra_evidence=events_evidence,
    )


@rule("device_idle")
def device_idle(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Nothing before explains an idle device: say so with the numbers, rather than stay silent."""
    b, compute = facts.breakdown, facts.compute
    host_other = b.get("host_other", 0.0)
    idle = round(100 - compute - b.get("collective", 0.0) - b.get("transfer", 0.0), 2)
    if not (compute < 80 and idle >= 10 and not any(h.score >= 15 for h in found)):
        return None
    util = facts.summary("get_utilization_viewer")
    devices = facts.detail("get_utilization_viewer").get("devices", [])
    return Hypothesis(
        "device_idle", idle,
        f"Devices idle for {idle}% of the step with no single host-side cause in the trace",
        f"The devices compute {compute}% of the step; the host is busy outside the compiled step "
        f"{host_other}% of it, and no compile, sync or dispatch explains the rest."
        + (f" Device busy time ranges from {util.get('busy_percent_min')}% ({util.get('least_busy_device')}) "
           f"to {util.get('busy_percent_max')}% across {util.get('devices')} devices." if devices else ""),
        facts.base + [evidence("get_step_trace", "device_idle_percent", facts.step.get("device_idle_percent")),
                      evidence("get_step_trace", "host_other_percent", host_other)]
        + ([evidence("get_utilization_viewer", "busy_percent_min", util.get("busy_percent_min"),
                     util.get("least_busy_device", "")),
            evidence("get_utilization_viewer", "busy_percent_max", util.get("busy_percent_max"))] if devices else []),
        saving(facts.step_ms, idle),
        "Find what the devices wait for: capture again with host_tracer_level=2 and python_tracer_level=1 to "
        "see host activity; balance work across devices if some are much less busy; check the input "
        "pipeline and inter-device dependencies.",
    )


HOST_TIME_FINDINGS = ("low_utilization", "dispatch_overhead", "host_sync", "input_bound", "device_idle",
                      "python_loop_of_calls", "eager_ops", "callback_in_step", "boolean_mask_in_loop",
                      "eager_loop_reads_each_trip")
"""Findings whose time is the host's: what the profiler's host tracers add to the traced program lands in them."""
TRACED_CALLS_PER_MS_MIN = 20.0
"""Python function events per millisecond of step (one every 50 µs) from which the Python tracer's own cost, paid on
every call it records, may be a visible part of the host's time."""


def with_profiler_caveat(facts: Facts, found: list[Hypothesis]) -> None:
    """Where the capture recorded Python calls densely, the host-time findings say the profiler may have caused part
    of what they measure, and how to capture without it (jax.profiler.ProfileOptions, checked against jax 0.10)."""
    traced = facts.summary("get_step_trace").get("python_tracer_events_per_step")
    step_ms = facts.step_ms
    if not traced or not step_ms or traced / step_ms < TRACED_CALLS_PER_MS_MIN:
        return
    for h in found:
        if h.key not in HOST_TIME_FINDINGS:
            continue
        h.whats_happening += (
            f" The capture recorded {traced:,.0f} Python function calls per step ({traced / step_ms:,.0f} per ms: "
            "the Python tracer was on): the profiler pays for each call it records on the host, so part of this "
            "host time may be the profiler's own.")
        h.fix += (" Measure it untraced first: capture again with the Python tracer off, options = "
                  "jax.profiler.ProfileOptions(); options.python_tracer_level = 0; options.host_tracer_level = 1; "
                  "jax.profiler.trace(log_dir, profiler_options=options).")
        h.evidence.append(evidence("get_step_trace", "python_tracer_events_per_step", traced,
                                   "Python function calls the profiler recorded per step"))
