"""The health snapshot: the broad tools' numbers gathered into one typed record, and the OPTIMAL test.

Every value here is copied from a tool summary (the `sources` map says which), so a
finding that quotes the snapshot quotes a tool. `HealthSnapshot.as_dict()` is its JSON form (analysis.json, the
Gemini prompt): the field order is the key order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from xdiag.analysis.breakdown import CATEGORIES
from xdiag.analysis.roofline import MEMORY_BOUND_FINDING_MIN_PERCENT, memory_bound_rows
from xdiag.idioms import IDIOMS, Match
from xdiag.idioms.memory_numerics import recompute_not_needed
from xdiag.investigators.advice import context
from xdiag.model import ToolResult
from xdiag.profile.trace_json import XPROF_CHROME

HEALTHY = {
    "compute_percent_min": 80.0,
    "device_busy_percent_min": 50.0,
    "collective_percent_max": 10.0,
    "compile_percent_max": 2.0,
    "host_sync_percent_max": 5.0,
    "compiler_issue_percent_max": 10.0,
    "low_intensity_percent_max": MEMORY_BOUND_FINDING_MIN_PERCENT,
    "data_movement_percent_max": 50.0,
}
"""The OPTIMAL short-cut: all of these hold, the out-of-memory risk is LOW (or unknown), and the ops that dominate
op time have a measured efficiency (efficiency_not_measured)."""
OOM_RISKS_ABOVE_LOW = ("MEDIUM", "HIGH")
UNNEEDED_WORK_RATIO_MAX = 4.0
"""Work done over work the result needs (an idiom's work_ratio) above which a session is never OPTIMAL."""
UNNEEDED_WORK_MIN_PERCENT = 2.0
"""The share of the step such work must hold to count."""
IDIOM_MIN_PERCENT = 10.0
"""The share of the step any idiom's match must hold to rule OPTIMAL out (its change is a finding); a match whose
change is withheld where the program runs ("Not advised here") offers nothing to change and rules nothing out."""
MEMORY_BOUND_KIND_WORDS = {"at_bandwidth_roof": "near the HBM bandwidth roof",
                           "below_bandwidth_roof": "far below the HBM bandwidth roof"}
"""get_hlo_op_profile's memory_bound_kind in the words a reader reads."""
"""get_memory_profile's risks that rule OPTIMAL out: a step near the memory limit fails when its inputs grow."""


def _summary(results: dict[str, ToolResult], tool: str) -> dict[str, Any]:
    result = results.get(tool)
    return result.summary if result is not None and result.ok else {}


@dataclass
class _Record:
    """A part of the snapshot whose JSON form is its fields in order; where `omit_none`, fields without a value are
    left out of it (the tool did not report them)."""

    omit_none: ClassVar[bool] = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, _Record):
                value = value.as_dict()
            if value is None and self.omit_none:
                continue
            out[f.name] = value
        return out

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> Self:
        """The record of a tool summary's keys of the same names (None where the summary lacks one)."""
        return cls(**{f.name: summary.get(f.name) for f in fields(cls)})


@dataclass
class DeviceBusy(_Record):
    """How busy each device is over the steps (get_step_trace)."""

    omit_none: ClassVar[bool] = True
    active_devices: int | None = None
    device_busy_percent_min: float | None = None
    least_busy_device: str | None = None
    device_busy_percent_max: float | None = None
    most_busy_device: str | None = None
    transfer_only_devices: list[str] | None = None
    window_busy_percent: float | None = None
    largest_idle_gap_ms: float | None = None
    largest_idle_gap_where: str | None = None


@dataclass
class Straggler(_Record):
    """The participant the others wait for at the collectives (get_hosts), or why that cannot be told."""

    omit_none: ClassVar[bool] = True
    straggler: str | None = None
    participant_level: str | None = None
    straggler_caused_wait_ms_per_step: float | None = None
    straggler_cause: str | None = None
    arrival_skew_ms_mean: float | None = None
    not_available: str | None = None


@dataclass
class LoopWork(_Record):
    """The busiest ops' per-run time, efficiency and share, and how often their loop runs (get_hlo_op_profile)."""

    busiest_ops_mean_us: float | None = None
    busiest_ops_efficiency_percent: float | None = None
    busiest_ops_share_percent: float | None = None
    loop_trips_per_run: float | None = None


