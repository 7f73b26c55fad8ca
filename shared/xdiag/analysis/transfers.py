"""Async copies measured on the link they use (copy-start → copy-done, e.g. TPU host offload)."""

from __future__ import annotations

import numpy as np

from xdiag.analysis.op_table import op_table
from xdiag.analysis.session_cache import cached
from xdiag.cost.hlo import shape_bytes
from xdiag.profile.space import NO_VALUE, Session


def transfer_spans(session: Session) -> dict | None:
    """Async copies (copy-start → copy-done, e.g. TPU host offload) measured on the link they use.

    A copy-done event is only the wait for its copy; where it does wait, its end is the copy's completion.
    Copies in one direction share the link, so each waited copy's service time runs from its copy-start, or
    from the previous completion in the same direction if later, to its completion; the link rate is the
    median of bytes over service time. Direction: a copy of a program parameter brings data to the device
    (prefetch), a copy of a computed value takes it away (offload).

    Returns: copies, gb_per_copy, span_ms_mean (copy-start to copy-done end), link_gb_per_s (median),
    link_rate_samples, copies_in_flight_max, directions {to_device, from_device: copies}; None without pairs. Cached
    (a session assembled from host summaries carries it: xdiag.tools.host_summary)."""
    return cached(session, "transfer_spans", lambda: combined_transfer_spans([transfer_pairs(session)]))


def transfer_pairs(session: Session) -> dict | None:
    """The session's paired copies as transfer_spans measures them, before they are summed up: copies, bytes,
    directions, each copy's span (ms) and each measured link rate (GB/s), most copies in flight on one device; None
    without pairs. Pairs never span devices, so hosts' pairs combine (combined_transfer_spans) into the session's."""
    ops = op_table(session)
    if not len(ops):
        return None
    done_mask = ops.rows_where(lambda key: key[2].startswith("copy-done"))
    if not done_mask.any():
        return None
    pairs: dict[tuple[str, str], list[tuple[int, int, int, float]]] = {}  # (device, direction) -> (start, end, wait, bytes)
    directions = {"to_device": 0, "from_device": 0}
    done_ops = {ops.op_keys[code][:3] for code in np.unique(ops.op[done_mask]).tolist()}
    for module_name, pid, done_name in done_ops:
        module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
        found = module.find(done_name) if module else None
        if not found or not found[1].operands or found[1].operands[0] not in found[0].by_name:
            continue
        computation, done = found
        start_op = computation.by_name[done.operands[0]]
        source = computation.by_name.get(start_op.operands[0]) if start_op.operands else None
        direction = "to_device" if source is not None and source.opcode == "parameter" else "from_device"
        size = shape_bytes(done)
        start_rows = ops.rows_where(lambda key: key[0] == module_name and key[2] == start_op.name)
        done_rows_anywhere = ops.rows_where(lambda key: key[0] == module_name and key[2] == done_name)
        for device in ops.devices():
            on_device = ops.on_device(device)
            starts = np.sort(ops.start_ps[on_device & start_rows])
            done_rows = on_device & done_rows_anywhere
            order = np.argsort(ops.end_ps[done_rows])
            ends, waits = ops.end_ps[done_rows][order], (ops.end_ps[done_rows] - ops.start_ps[done_rows])[order]
            n = min(len(starts), len(ends))
            directions[direction] += n
            pairs.setdefault((str(device), direction), []).extend(
                zip(starts[:n].tolist(), ends[-n:].tolist(), waits[-n:].tolist(), [size] * n))
    copies = sum(len(v) for v in pairs.values())
    if not copies:
        return None
    rates, spans_ms, total_bytes, in_flight = [], [], 0.0, 0
    for items in pairs.values():
        items.sort(key=lambda t: t[1])
        previous = None
        for start, end, wait, size in items:
            spans_ms.append((end - start) / 1e9)
            total_bytes += size
            if wait > 0:  # the wait ended when the copy completed: a measured completion
                service = end - max(start, previous if previous is not None else start)
                if service > 0:
                    rates.append(size / (service / 1e12) / 1e9)
                previous = end
    for device in {d for d, _ in pairs}:
        spans = [(s, e) for (d, _), items in pairs.items() if d == device for s, e, _, _ in items]
        level = 0
        for _, step in sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]):
            level += step
            in_flight = max(in_flight, level)
    return {"copies": copies, "bytes": total_bytes, "spans_ms": spans_ms, "rates": rates, "in_flight": in_flight,
            "directions": directions}


def combined_transfer_spans(parts: list[dict | None]) -> dict | None:
    """transfer_spans of the pairs of several hosts (transfer_pairs of each; None where a host has none)."""
    parts = [part for part in parts if part is not None]
    if not parts:
        return None
    copies = sum(part["copies"] for part in parts)
    spans_ms = [span for part in parts for span in part["spans_ms"]]
    rates = [rate for part in parts for rate in part["rates"]]
    return {
        "copies": copies,
        "gb_per_copy": round(sum(part["bytes"] for part in parts) / copies / 1e9, 3),
        "span_ms_mean": round(float(np.mean(spans_ms)), 3),
        "link_gb_per_s": round(float(np.median(rates)), 2) if rates else None,
        "link_rate_samples": len(rates),
        "copies_in_flight_max": max(part["in_flight"] for part in parts),
        "directions": {direction: sum(part["directions"][direction] for part in parts)
                       for direction in parts[0]["directions"]},
    }
