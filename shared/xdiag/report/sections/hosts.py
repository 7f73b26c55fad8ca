"""The hosts-and-devices section: one row per host side by side, their spread where there are many, one step on
every host on one aligned axis where a straggler is named, then the per-device spread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xdiag.model import ToolResult
from xdiag.report import charts
from xdiag.report.format import Block, Limits, format_measure
from xdiag.report.sections.parts import TABLE_ROWS_SHOWN, Section, kv_blocks, part_for, table_block


HOST_COLUMNS = ("host", "rank", "steps", "step_time_ms_mean", "compute_percent", "collective_percent",
                "host_other_percent",
                "host_other_ms_per_step", "collective_wait_ms_per_step", "last_arrivals", "last_arrival_share_percent",
                "caused_wait_ms_per_step")
DEVICE_COLUMNS = ("device", "steps", "step_ms_mean", "compute_percent", "collective_percent", "transfer_percent",
                  "idle_percent", "busy_percent")


def _breakdown_of(row: Mapping[str, Any]) -> dict[str, float]:
    """A participant's step-time breakdown: its `breakdown_percent`, or its `<category>_percent` fields."""
    given = row.get("breakdown_percent")
    if isinstance(given, Mapping):
        return {str(k): v for k, v in given.items() if isinstance(v, (int, float))}
    return {c: row[f"{c}_percent"] for c in charts.STEP_CATEGORY_COLORS
            if isinstance(row.get(f"{c}_percent"), (int, float))}


def _aligned_picture(instances: Any) -> dict | None:
    """One collective instance as the aligned picture: the typical one (its arrival skew nearest the mean), each
    participant in the collective from its arrival to the common end (time 0), the window from the first arrival."""
    rows = [i for i in instances or [] if isinstance(i, Mapping) and isinstance(i.get("arrival_before_end_ms"), Mapping)]
    if not rows:
        return None
    mean = sum(_number(i.get("skew_ms")) for i in rows) / len(rows)
    instance = min(rows, key=lambda i: abs(_number(i.get("skew_ms")) - mean))
    arrivals = {str(k): _number(v) for k, v in instance["arrival_before_end_ms"].items()}
    first = max(arrivals.values())
    return {"step": instance.get("step"), "collective": instance.get("op"), "participants": [
        {"participant": name, "step_start_ms": -first, "step_end_ms": 0.0, "collective_start_ms": -before,
         "collective_end_ms": 0.0} for name, before in arrivals.items()]}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


HOST_BARS_EACH_END = 5
"""Above twice this many hosts, the breakdown bars show this many from each end of the hosts' order."""
_DISTRIBUTED = (("step_time_ms_mean", "step time"), ("collective_wait_ms_per_step", "waiting in collectives per step"),
                ("host_other_ms_per_step", "host/input work per step"))


def _standing_out(host: Mapping[str, Any]) -> tuple[float, float, float]:
    """How much a host stands out among many: how often it arrives last at the collectives, the wait it causes the
    others, then its step time."""
    return (_number(host.get("last_arrival_share_percent")), _number(host.get("caused_wait_ms_per_step")),
            _number(host.get("step_time_ms_mean")))


def _host_distribution(hosts: list[Mapping[str, Any]]) -> list[Block]:
    """Per measure the hosts report, its spread over the hosts: least, quartiles, most, and which hosts are at the
    ends (a table of 64 equal rows says less than this)."""
    rows = []
    for key, label in _DISTRIBUTED:
        values = sorted(((_number(h[key]), str(h.get("host"))) for h in hosts
                         if isinstance(h.get(key), (int, float)) and not isinstance(h.get(key), bool)))
        if len(values) < 2:
            continue
        numbers = [v for v, _ in values]

        def at(q: float) -> float:
            return numbers[min(len(numbers) - 1, round(q * (len(numbers) - 1)))]

        rows.append({"measure": label, "hosts": len(values), "least_ms": numbers[0], "least_host": values[0][1],
                     "p25_ms": at(0.25), "median_ms": at(0.5), "p75_ms": at(0.75), "most_ms": numbers[-1],
                     "most_host": values[-1][1]})
    return table_block(rows, f"Over the {len(hosts)} hosts")