@dataclass
class Peaks(_Record):
    """The device's peaks the roofline is drawn against, and where they come from (get_hlo_op_profile)."""

    omit_none: ClassVar[bool] = True
    device_model: str | None = None
    peak_tflops: float | None = None
    peak_hbm_gb_per_s: float | None = None
    flops_source: str | None = None
    bandwidth_source: str | None = None
    peak_warnings: list[str] | None = None


@dataclass
class CompilerShares(_Record):
    """Share of op time (percent) in each compiler inefficiency the HLO checks find."""

    layout_copies_percent: float | None = None
    unfused_data_movement_percent: float | None = None
    widening_converts_percent: float | None = None


@dataclass
class PerStep(_Record):
    """What one step does on average: ops, dispatches, compiles, host waits and callbacks (get_step_trace)."""

    ops_per_step_mean: float | None = None
    dispatches_per_step_mean: float | None = None
    compiles_per_step_mean: float | None = None
    steps_with_compiles: int | None = None
    syncs_per_step_mean: float | None = None
    callbacks_per_step_mean: float | None = None


SOURCES = {
    "steps, step_time_spread_because, breakdown, per_step, devices": "get_step_trace",
    "straggler": "get_hosts",
    "utilization_percent": "get_utilization_viewer",
    "memory": "get_memory_profile",
    "roofline_efficiency_percent": "get_roofline_model",
    "top_op, top_op_source, low_intensity_op_percent, memory_*, dominant_ops_*, loop_work, peaks": "get_hlo_op_profile",
    "dma_stall_percent": "get_roofline_model",
    "compiler": "detect_layout_mismatch_copies, detect_unfused_reshapes, detect_unnecessary_convert_reduce",
}
"""Which tool each part of the snapshot is copied from."""


@dataclass
class HealthSnapshot(_Record):
    """The broad tools' numbers the OPTIMAL test and the rules read, each None where its tool did not report it."""

    platform: str | None
    read_from: str | None
    steps: int | None
    step_source: str | None
    step_time_ms: float | None
    step_time_cv_percent: float | None
    breakdown_percent: dict[str, float]  # step-time category -> percent of the step (analysis.breakdown.CATEGORIES)
    device_idle_percent: float | None
    devices: DeviceBusy
    straggler: Straggler
    utilization_percent: float | None
    achieved_gflops_per_s: float | None
    achieved_rate_covers_op_time_percent: float | None
    achieved_rate_upper_bound_flops_percent: float | None  # the rate's FLOPs counted from upper-bound costs
    roofline_unavailable_because: str | None
    # xdiag's roofline over device op time (None where too little of it is costed); XProf's divides by a
    # window that includes device idle, so it is kept apart.
    roofline_efficiency_percent: float | None
    bound_by: str | None
    xprof_roofline_efficiency_percent: float | None
    peak_memory_gib: float | None
    memory_capacity_gib: float | None
    allocator_limit_gib: float | None
    memory_headroom_percent: float | None
    oom_risk: str | None
    top_op: str | None
    top_op_share_percent: float | None
    top_op_source: dict | None  # the user's line of the busiest op (and the library's), where the profile names it
    top_category: str | None
    low_intensity_op_percent: float | None
    memory_bound_is_defect: bool | None
    memory_passes: float | None
    memory_bandwidth_efficiency_percent: float | None
    memory_bound_kind: str | None
    memory_wait_percent: float | None
    dominant_ops_roofline_efficiency_percent: float | None
    dominant_ops_share_percent: float | None
    dominant_ops_measured_share_percent: float | None
    dominant_ops_unmeasured: list[str]
    dma_stall_percent: float | None
    loop_work: LoopWork
    peaks: Peaks | None
    data_movement_op_percent: float | None
    host_callback_op_percent: float | None
    compiler: CompilerShares
    per_step: PerStep
    sources: dict[str, str] = field(default_factory=lambda: dict(SOURCES))
    unhealthy_because: list[str] = field(default_factory=list)
    healthy: bool = False
    # The dominant ops' efficiency comes from costs that are upper bounds (a paged kernel's full pages): at most.
    dominant_ops_efficiency_is_upper_bound: bool = False
    rematerialised_op_percent: float | None = None  # op time in ops jax.checkpoint recomputes
    rematerialised_saveable_dot_gib: float | None = None  # what a dots-saving policy would keep instead
    step_time_spread_because: str | None = None  # why the steps' times spread, where they say (async dispatch)
    materialised_attention_percent: float | None = None  # op time in attention that writes its S×S scores to memory
    host_transfer_percent: float | None = None  # of the transfer share, the copies only the host's lines show: idle
    unneeded_work: list[dict[str, Any]] = field(default_factory=list)  # idiom matches that rule OPTIMAL out: work
    # the result does not need, or any idiom holding IDIOM_MIN_PERCENT: idiom, stake_percent, work_ratio, what

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HealthSnapshot:
        """The snapshot back from its JSON form (an analysis' `health`)."""
        nested = {"devices": DeviceBusy, "straggler": Straggler, "loop_work": LoopWork, "peaks": Peaks,
                  "compiler": CompilerShares, "per_step": PerStep}
        values = {f.name: data.get(f.name) for f in fields(cls) if f.name in data}
        for name, record in nested.items():
            if values.get(name) is not None:
                values[name] = record(**values[name])
        return cls(**values)


