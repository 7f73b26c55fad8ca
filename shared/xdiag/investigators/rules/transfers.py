"""Findings about copies between memory spaces: on the device's op lines (async copies, host offload, memcpy), or
seen only on the host's lines (device_put, reading results back)."""

from __future__ import annotations

from xdiag.investigators import advice
from xdiag.investigators.rules.hypothesis import (Hypothesis, evidence, events_evidence, neighborhood_evidence,
                                                  saving, sentence, shape_note)
from xdiag.investigators.rules.registry import Facts, rule


@rule("memory_transfers")
def memory_transfers(facts: Facts, found: list[Hypothesis]) -> Hypothesis | None:
    """Transfers between memory spaces (async copies, host offload, memcpy) dominating device time; what
    overlap can recover is bounded by the compute there is to overlap with."""
    b, compute, step_ms = facts.breakdown, facts.compute, facts.step_ms
    profile = facts.summary("get_hlo_op_profile")
    categories = profile.get("category_percent") or {}
    transfer_share = round(categories.get("async_copy", 0.0) + categories.get("memcpy", 0.0), 2)
    host_transfer = facts.step.get("host_transfer_percent") or 0.0
    if transfer_share < 30 and host_transfer >= 30:
        return _host_transfer_hypothesis(facts, host_transfer)
    if transfer_share < 30:
        return None
    ops = [o for o in facts.detail("get_hlo_op_profile").get("ops", []) if o.get("category") in ("async_copy", "memcpy")]
    ev = facts.base + [evidence("get_hlo_op_profile", "category_percent.async_copy+memcpy", transfer_share)]
    if ops:
        ev.append(evidence("get_hlo_op_profile", f"top transfer {ops[0]['op']}", ops[0]["total_ms"],
                           f"ms over {ops[0]['count']} runs{shape_note(ops[0])}"))
    copies = profile.get("async_copies") or {}
    link = copies.get("link_gb_per_s")
    if copies:
        ev.append(evidence("get_hlo_op_profile", "async_copies.gb_per_copy", copies.get("gb_per_copy"),
                           f"{copies.get('copies')} copies, {copies.get('span_ms_mean')} ms from copy-start to "
                           "copy-done on average"))
    if link:
        ev.append(evidence("get_hlo_op_profile", "async_copies.link_gb_per_s", link,
                           "bytes over each copy's service time on its link, median"))
    busy = compute + b.get("collective", 0.0) + b.get("transfer", 0.0)
    memory = facts.summary("get_memory_profile")
    impact = (
        f"Overlap cannot hide more than the compute there is: compute is {compute}% of the step "
        f"({facts.compute_ms:.3g} ms), so better overlap recovers at most that; the transfers themselves take "
        f"{b.get('transfer', transfer_share)}% of it"
        + (f" at {link:g} GB/s per copy on the host link, which bounds them" if link else "")
        + ". Only moving fewer bytes (or fewer times) shortens the step by more."
    )
    ctx = facts.context()
    return Hypothesis(
        "memory_transfers", max(b.get("transfer", 0.0), transfer_share * busy / 100),
        "Memory transfers dominate device time",
        f"{transfer_share}% of device op time is copies between memory spaces ("
        + ("async copy-start/copy-done, host offload" if ctx.platform == "TPU" else
           "memcpy between host and device, async copies")
        + ") rather than computation"
        + (f"; the largest is {ops[0]['op']}" + (f" ({ops[0]['shape']})" if ops[0].get("shape") else "") if ops else "")
        + (f". Each copy moves {copies['gb_per_copy']:g} GB and up to {copies.get('copies_in_flight_max')} are in "
           f"flight at once: the copies already overlap each other and the compute, so the limit is the link "
           f"({link:g} GB/s), not a missing overlap" if copies and link else "")
        + (f". Before and around them the host prepares the copies (mapping host buffers for DMA, re-tiling them) "
           f"for {host_transfer}% of the step, with no device op running" if host_transfer >= 5 else "") + ".",
        ev + ([evidence("get_step_trace", "host_transfer_percent", host_transfer,
                        "host<->device copy work seen on the host's lines (DMA buffer mapping, Linearize/Delinearize)")]
              if host_transfer >= 5 else []),
        impact,
        sentence(advice.transfer_fix(ctx, memory.get("peak_memory_gib"),
                                     memory.get("allocator_limit_gib") or memory.get("capacity_gib"))),
        follow_up=("get_hlo_neighborhood", {"op": ops[0]["op"], "module": ops[0]["module"]})
        if ops and ops[0].get("module") else None,
        extra_evidence=neighborhood_evidence,
    )


def _host_transfer_hypothesis(facts: Facts, host_transfer: float) -> Hypothesis:
    """Host<->device copies that the device's op lines do not show (device_put, np.asarray of a result): their
    time is read from the host's lines, and their fix is moving less or overlapping, not removing a wait."""
    b = facts.breakdown
    syncs = facts.step.get("syncs_per_step_mean") or 0
    return Hypothesis(
        "memory_transfers", host_transfer,
        "Host–device transfers dominate the step",
        f"{host_transfer}% of each step copies data between host and device memory (putting arrays on the device, "
        f"reading results back: the host's transfer events and the DMAs they issue), while the device computes "
        f"{b.get('compute', 0.0)}% of it"
        + (f"; the host blocks on {syncs:g} reads per step until their copies finish" if syncs else "") + ".",
        facts.base + [evidence("get_step_trace", "host_transfer_percent", host_transfer,
                               "host<->device copies seen on the host's lines (device_put, Linearize/Delinearize, DMAs)"),
                      evidence("get_step_trace", "transfer_percent", b.get("transfer"))]
        + ([evidence("get_step_trace", "syncs_per_step_mean", syncs)] if syncs else []),
        saving(facts.step_ms, host_transfer),
        sentence(advice.host_transfer_fix(facts.context())),
        follow_up=("aggregate_xplane_events",
                   {"pattern": r"device_put|DevicePut|Linearize|TransferToDevice|TransferFromDevice"}),
        extra_evidence=events_evidence,
    )