def hosts_section(results: Mapping[str, ToolResult], limits: Limits) -> Section:
    """One row per host, side by side; where a straggler is named, one step on every host on one aligned axis;
    then the per-device spread."""
    section = Section("hosts", "Hosts and devices")
    part, r = part_for(results, "get_hosts")
    section.parts.append(part)
    if r is None:
        return section
    hosts = [h for h in r.detail.get("hosts") or [] if isinstance(h, Mapping)]
    devices = [d for d in r.detail.get("devices") or [] if isinstance(d, Mapping)]
    part.blocks += kv_blocks(r.summary, limits)
    if len(hosts) > 1:
        # A host's own row and its row as a collective participant (arrivals, waits caused) side by side.
        joined = {str(p.get("participant")): p for p in r.detail.get("participants") or [] if isinstance(p, Mapping)}
        hosts = [{**joined.get(str(h.get("host")), {}), **h} for h in hosts]
        many = len(hosts) > TABLE_ROWS_SHOWN
        if many:  # the hosts that stand out first, not the first hosts in file order
            hosts = sorted(hosts, key=_standing_out, reverse=True)
            part.blocks += _host_distribution(hosts)
        part.blocks += table_block([{k: h[k] for k in HOST_COLUMNS if k in h} for h in hosts],
                                   "One row per host" + (", the latest to arrive and the slowest first" if many else ""),
                                   limits, labels={"host_other_percent": "host/input"})
        pictured = hosts if len(hosts) <= 2 * HOST_BARS_EACH_END else hosts[:HOST_BARS_EACH_END] + hosts[-HOST_BARS_EACH_END:]
        bars = []
        for h in pictured:
            breakdown = _breakdown_of(h)
            if breakdown:
                svg, _ = charts.breakdown_bar(breakdown, None, height=18.0, labels=False)
                bars.append((str(h.get("host")), svg))
        if bars:
            shown = {c for h in pictured for c, v in _breakdown_of(h).items() if v}
            title = ("Step-time breakdown per host" if pictured is hosts else
                     f"Step-time breakdown of the {HOST_BARS_EACH_END} hosts that stand out most and the "
                     f"{HOST_BARS_EACH_END} that stand out least, of {len(hosts)}")
            part.blocks.append(Block(kind="bars", title=title, bars=bars, legend=[
                (c, charts.color_for(c, i), "") for i, c in enumerate(charts.STEP_CATEGORY_COLORS) if c in shown]))
    else:
        name = hosts[0].get("host") if hosts else None
        rank, world = (hosts[0].get("rank"), hosts[0].get("world_size")) if hosts else (None, None)
        part.blocks.append(Block(kind="text", muted=True, text=(
            f"One rank ({name}: rank {rank} of {world}): the other ranks' traces are not in the session, so there is "
            "nothing to compare it with." if rank is not None and (world or 0) > 1 else
            f"One host{f' ({name})' if name else ''}: nothing to compare across hosts.")))
    timeline = r.detail.get("straggler_timeline") or _aligned_picture(r.detail.get("aligned_instances"))
    straggler = r.summary.get("straggler_host") or r.summary.get("straggler")
    if isinstance(timeline, Mapping) and timeline.get("participants"):
        svg = charts.host_timeline(timeline, duration_text=lambda ms: format_measure(ms, "ms"))
        count = sum(isinstance(p, Mapping) for p in timeline["participants"])
        on = ("every participant" if count <= charts.ALIGNED_ROWS else
              f"{charts.ALIGNED_ROWS} of the {count} participants (the {charts.ALIGNED_ROWS // 2} first and the "
              f"{charts.ALIGNED_ROWS // 2} last to arrive)")
        part.blocks.append(Block(kind="chart", svg=svg, title=(
            f"One step on {on}, aligned on the end of {timeline.get('collective') or 'the collective'}"
            + (f" (step {timeline.get('step')})" if timeline.get("step") is not None else "")
            + (f": {straggler} arrives last" if straggler else "")
            + ". Purple: time in the collective, waiting for the others.")))
    elif straggler:
        part.blocks.append(Block(kind="text", muted=True, text=(
            "The aligned timeline of one step per host is not available: get_hosts reported no collective instance "
            "to align on.")))
    if len(devices) > 1:
        part.blocks += table_block([{k: d[k] for k in DEVICE_COLUMNS if k in d} for d in devices],
                                   f"Per device ({len(devices)})", limits, labels={"step_ms_mean": "step time"})
    return section