MATERIALISED_ATTENTION_MIN_PERCENT = 15.0
"""Share of op time attention that writes its S×S scores to memory may hold in a healthy program (a fused kernel
would not move those bytes at all)."""
DOMINANT_EFFICIENCY_MIN_PERCENT = 30.0
"""The ops that take most of the time must reach this share of their roof for a busy device to be healthy."""
LATENCY_BOUND = {"loop_trips_per_run_min": 64, "op_us_max": 5.0, "efficiency_percent_max": 30.0}
"""Latency-bound: the busiest ops run thousands of times per loop (dependent steps), each a few microseconds
or less, far below their roof: per-op latency, not bandwidth or arithmetic, sets the time."""
DMA_STALL_MAX_PERCENT = 20.0
"""Share of the dominant ops' time spent waiting on their input copies (XProf's per-op DMA stall, TPU)."""


def low_intensity_share(results: dict[str, ToolResult]) -> tuple[float | None, list[dict]]:
    """Share of op time (percent) in memory-bound ops that do arithmetic, and those (listed) ops."""
    profile = results.get("get_hlo_op_profile")
    if profile is None or not profile.ok or profile.summary.get("memory_bound_op_percent") is None:
        return None, []
    return profile.summary["memory_bound_op_percent"], memory_bound_rows(profile.detail.get("ops", []))


