"""Builds a large XSpace profile from a real captured one, for benchmarks.

JAX on a CPU cannot produce a 2 GB profile in reasonable time, so this takes a real
capture and replicates every line of every plane K times, each copy shifted later in
time by the capture's span (plus a gap), as if the same host had recorded K times as
long. Plane metadata (event names, stats, the HLO modules) is kept once. The event bytes
are copied verbatim; only each copy's line id and timestamp are rewritten, so every event,
stat and flow is a real one and the result reads like a long capture of the same workload.

    python bench/make_large_profile.py SOURCE.xplane.pb OUT.xplane.pb --size-mib 2048
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from xdiag.profile import wire
from xdiag.profile.slim import encode_varint

XSPACE_PLANES, XPLANE_LINES = 1, 3
LINE_ID, LINE_TIMESTAMP_NS = 1, 3


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = encode_varint(number << 3 | wire_type)
    return key + (encode_varint(len(payload)) + payload if wire_type == 2 else payload)


def _fields(arr: np.ndarray, start: int, end: int):
    numbers, tags, starts, ends, wires, err, pos = wire.scan_fields(arr, start, end)
    if err:
        sys.exit(f"source is not a readable XSpace ({wire.ERRORS[err]} at byte {pos})")
    return list(zip(numbers.tolist(), tags.tolist(), starts.tolist(), ends.tolist(), wires.tolist()))


def _line_copy(arr: np.ndarray, start: int, end: int, copy: int, shift_ns: int) -> bytes:
    out = bytearray()
    for number, tag, value_start, value_end, wire_type in _fields(arr, start, end):
        if number in (LINE_ID, LINE_TIMESTAMP_NS) and wire_type == 0:
            value, _ = _read_varint(arr, value_start)
            value = value * 1000 + copy if number == LINE_ID else value + copy * shift_ns
            out += encode_varint(number << 3) + encode_varint(value)
        else:
            out += arr[tag:value_end].tobytes()
    return bytes(out)


def _read_varint(arr: np.ndarray, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = int(arr[pos])
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _span_ns(arr: np.ndarray, planes) -> int:
    stamps = []
    for _, _, p_start, p_end, _ in planes:
        for number, _, l_start, l_end, _ in _fields(arr, p_start, p_end):
            if number == XPLANE_LINES:
                for n, _, v_start, _, w in _fields(arr, l_start, l_end):
                    if n == LINE_TIMESTAMP_NS and w == 0:
                        stamps.append(_read_varint(arr, v_start)[0])
    return (max(stamps) - min(stamps)) if stamps else 0


def build(source: Path, target: Path, size_mib: float) -> tuple[int, int]:
    data = source.read_bytes()
    arr = np.frombuffer(data, dtype=np.uint8)
    top = _fields(arr, 0, len(data))
    planes = [f for f in top if f[0] == XSPACE_PLANES]
    copies = max(1, int(size_mib * 2**20 / len(data)))
    # Shift each copy by the capture's whole window (line starts spread + 1 s): copies never overlap.
    window_ns = _span_ns(arr, planes) + 1_000_000_000 + _max_line_span_ns(source)
    with target.open("wb") as out:
        for number, tag, start, end, _ in top:
            if number != XSPACE_PLANES:
                out.write(arr[tag:end].tobytes())
                continue
            body = bytearray()
            for p_number, p_tag, p_start, p_end, _ in _fields(arr, start, end):
                if p_number != XPLANE_LINES:
                    body += arr[p_tag:p_end].tobytes()
                    continue
                for copy in range(copies):
                    body += _field(XPLANE_LINES, 2, _line_copy(arr, p_start, p_end, copy, window_ns))
            out.write(_field(XSPACE_PLANES, 2, bytes(body)))
    return copies, target.stat().st_size


def _max_line_span_ns(source: Path) -> int:
    from xdiag.profile.session import read_session

    session = read_session([source])
    ends = [int(line.start_ps.max() + line.duration_ps.max()) for p in session.planes for line in p.lines if len(line)]
    return (max(ends) // 1000) if ends else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--size-mib", type=float, required=True)
    args = parser.parse_args()
    copies, size = build(args.source, args.target, args.size_mib)
    print(f"{args.target}: {copies} copies of {args.source.name}, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
