"""Async copies measured on the link they use (copy-start → copy-done, e.g. TPU host offload)."""

from __future__ import annotations

import numpy as np

from xdiag.analysis.op_table import op_table
from xdiag.analysis.session_cache import cached
from xdiag.cost.hlo import shape_bytes
from xdiag.profile.columns import isin_ids
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
    without pairs. Pairs never span devices, so hosts' pairs combine (combined_transfer_spans) into the session's.

    One pass over the op rows: the rows of copy ops taken once, then grouped by op and device as arrays (on the
    87.6 MiB TPU v5e capture, 1.33M ops and 115,300 copies: 3.1 s with a mask of every row per copy op and device and
    a tuple per copy, 0.1 s so)."""
    ops = op_table(session)
    if not len(ops):
        return None
    done_codes = [code for code, key in enumerate(ops.op_keys) if key[2].startswith("copy-done")]
    if not done_codes:
        return None
    codes_named: dict[tuple[str, str], list[int]] = {}  # (module, op name) -> its op codes, of any program id
    for code, key in enumerate(ops.op_keys):
        codes_named.setdefault((key[0], key[2]), []).append(code)
    found_pairs = []  # (done codes, start codes, direction, bytes)
    for done_code in done_codes:
        module_name, pid, done_name = ops.op_keys[done_code][:3]
        module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
        found = module.find(done_name) if module else None
        if not found or not found[1].operands or found[1].operands[0] not in found[0].by_name:
            continue
        computation, done = found
        start_op = computation.by_name[done.operands[0]]
        source = computation.by_name.get(start_op.operands[0]) if start_op.operands else None
        direction = "to_device" if source is not None and source.opcode == "parameter" else "from_device"
        found_pairs.append((codes_named[(module_name, done_name)], codes_named.get((module_name, start_op.name), []),
                            direction, shape_bytes(done)))
    wanted = np.array(sorted({c for pair in found_pairs for codes in pair[:2] for c in codes}), dtype=ops.op.dtype)
    rows = np.flatnonzero(isin_ids(ops.op, wanted)) if len(wanted) else np.zeros(0, dtype=np.int64)
    row_op, row_device = ops.op[rows], ops.device_code[rows]
    row_start, row_end = ops.start_ps[rows], ops.end_ps[rows]
    by_op = np.argsort(row_op, kind="stable")  # each op's rows together, in table order
    op_bounds = np.searchsorted(row_op[by_op], np.arange(len(ops.op_keys) + 1))

    def rows_of(codes: list[int]) -> np.ndarray:  # in table order
        return np.sort(np.concatenate([by_op[:0], *(by_op[op_bounds[c]:op_bounds[c + 1]] for c in codes)]))

    groups: dict[tuple[int, str], list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
    directions = {"to_device": 0, "from_device": 0}
    for done_codes_named, start_codes, direction, size in found_pairs:
        start_rows, done_rows = rows_of(start_codes), rows_of(done_codes_named)
        for device in np.unique(row_device[np.concatenate([start_rows, done_rows])]).tolist():
            starts = np.sort(row_start[start_rows[row_device[start_rows] == device]])
            on_device = done_rows[row_device[done_rows] == device]
            order = np.argsort(row_end[on_device], kind="stable")
            ends = row_end[on_device][order]
            waits = (row_end[on_device] - row_start[on_device])[order]
            n = min(len(starts), len(ends))
            directions[direction] += n
            groups.setdefault((device, direction), []).append(
                (starts[:n], ends[len(ends) - n:], waits[len(waits) - n:], np.full(n, size, dtype=np.float64)))
    copies = sum(len(part[0]) for parts in groups.values() for part in parts)
    if not copies:
        return None
    rates, spans_ms, total_bytes, in_flight = [], [], 0.0, 0
    for parts in groups.values():
        start, end, wait, size = (np.concatenate(column) for column in zip(*parts))
        order = np.argsort(end, kind="stable")
        start, end, wait, size = start[order], end[order], wait[order], size[order]
        spans_ms.extend(((end - start) / 1e9).tolist())
        total_bytes += float(size.sum())
        waited = wait > 0  # the wait ended when the copy completed: a measured completion
        w_start, w_end, w_size = start[waited], end[waited], size[waited]
        previous = np.concatenate([w_start[:1], w_end[:-1]])  # the previous measured completion in this direction
        service = w_end - np.maximum(w_start, previous)
        served = service > 0
        rates.extend((w_size[served] / (service[served] / 1e12) / 1e9).tolist())
    for device in {device for device, _ in groups}:
        parts = [part for (d, _), items in groups.items() if d == device for part in items]
        times = np.concatenate([part[0] for part in parts] + [part[1] for part in parts])
        steps = np.concatenate([np.ones(sum(len(part[0]) for part in parts), dtype=np.int64),
                                -np.ones(sum(len(part[1]) for part in parts), dtype=np.int64)])
        level = np.cumsum(steps[np.lexsort((steps, times))])  # at one time, ends before starts
        in_flight = max(in_flight, int(level.max()))
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