def health_snapshot(results: dict[str, ToolResult]) -> HealthSnapshot:
    step = _summary(results, "get_step_trace")
    overview = _summary(results, "get_xprof_overview")
    kpi = _summary(results, "get_kpi_metrics")
    memory = _summary(results, "get_memory_profile")
    util = _summary(results, "get_utilization_viewer")
    hosts = _summary(results, "get_hosts")
    roofline = _summary(results, "get_roofline_model")
    ops = _summary(results, "get_hlo_op_profile")
    categories = ops.get("category_percent") or {}
    moving = sum(categories.get(c, 0.0) for c in ("async_copy", "memcpy", "data_movement"))
    unseen = hosts.get("not_available")
    peaks = Peaks.from_summary(ops)
    snapshot = HealthSnapshot(
        platform=overview.get("platform"),
        read_from=_summary(results, "get_device_information").get("read_from"),
        steps=step.get("steps"),
        step_source=step.get("step_source"),
        step_time_ms=step.get("step_time_ms_mean"),
        step_time_cv_percent=step.get("step_time_cv_percent"),
        step_time_spread_because=step.get("step_time_spread_because"),
        breakdown_percent={
            category: step.get(f"{category}_percent")
            for category in CATEGORIES
            if step.get(f"{category}_percent") is not None
        },
        device_idle_percent=step.get("device_idle_percent"),
        host_transfer_percent=step.get("host_transfer_percent"),
        devices=DeviceBusy.from_summary(step),
        straggler=Straggler(
            straggler=hosts.get("straggler"), participant_level=hosts.get("participant_level"),
            straggler_caused_wait_ms_per_step=hosts.get("straggler_caused_wait_ms_per_step"),
            straggler_cause=hosts.get("straggler_cause"), arrival_skew_ms_mean=hosts.get("arrival_skew_ms_mean"),
            not_available=(unseen.get("straggler") or None) if isinstance(unseen, dict) else None),
        utilization_percent=util.get("busy_percent_mean"),
        achieved_gflops_per_s=kpi.get("achieved_gflops_per_s_during_ops"),
        achieved_rate_covers_op_time_percent=kpi.get("achieved_rate_covers_op_time_percent"),
        achieved_rate_upper_bound_flops_percent=kpi.get("achieved_rate_upper_bound_flops_percent"),
        roofline_unavailable_because=roofline.get("roofline_unavailable_because"),
        roofline_efficiency_percent=roofline.get("op_time_roofline_efficiency_percent"),
        bound_by=roofline.get("op_time_bound_by"),
        xprof_roofline_efficiency_percent=roofline.get("roofline_efficiency_percent"),
        peak_memory_gib=memory.get("peak_memory_gib"),
        memory_capacity_gib=memory.get("capacity_gib"),
        allocator_limit_gib=memory.get("allocator_limit_gib"),
        memory_headroom_percent=memory.get("headroom_percent"),
        oom_risk=memory.get("oom_risk"),
        top_op=ops.get("top_op"),
        top_op_share_percent=ops.get("top_op_share_percent"),
        top_op_source=ops.get("top_op_source"),
        top_category=ops.get("top_category"),
        low_intensity_op_percent=ops.get("memory_bound_op_percent"),
        memory_bound_is_defect=ops.get("memory_bound_defect"),
        memory_passes=ops.get("memory_passes"),
        memory_bandwidth_efficiency_percent=ops.get("memory_bandwidth_efficiency_percent"),
        memory_bound_kind=ops.get("memory_bound_kind"),
        memory_wait_percent=ops.get("memory_wait_percent"),
        dominant_ops_roofline_efficiency_percent=ops.get("dominant_ops_roofline_efficiency_percent"),
        dominant_ops_share_percent=ops.get("dominant_ops_share_percent"),
        dominant_ops_efficiency_is_upper_bound=bool(ops.get("dominant_ops_efficiency_is_upper_bound")),
        rematerialised_op_percent=ops.get("rematerialised_op_percent"),
        rematerialised_saveable_dot_gib=ops.get("rematerialised_saveable_dot_gib"),
        dominant_ops_measured_share_percent=ops.get("dominant_ops_measured_share_percent"),
        dominant_ops_unmeasured=ops.get("dominant_ops_unmeasured") or [],
        dma_stall_percent=roofline.get("dma_stall_percent_of_top_ops"),
        loop_work=LoopWork.from_summary(ops),
        peaks=peaks if peaks.as_dict() else None,
        data_movement_op_percent=round(moving, 2) if categories else None,
        host_callback_op_percent=categories.get("host_callback") if categories else None,
        compiler=CompilerShares(
            layout_copies_percent=_summary(results, "detect_layout_mismatch_copies").get("share_of_op_time_percent"),
            unfused_data_movement_percent=_summary(results, "detect_unfused_reshapes").get("share_of_op_time_percent"),
            widening_converts_percent=_summary(results, "detect_unnecessary_convert_reduce").get("share_of_op_time_percent"),
        ),
        per_step=PerStep.from_summary(step),
        materialised_attention_percent=next(
            (c.get("share_of_op_time_percent") for c in _summary(results, "get_program_anatomy").get("components") or []
             if c.get("component") == "materialised_attention"), None),
        unneeded_work=[{k: m.get(k) for k in ("idiom", "stake_percent", "work_ratio", "what")}
                       for m in _summary(results, "get_program_anatomy").get("idioms") or []
                       if isinstance(m, dict) and ((m.get("work_ratio") or 0) > UNNEEDED_WORK_RATIO_MAX
                                                   and (m.get("stake_percent") or 0) >= UNNEEDED_WORK_MIN_PERCENT
                                                   or (m.get("stake_percent") or 0) >= IDIOM_MIN_PERCENT)
                       and not _withheld(m, results)],
    )
    snapshot.unhealthy_because = _unhealthy_reasons(snapshot)
    snapshot.healthy = not snapshot.unhealthy_because
    return snapshot


def _withheld(record: dict[str, Any], results: dict[str, ToolResult]) -> bool:
    """Whether an idiom match's change is withheld on the program's platform, vendor and framework: the finding
    says why it is not advised, and there is nothing to change."""
    match = Match.from_record(record)
    setting = asdict(context(_summary(results, "get_device_information")))
    return match is not None and bool(IDIOMS[match.idiom].withheld(match, setting))


