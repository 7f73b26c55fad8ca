"""The top of the page: the plain-language summary, the key metrics and the banner's count.

The summary is written here from the analysis' own structured record (status, health, findings), the same way
for every investigator: the verdict, the biggest cost with its number, what to do first, the expected gain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xdiag.model import Analysis, Finding, ToolResult, ToolStatus
from xdiag.report.format import (
    Cell,
    above_sixteen_bit_note,
    Limits,
    cell,
    format_measure,
    humanize_numbers,
    measured_cell,
    out_of_range,
    short_kernel_name,
    source_text,
    tone_of,
)

PRIORITIES = ("P0", "P1", "P2")
MAX_NOTE_CHARS = 110  # a metric card's reason line; the whole reason is in its title and in the detail sections


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 finding', '3 findings': never 'finding(s)'."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def priority_counts(findings: Sequence[Finding]) -> str:
    """'2 findings (1 P0, 1 P1)'."""
    parts = [f"{sum(1 for f in findings if f.priority == p)} {p}" for p in PRIORITIES if any(f.priority == p for f in findings)]
    return counted(len(findings), "finding") + (f" ({', '.join(parts)})" if parts else "")


def _first_sentence(text: str) -> str:
    """The first sentence of `text` (up to '. ' or ';' outside parentheses, so none is left open), ending with a
    full stop, its numbers in human units."""
    text = humanize_numbers(" ".join((text or "").split()))
    end = next((m.start() for m in re.finditer(r"(?<=[a-z0-9)%])(\.|;)\s", text)
                if text.count("(", 0, m.start()) <= text.count(")", 0, m.start())), None)
    sentence = text[:end] if end is not None else text.rstrip(".")
    return sentence + "." if sentence else ""


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _device_phrase(health: Mapping[str, Any], analysis: Analysis) -> str:
    profile = analysis.profile or {}
    platform = health.get("platform") or profile.get("platform")
    hosts = profile.get("hosts")
    n_hosts = len(hosts) if isinstance(hosts, list) else None
    bits = [f"{n_hosts}-host"] if n_hosts and n_hosts > 1 else []
    return " ".join(bits + ([platform] if platform else []))


def summary_sentences(analysis: Analysis, status: str, findings: Sequence[Finding]) -> list[str]:
    """3–5 sentences a reader can stop after: verdict, biggest cost with its number, what to do first, the gain."""
    health = analysis.health or {}
    if status == "FAILED":
        return [f"The analysis failed: {analysis.failure_reason or 'no reason was recorded'}.",
                "No diagnosis was made; the raw profile is kept where it was uploaded."]
    step_ms = health.get("step_time_ms")
    compute = (health.get("breakdown_percent") or {}).get("compute")
    where = _device_phrase(health, analysis)
    steps = health.get("steps")
    step_text = (f"{counted(steps, 'step')} of {format_measure(step_ms, 'ms')} on average" if steps and step_ms
                 else (f"steps of {format_measure(step_ms, 'ms')}" if step_ms else "the capture window"))
    compute_text = f"; the devices compute {format_measure(compute, '%')} of that time" if compute is not None else ""
    if status == "OPTIMAL":
        out = [f"Optimal: no bottleneck needs attention in this {where + ' ' if where else ''}profile.",
               f"It covers {step_text}{compute_text}."]
        top, share = health.get("top_op"), health.get("top_op_share_percent")
        if top and share is not None:
            line = source_text(health.get("top_op_source") or {})
            out.append(f"The busiest op is {short_kernel_name(top)} ({format_measure(share, '%')} of op time)"
                       + (f", from {line}." if line else "."))
        efficiency, bound = health.get("roofline_efficiency_percent"), health.get("bound_by")
        if efficiency is not None and bound:
            roof = "compute" if "compute" in str(bound).lower() else "bandwidth"
            at_most = "at most " if health.get("dominant_ops_efficiency_is_upper_bound") else ""
            out.append(f"While they run, the ops reach {at_most}{format_measure(efficiency, '%')} of their {roof} roof, "
                       "each against the peak of its own precision.")
        return out
    if status != "NEEDS_ATTENTION":
        return [f"The analysis is not finished yet (pipeline status {analysis.status}); the sections below show "
                "what the tools have reported so far."]
    if not findings:
        return [f"Needs attention, but no finding was reported: the profile covers {step_text}{compute_text}.",
                "See the key metrics and the sections below."]
    top = findings[0]
    out = [f"Needs attention: {priority_counts(findings)} in this {where + ' ' if where else ''}profile, "
           f"which covers {step_text}{compute_text}."]
    happening = _first_sentence(top.whats_happening)
    out.append(f"The biggest cost ({top.priority}): {_lower_first(humanize_numbers(top.title).rstrip('.'))}"
               + (f" — {_lower_first(happening)}" if happening else "."))
    fix = re.sub(r"^First,\s+", "", _first_sentence(top.fix))  # a lever's fix opens with "First,"
    if fix:
        out.append(f"Do first: {_lower_first(fix)}")
    impact = _first_sentence(top.expected_impact)
    if impact:
        out.append(f"Expected gain: {_lower_first(impact)}")
    if len(findings) > 1:
        others = ", ".join(_lower_first(f.title.rstrip(".")) for f in findings[1:3])
        more = f" and {counted(len(findings) - 3, 'more')}" if len(findings) > 3 else ""
        out.append(f"Also: {others}{more}.")
    return out[:5]


@dataclass(frozen=True)
class Metric:
    label: str
    path: tuple[str, ...]  # keys into analysis.health
    unit: str  # the unit of the health value: 'ms', '%', 'GiB', 'GFLOP/s' or '' (text)
    tool: str  # the tool the number comes from (health.py copies it from that tool's summary)
    hint: str = ""
    key: bool = False  # one of the four key metrics shown first and larger


METRICS = (
    Metric("Step time", ("step_time_ms",), "ms", "get_step_trace", key=True),
    Metric("Device compute", ("breakdown_percent", "compute"), "%", "get_step_trace", "of step time", key=True),
    Metric("Memory headroom", ("memory_headroom_percent",), "%", "get_memory_profile", "of capacity free at peak",
           key=True),
    Metric("Roofline efficiency", ("roofline_efficiency_percent",), "%", "get_roofline_model",
           "of the roof at the ops' intensity", key=True),
    # Idle and busy are one fact: the card says what the busy rest is made of (transfers are busy, not compute).
    Metric("Device idle", ("device_idle_percent",), "%", "get_step_trace", "of step time"),
    Metric("Achieved compute", ("achieved_gflops_per_s",), "GFLOP/s", "get_kpi_metrics", "while ops run"),
    Metric("Peak memory", ("peak_memory_gib",), "GiB", "get_memory_profile"),
    Metric("OOM risk", ("oom_risk",), "", "get_memory_profile"),
    Metric("Top op", ("top_op",), "", "get_hlo_op_profile"),
    Metric("Low-intensity op time", ("low_intensity_op_percent",), "%", "get_hlo_op_profile",
           "of op time in ops under 1 FLOP/byte"),
    Metric("Layout copies", ("compiler", "layout_copies_percent"), "%", "detect_layout_mismatch_copies", "of op time"),
    Metric("Unfused data movement", ("compiler", "unfused_data_movement_percent"), "%", "detect_unfused_reshapes",
           "of op time"),
    Metric("Widening converts", ("compiler", "widening_converts_percent"), "%", "detect_unnecessary_convert_reduce",
           "of op time"),
)
_UNIT_KEYS = {"ms": "x_ms", "%": "x_percent", "GiB": "x_gib", "GFLOP/s": "x_gflops_per_s"}


@dataclass
class MetricCard:
    label: str
    value: Cell
    tool: str
    note: str = ""
    missing: bool = False
    tone: str = ""
    note_full: str = ""  # the whole note when `note` was cut short
    key: bool = False


def why_missing(results: Mapping[str, ToolResult], tool: str) -> str:
    """The reason a value from `tool` is missing, in the tool's own words where it gave them."""
    r = results.get(tool)
    if r is None:
        return f"{tool} was not run"
    if r.status == ToolStatus.NOT_AVAILABLE:
        return f"{tool}: {r.reason or 'not available'}"
    if r.status == ToolStatus.FAILED:
        return f"{tool} failed: {r.reason or 'no reason recorded'}"
    # A tool that ran may say itself why a figure is missing (`…_because`, an `unavailable` map).
    said = [str(v) for k, v in r.summary.items() if k.endswith("_because") and v]
    for marker in ("unavailable", "not_available"):
        if isinstance(r.summary.get(marker), Mapping):
            said += [str(v) for v in r.summary[marker].values() if v]
    return f"{tool}: {said[0]}" if said else f"{tool} did not report it"