def _unhealthy_reasons(s: HealthSnapshot) -> list[str]:
    reasons = []
    b = s.breakdown_percent
    if not s.steps or b.get("compute") is None:
        return ["no step or op timing could be measured"]
    if b["compute"] < HEALTHY["compute_percent_min"]:
        reasons.append(f"devices compute {b['compute']}% of step time (< {HEALTHY['compute_percent_min']}%)")
    devices = s.devices
    # One active device is the whole: its busy share is the compute line above, said again another way; so is
    # the least busy of several that are all as busy as the mean (a two-process CPU run: 12.5% each and overall).
    least_busy = devices.device_busy_percent_min
    if ((devices.active_devices or 0) > 1 and (least_busy or 100) < HEALTHY["device_busy_percent_min"]
            and str(least_busy) != str(b["compute"])):
        reasons.append(
            f"device {devices.least_busy_device} is busy only {least_busy}% of its steps"
        )
    straggler = s.straggler
    if straggler.straggler:
        reasons.append(
            f"the others wait {straggler.straggler_caused_wait_ms_per_step} ms per step for straggler "
            f"{straggler.straggler}"
        )
    if (b.get("collective") or 0) > HEALTHY["collective_percent_max"]:
        reasons.append(f"collectives take {b['collective']}% of step time")
    if (b.get("compile") or 0) > HEALTHY["compile_percent_max"]:
        reasons.append(f"compilation takes {b['compile']}% of step time")
    per_step = s.per_step
    # One wait for the step's results at its end is the usual pattern (its latency shows as host_sync time when
    # the devices finish unevenly); several waits per step, or host callbacks, are what the host_sync finding reads.
    waits = (per_step.syncs_per_step_mean or 0) >= 2 or (per_step.callbacks_per_step_mean or 0) >= 1
    if (b.get("host_sync") or 0) > HEALTHY["host_sync_percent_max"] and waits:
        reasons.append(f"host syncs take {b['host_sync']}% of step time")
    callbacks = per_step.callbacks_per_step_mean or 0
    if callbacks >= 1 and max(b.get("host_sync") or 0, s.host_callback_op_percent or 0) >= 1:
        reasons.append(f"the step calls back into Python {callbacks:g} times")
    if s.oom_risk in OOM_RISKS_ABOVE_LOW:
        reasons.append(f"out-of-memory risk is {s.oom_risk}: the peak of {s.peak_memory_gib} GiB leaves "
                       f"{s.memory_headroom_percent}% of the memory free (OPTIMAL needs LOW risk)")
    op_time_shares = [(key.removesuffix("_percent").replace("_", " "), value)
                      for key, value in s.compiler.as_dict().items()
                      if (value or 0) > HEALTHY["compiler_issue_percent_max"]]
    if (s.data_movement_op_percent or 0) > HEALTHY["data_movement_percent_max"]:
        op_time_shares.append(("ops that move data (copies, transfers) instead of computing",
                               s.data_movement_op_percent))
    reasons += _one_line_per_share(op_time_shares)
    memory_bound = (s.low_intensity_op_percent or 0) + (s.memory_wait_percent or 0)
    if memory_bound > HEALTHY["low_intensity_percent_max"] and s.memory_bound_is_defect:
        reasons.append(f"{memory_bound:.4g}% of op time is memory-bound ({MEMORY_BOUND_KIND_WORDS.get(s.memory_bound_kind, 'its share of the bandwidth not measured')}) "
                       "in a way its fix can change")
    efficiency = s.dominant_ops_roofline_efficiency_percent
    if efficiency is not None and efficiency < DOMINANT_EFFICIENCY_MIN_PERCENT:
        reasons.append(f"the ops taking {s.dominant_ops_share_percent}% of op time "
                       f"{'reach at most' if s.dominant_ops_efficiency_is_upper_bound else 'run at'} {efficiency}% of "
                       "their roofline")
    elif efficiency is not None and s.dominant_ops_efficiency_is_upper_bound:
        # A bound never grounds OPTIMAL: the cost model assumes more work than the kernels may do.
        reasons.append(f"the ops taking {s.dominant_ops_share_percent}% of op time are rated from an upper bound of "
                       f"their work (a paged kernel's full pages): they reach at most {efficiency}% of their "
                       "roofline, so they are certainly at least that far from it (how much further is not known)")
    elif efficiency is None and (unmeasured := efficiency_not_measured(s)):
        reasons.append(unmeasured)
    if is_latency_bound(s.loop_work):
        work = s.loop_work
        reasons.append(f"the busiest ops run {work.loop_trips_per_run:g} times per loop, {work.busiest_ops_mean_us} "
                       f"us each, at {work.busiest_ops_efficiency_percent}% of their roofline")
    if (s.materialised_attention_percent or 0) >= MATERIALISED_ATTENTION_MIN_PERCENT and s.platform in ("TPU", "GPU"):
        # Near the bandwidth roof is not healthy when a fused kernel would not move these bytes at all.
        reasons.append(f"attention that writes its S×S scores to memory takes {s.materialised_attention_percent:g}% "
                       "of op time")
    if needless_recompute(s):
        reasons.append(f"{s.rematerialised_op_percent:g}% of op time recomputes values (jax.checkpoint) while the peak "
                       f"uses {s.peak_memory_gib:g} of {memory_limit_gib(s):g} GiB")
    if (s.dma_stall_percent or 0) > DMA_STALL_MAX_PERCENT:
        reasons.append(f"the busiest ops wait on their input copies {s.dma_stall_percent}% of their time")
    for work in s.unneeded_work:
        # Near the roof is not healthy when the result needs a fraction of the work (efficient is not needed), nor
        # where the program does what an expert writes differently.
        reasons.append(f"{work['stake_percent']:g}% of the step does {work['work_ratio']:g}× the work its result "
                       f"needs ({str(work['idiom']).replace('_', ' ')})" if (work.get("work_ratio") or 0)
                       > UNNEEDED_WORK_RATIO_MAX else
                       f"{work['stake_percent']:g}% of the step is in what the program does that an expert writes "
                       f"differently ({str(work['idiom']).replace('_', ' ')})")
    return reasons


FLOPS_COVER_MIN_PERCENT = 50.0
"""On a CPU (no roof: xdiag knows no CPU's peaks) the work is rated when FLOPs are known for this share of op time."""


def efficiency_not_measured(s: HealthSnapshot) -> str | None:
    """Why no efficiency of the work that dominates op time is measured, pointing to what would measure it; None
    where it is measured, or on a CPU whose ops' FLOPs (and so their achieved rate) are known: no profile records a
    CPU's peaks. Whatever else is healthy, such a session is never OPTIMAL: nothing shows the work runs well."""
    if s.dominant_ops_roofline_efficiency_percent is not None:
        return None
    covered = s.achieved_rate_covers_op_time_percent
    if s.platform == "CPU" and (covered or 0) >= FLOPS_COVER_MIN_PERCENT:
        return None
    why = list(s.dominant_ops_unmeasured or [])
    if not why:
        why.append(f"FLOPs are known for {covered or 0:g}% of op time"
                   + (f" ({s.roofline_unavailable_because})" if s.roofline_unavailable_because else ""))
    if s.read_from == XPROF_CHROME:
        why.append("this session was read from XProf's Chrome trace (trace.json), which carries no HLO (no FLOPs or "
                   "bytes) and no device model: analyse the .xplane.pb that jax.profiler writes beside it (the same "
                   "folder, <host>.xplane.pb), which holds the HLO and the device's own lines")
    return ("no efficiency is measured for the work that dominates op time, so OPTIMAL cannot be shown: "
            + "; ".join(why))


def _one_line_per_share(shares: list[tuple[str, float]]) -> list[str]:
    """'<what> take <x>% of op time', one line per figure: checks that find the same ops (a transpose is a layout
    copy, unfused data movement and data movement at once) share a line instead of repeating the number."""
    by_figure: dict[str, list[str]] = {}
    for what, value in shares:
        by_figure.setdefault(f"{value:.3g}", []).append(what)
    lines = []
    for figure, names in by_figure.items():
        named = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        same = " (the same ops, found by each check)" if len(names) > 1 else ""
        lines.append(f"{named} take {figure}% of op time{same}")
    return lines


def memory_limit_gib(s: HealthSnapshot) -> float | None:
    """The memory the peak is measured against: the allocator's limit where lower than the device's memory."""
    return s.allocator_limit_gib or s.memory_capacity_gib


def needless_recompute(s: HealthSnapshot) -> bool:
    """The recomputation the memory does not need (the needless_remat idiom's premise), from the snapshot."""
    return recompute_not_needed(s.rematerialised_op_percent, s.peak_memory_gib, memory_limit_gib(s),
                                s.rematerialised_saveable_dot_gib)


def is_latency_bound(work: LoopWork) -> bool:
    """LATENCY_BOUND holds for get_hlo_op_profile's loop_work numbers."""
    trips, mean_us, efficiency = work.loop_trips_per_run, work.busiest_ops_mean_us, work.busiest_ops_efficiency_percent
    return (trips is not None and trips >= LATENCY_BOUND["loop_trips_per_run_min"] and mean_us is not None
            and mean_us <= LATENCY_BOUND["op_us_max"]
            and (efficiency is None or efficiency < LATENCY_BOUND["efficiency_percent_max"]))