def lookup(data: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _short(text: str) -> tuple[str, str]:
    text = humanize_numbers(text)
    return (text, "") if len(text) <= MAX_NOTE_CHARS else (text[: MAX_NOTE_CHARS - 1] + "…", text)


def metric_cards(health: Mapping[str, Any], results: Mapping[str, ToolResult], limits: Limits) -> list[MetricCard]:
    cards = []
    for m in METRICS:
        value = lookup(health, m.path)
        if value is None:
            why = why_missing(results, m.tool).removeprefix(f"{m.tool}: ")
            short, full = _short(why)
            cards.append(MetricCard(m.label, Cell(text="not available", missing=True), m.tool, note=short,
                                    note_full=full, missing=True, key=m.key))
            continue
        note = m.hint
        if m.path == ("step_time_ms",):
            steps, source = health.get("steps"), health.get("step_source")
            note = (f"mean over {counted(steps, 'step')}" if isinstance(steps, int) else "mean") + (
                f" ({source})" if source else "")
            if health.get("step_time_cv_percent") is not None:
                note += f"; spread (CV) {format_measure(health['step_time_cv_percent'], '%')}"
                if health.get("step_time_spread_because"):
                    note += f": {health['step_time_spread_because']}"
        elif m.path == ("peak_memory_gib",):
            # The peak came from the tool, so a missing capacity is the profile's gap, not the tool's.
            capacity = _capacity_text(health)
            note = f"of {capacity}" if capacity else "capacity not recorded"
        elif m.path == ("memory_headroom_percent",) and health.get("memory_capacity_gib") is not None:
            note = f"{format_measure(health.get('peak_memory_gib'), 'GiB')} peak of {_capacity_text(health)}"
        elif m.path == ("device_idle_percent",):
            busy = _busy_text(health)
            note = f"of step time; busy the rest: {busy}" if busy else m.hint
        elif m.path == ("roofline_efficiency_percent",):
            # The roofline is over compute ops only: where the step also moves data or communicates, say how much of
            # it the roofline speaks for (TPU offload: 73% of the roof over 3% of the step).
            compute = (health.get("breakdown_percent") or {}).get("compute")
            scope = (f", over compute ops only ({format_measure(compute, '%')} of step time)"
                     if len(_step_parts(health, device_only=False)) > 1 and isinstance(compute, (int, float)) else "")
            note = m.hint + scope + (f"; bound by {health['bound_by']}" if health.get("bound_by") else "")
            if health.get("dominant_ops_efficiency_is_upper_bound"):
                note = "an upper bound: the busiest kernels' costs assume full pages; " + note
        elif m.path == ("achieved_gflops_per_s",):
            covers = health.get("achieved_rate_covers_op_time_percent")
            precision = above_sixteen_bit_note("achieved_gflops_per_s", value, limits)
            note = (f"{precision}; " if precision else "") + m.hint + (
                f", over the {format_measure(covers, '%')} of compute op time whose FLOPs are known"
                if covers is not None and covers < 100 else "")
            bounded = health.get("achieved_rate_upper_bound_flops_percent")
            if bounded:
                note = (f"an upper bound: {format_measure(bounded, '%')} of these FLOPs assume full pages; " + note)
        elif m.path == ("low_intensity_op_percent",):
            peaks = health.get("peaks") or {}
            if peaks.get("peak_tflops") and peaks.get("peak_hbm_gb_per_s"):  # the CPU's hint where no roof is known
                ridge = peaks["peak_tflops"] * 1e3 / peaks["peak_hbm_gb_per_s"]
                note = f"of op time in ops below the ridge point ({ridge:.4g} FLOP/byte)"
        elif m.path == ("top_op",):
            share, category = health.get("top_op_share_percent"), health.get("top_category")
            note = ", ".join(x for x in (f"{format_measure(share, '%')} of op time" if share is not None else "",
                                         f"top category {category}" if category else "") if x)
        if isinstance(value, str):
            text = cell(short_kernel_name(value), 34)
            tone = tone_of(value) if m.path == ("oom_risk",) else ""
        else:
            text = measured_cell(_UNIT_KEYS.get(m.unit, m.label), value, limits)
            if ((m.path == ("roofline_efficiency_percent",) and health.get("dominant_ops_efficiency_is_upper_bound"))
                    or (m.path == ("achieved_gflops_per_s",) and health.get("achieved_rate_upper_bound_flops_percent"))):
                text = Cell(text="≤ " + text.text, full=text.full, numeric=text.numeric)
            tone = "warn" if text.flagged else ""
            if text.flagged:
                note = text.full or note
        short, full = _short(note)
        cards.append(MetricCard(m.label, text, m.tool, note=short, note_full=full, tone=tone, key=m.key))
    return cards


def _step_parts(health: Mapping[str, Any], device_only: bool) -> list[tuple[str, float]]:
    """The step's compute, collective and transfer shares above zero; `device_only`: transfers less the copies only
    the host's lines show (host_transfer_percent), through which the devices are idle."""
    breakdown = dict(health.get("breakdown_percent") or {})
    if device_only and isinstance(breakdown.get("transfer"), (int, float)):
        breakdown["transfer"] = round(breakdown["transfer"] - (health.get("host_transfer_percent") or 0.0), 2)
    return [(c, breakdown[c]) for c in ("compute", "collective", "transfer")
            if isinstance(breakdown.get(c), (int, float)) and breakdown[c] > 0]


def _busy_text(health: Mapping[str, Any]) -> str:
    """What the devices' busy time is made of, where it is more than compute: 'compute 3% + transfer 97%'; with the
    device idle share it makes the whole step."""
    parts = _step_parts(health, device_only=True)
    return " + ".join(f"{c} {format_measure(v, '%')}" for c, v in parts) if len(parts) > 1 else ""


def _capacity_text(health: Mapping[str, Any]) -> str:
    """'31.2 GiB capacity', or where the allocator may use less than the device has, both named: 'the allocator's
    144 GiB limit (device memory 192 GiB)'; '' where the capacity is not recorded."""
    capacity, limit = health.get("memory_capacity_gib"), health.get("allocator_limit_gib")
    if capacity is None:
        return ""
    if limit is not None:
        return f"the allocator's {format_measure(limit, 'GiB')} limit (device memory {format_measure(capacity, 'GiB')})"
    return f"{format_measure(capacity, 'GiB')} capacity"


def breakdown_rest(breakdown: Mapping[str, Any]) -> float:
    """The share of step time no category covers (the bar's unlabelled remainder), in percent."""
    total = sum(v for v in breakdown.values() if isinstance(v, (int, float)))
    return max(0.0, 100.0 - total)


__all__ = ["summary_sentences", "metric_cards", "priority_counts", "counted", "why_missing", "out_of_range"]
