"""Mutants of real profiles and a runner that reads each in a child process of its own, bounded in time and memory.

    python -m tests.fuzzing --mode reader --xplanes 300 --traces 200 --seed 56 [--json counts.json]

Each mutant is read in a forked child (the imports are paid once, in the parent): a crash (a signal), a hang (past
the deadline), memory over the bound (the child's peak resident set over the unmutated file's) and a traceback are
told apart from the answers wanted, exit 2 with one line of reason or a correct exit 0. Modes:

- reader: the profile reader (`read_session_in_process`) and the slim copy XProf's views read (`slim`), in-process;
- analyze, analyze-no-views, tool: the command line (`xdiag analyze -q`, with XProf's views and without; `xdiag
  tool`), in-process too.

The mutations are an attacker's: bit flips, 0xFF runs, truncations, a length field set near 2^31 or 2^63 or negative
(its enclosing messages' lengths kept consistent, or not), a submessage duplicated or spliced into another; for
traces, numbers with huge exponents or digits, bit flips and truncations of the JSON, and a corrupt deflate stream.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import io
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xdiag.profile.slim import encode_varint

TESTS = Path(__file__).resolve().parent
XPLANE_SEEDS = [TESTS / "profiles" / "tpu_v5e" / name for name in (
    "running_sum.xplane.pb", "host_offload.xplane.pb", "healthy.xplane.pb")] + [
    TESTS / "profiles" / "h200" / "widening_convert.xplane.pb"]
TRACE_SEEDS = [TESTS / "profiles" / "torch_ranks" / "balanced" / "rank0.pt.trace.json.gz",
               TESTS / "profiles" / "tpu_v5e_chrome" / "paged_attention_decode.trace.json.gz"]
DEADLINE_S = 60.0
MEMORY_OVER_BASELINE = 512 * 2**20

OUTCOMES = ("exit 2, one line", "exit 0", "crash (signal)", "hang (over the deadline)", "memory (over the bound)",
            "traceback or other exit", "exit 2, not one line")
GOOD = OUTCOMES[:2]

# XSpace's length-delimited fields worth aiming at: (message kind, field number) -> the kind of the field's value.
_SUBMESSAGES = {
    ("space", 1): "plane",
    ("plane", 3): "line", ("plane", 2): "plane.name", ("plane", 4): "event_metadata", ("plane", 5): "stat_metadata",
    ("plane", 6): "plane.stat",
    ("line", 4): "event", ("line", 2): "line.name", ("line", 11): "line.display_name",
    ("event", 4): "stat",
    ("stat", 5): "stat.str_value", ("stat", 6): "stat.bytes_value",
}
_WALKED = {"plane", "line", "event", "stat"}
LENGTHS = (2**31 - 1, 2**31, 2**31 + 7, 2**32, 2**62, 2**63 - 1, 2**63 - 5, 2**64 - 11, 2**64 - 1, 2**64 - 2**31)
"""Lengths near 2^31 and 2^63, and negative ones (-11, -1, -2^31) as int64 fields encode them."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


@dataclasses.dataclass(frozen=True)
class Site:
    """A length-delimited field: its kind, where its key, length and value are, and its enclosing fields' sites."""
    kind: str
    key_pos: int
    len_pos: int
    start: int
    end: int
    parents: tuple["Site", ...]


def length_sites(data: bytes) -> list[Site]:
    """Every length-delimited field of the kinds in _SUBMESSAGES, walked from the XSpace down to XStat values."""
    sites: list[Site] = []

    def walk(kind: str, start: int, end: int, parents: tuple[Site, ...]) -> None:
        pos = start
        while pos < end:
            key_pos = pos
            key, pos = _varint(data, pos)
            wire = key & 7
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                len_pos = pos
                length, pos = _varint(data, pos)
                child = _SUBMESSAGES.get((kind, key >> 3))
                if child is not None:
                    site = Site(child, key_pos, len_pos, pos, pos + length, parents)
                    sites.append(site)
                    if child in _WALKED:
                        walk(child, pos, pos + length, (*parents, site))
                pos += length
            else:
                return

    walk("space", 0, len(data), ())
    return sites


def _with_parents_grown(out: bytearray, site: Site, delta: int) -> bytes:
    """`out` (the file with `site`'s field grown by `delta` bytes) with the lengths of the fields enclosing `site`
    grown to match, innermost first: the positions of the outer ones, earlier in the file, stay as they were."""
    for parent in reversed(site.parents):
        old_prefix = parent.start - parent.len_pos
        new_prefix = encode_varint(parent.end - parent.start + delta)
        out[parent.len_pos:parent.start] = new_prefix
        delta += len(new_prefix) - old_prefix
    return bytes(out)


def _replaced(data: bytes, site: Site, new_value: bytes, keep_parents: bool, new_length: int | None = None) -> bytes:
    """`data` with the value of `site` replaced (its length re-encoded as the value's, or `new_length`), its
    enclosing fields' lengths kept consistent where `keep_parents`."""
    length = len(new_value) if new_length is None else new_length
    replacement = encode_varint(length) + new_value
    out = bytearray(data[:site.len_pos]) + replacement + data[site.end:]
    return _with_parents_grown(out, site, len(replacement) - (site.end - site.len_pos)) if keep_parents else bytes(out)


def _inserted(data: bytes, site: Site, field: bytes, keep_parents: bool) -> bytes:
    """`field` inserted right after `site`, inside the same parent (whose lengths grow where `keep_parents`)."""
    out = bytearray(data[:site.end]) + field + data[site.end:]
    return _with_parents_grown(out, site, len(field)) if keep_parents else bytes(out)


def _flipped(data: bytes, rng: random.Random) -> bytes:
    """`data` with 1 to 8 random bits flipped."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(out))
        out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def xplane_mutant(data: bytes, sites: list[Site], rng: random.Random) -> tuple[str, bytes]:
    """(how it was made, the bytes) of one mutant of the XSpace `data`."""
    kind = rng.choice(("bit flips", "0xFF run", "truncation", "length", "length", "length", "duplicate", "splice"))
    if kind == "bit flips":
        return kind, _flipped(data, rng)
    if kind == "0xFF run":
        at, run = rng.randrange(len(data)), rng.randint(1, 16)
        return kind, data[:at] + b"\xff" * run + data[at + run:]
    if kind == "truncation":
        return kind, data[:rng.randrange(1, len(data))]
    site = rng.choice(sites)
    keep = rng.random() < 0.75
    if kind == "length":
        length = rng.choice(LENGTHS + (site.end - site.start + 1, max(0, site.end - site.start - 1), 0))
        name = f"length {length if length < 2**63 else length - 2**64} in {site.kind}{'' if keep else ', parents not'}"
        return name, _replaced(data, site, data[site.start:site.end], keep, new_length=length)
    if kind == "duplicate":
        return f"duplicate {site.kind}", _inserted(data, site, data[site.key_pos:site.end], keep)
    other = rng.choice(sites)
    return f"splice {other.kind} into {site.kind}", _replaced(
        data, site, data[site.start:site.end] + data[other.key_pos:other.end], keep)


_HUGE_NUMBERS = (b"1e999999999", b"1e999999", b"-1e999999999", b"9" * 5000, b"1" + b"0" * 400 + b"e-400",
                 b"1E+999999999", b"0.000001e999999999", b"123456789012345678901234567890")


def trace_mutant(text: bytes, rng: random.Random) -> tuple[str, bytes]:
    """(how it was made, the gzip bytes) of one mutant of the trace JSON `text`."""
    kind = rng.choice(("number", "number", "number", "bit flips", "truncation", "deflate"))
    if kind == "number":  # a number field's value replaced by a huge one
        starts = [i for i in (rng.randrange(len(text)) for _ in range(200)) if text[i:i + 1] == b":"]
        out = text
        for at in starts[:rng.randint(1, 4)]:
            after = at + 1
            while after < len(out) and out[after:after + 1] in b" -0123456789.eE+\"":
                after += 1
            out = out[:at + 1] + rng.choice(_HUGE_NUMBERS) + out[after:]
        return "huge number", gzip.compress(out, 1, mtime=0)
    if kind == "bit flips":
        return kind, gzip.compress(_flipped(text, rng), 1, mtime=0)
    if kind == "truncation":
        return kind, gzip.compress(text[:rng.randrange(1, len(text))], 1, mtime=0)
    packed = bytearray(gzip.compress(text, 1, mtime=0))
    at = rng.randrange(10, min(len(packed), 4096))
    packed[at] ^= 0xFF
    return "corrupt deflate", bytes(packed)


def mutants(xplanes: int, traces: int, seed: int) -> list[tuple[str, str, bytes]]:
    """(seed file name, how it was made, bytes) of each mutant: `xplanes` of the XSpace seeds, `traces` of the trace
    seeds, the same for the same seed."""
    rng = random.Random(seed)
    made = []
    seeds = [(path, path.read_bytes()) for path in XPLANE_SEEDS]
    seed_sites = {path: length_sites(data) for path, data in seeds}
    for i in range(xplanes):
        path, data = seeds[i % len(seeds)]
        how, mutant = xplane_mutant(data, seed_sites[path], rng)
        made.append((path.name, how, mutant))
    texts = [(path, gzip.decompress(path.read_bytes())) for path in TRACE_SEEDS]
    for i in range(traces):
        path, text = texts[i % len(texts)]
        how, mutant = trace_mutant(text, rng)
        made.append((path.name, how, mutant))
    return made


def _small_space() -> bytes:
    """A small XSpace as the JAX profiler writes one: a host plane with Python-tracer events, stat-less runtime events
    and events with a string stat, on two lines (every kind of field the reproducers below aim at), and a TPU's."""
    from xdiag.profile import schema

    space = schema.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.stat_metadata[1].id, plane.stat_metadata[1].name = 1, "hlo_op"
    for key, name in ((1, "$train.py:12 step"), (2, "ThreadpoolListener::Record"), (3, "PjitFunction(step)")):
        plane.event_metadata[key].id, plane.event_metadata[key].name = key, name
    for line_id in (1, 2):
        line = plane.lines.add(id=line_id, name=f"python thread {line_id}", timestamp_ns=1_000 * line_id)
        for i in range(4):
            line.events.add(metadata_id=3, offset_ps=i * 10_000, duration_ps=9_000).stats.add(
                metadata_id=1, str_value=f"fusion.{i}")
            line.events.add(metadata_id=1, offset_ps=i * 10_000 + 100, duration_ps=5_000)
            line.events.add(metadata_id=2, offset_ps=i * 10_000 + 200, duration_ps=1_000)
    device = space.planes.add(id=2, name="/device:TPU:0")  # a device profile: `xdiag analyze` runs XProf's views
    device.event_metadata[1].id, device.event_metadata[1].name = 1, "fusion.0"
    ops = device.lines.add(id=1, name="XLA Ops", timestamp_ns=1_000)
    for i in range(4):
        ops.events.add(metadata_id=1, offset_ps=i * 10_000, duration_ps=8_000)
    return space.SerializeToString()


def _with_length(data: bytes, kind: str, length: int) -> bytes:
    site = next(site for site in length_sites(data) if site.kind == kind)
    return _replaced(data, site, data[site.start:site.end], True, new_length=length)


def _kineto(**overrides: Any) -> bytes:
    """A Kineto trace of one kernel and its launch, with the numbers named in `overrides` (a dotted path: args.device,
    kernel.pid, distributedInfo.rank, deviceProperties.id) written as the given text."""
    marks = {key: f"@{key}@" for key in overrides}
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": marks.get("deviceProperties.id", 0), "name": "NVIDIA H100", "numSms": 132}],
        "distributedInfo": {"rank": marks.get("distributedInfo.rank", 0), "world_size": 1},
        "traceEvents": [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100, "ts": 10.0,
             "dur": 4.0, "args": {"correlation": 7}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": marks.get("kernel.pid", 0), "tid": 7, "ts": 20.0,
             "dur": 30.0, "args": {"device": marks.get("args.device", 0), "stream": marks.get("args.stream", 7),
                                   "correlation": marks.get("args.correlation", 7)}},
        ],
    }
    if "kernel.pid" in overrides:  # the pid names the device only where the kernel's args do not
        del trace["traceEvents"][1]["args"]["device"]
    text = json.dumps(trace)
    for key, value in overrides.items():
        text = text.replace(f'"@{key}@"', value)
    return text.encode()


def reproducers() -> dict[str, bytes]:
    """File name -> bytes of the minimal reproducer of each class the fuzzing found (issue 56), small enough to keep
    under tests/profiles/hostile; the larger ones are made by `empty_events` and `empty_lines`."""
    space = _small_space()
    made = {
        "event_length_2p63.xplane.pb": _with_length(space, "event", 2**63 - 1),  # a SIGSEGV in thinned_line
        "event_length_minus_1.xplane.pb": _with_length(space, "event", 2**64 - 1),  # a BufferError over the reason
        "line_name_length_minus_11.xplane.pb": _with_length(space, "line.name", 2**64 - 11),  # looped forever
        "stat_str_length_minus_11.xplane.pb": _with_length(space, "stat.str_value", 2**64 - 11),  # looped forever
        # an event name that is not UTF-8 (protobuf hands it over as bytes): xdiag tool's store failed on it
        "event_name_not_utf8.xplane.pb": space.replace(b"Th", b"\xff\xfe", 1),
        "corrupt_first_deflate_block.pt.trace.json.gz": gzip.compress(_kineto(), mtime=0)[:10] + b"\xff" * 64,
        "exponent_past_decimal.pt.trace.json": _kineto(**{"args.device": "1e99999999999999999999"}),
        "exponent_1e999999.pt.trace.json": _kineto(**{"args.device": "1e999999"}),
    }
    for key in ("args.device", "args.correlation", "args.stream", "kernel.pid", "distributedInfo.rank",
                "deviceProperties.id"):
        made[f"exponent_1e999999999_{key.replace('.', '_')}.pt.trace.json"] = _kineto(**{key: "1e999999999"})
    return made


def reproducer_inputs() -> list[tuple[str, str, bytes]]:
    """(name, "reproducer", bytes) of every reproducer, the large ones included, as `run` takes them."""
    made = [(name, "reproducer", data) for name, data in reproducers().items()]
    return made + [("empty_events_20MB.xplane.pb", "reproducer", empty_events(20)),
                   ("empty_lines_200k.xplane.pb", "reproducer", empty_lines(200_000))]


def empty_events(megabytes: int) -> bytes:
    """An XSpace of one host line of empty XEvents (2 bytes each) filling `megabytes` MB (for 20: 522 MiB at the peak
    of `xdiag analyze` before the decoder's event budget)."""
    from xdiag.profile import schema

    count = megabytes * 10**6 // 2
    line = b"\x08\x01" + b"\x22\x00" * count  # XLine.id, then XLine.events (field 4), each empty
    plane_head = schema.XPlane(id=1, name="/host:CPU").SerializeToString()
    plane = plane_head + b"\x1a" + encode_varint(len(line)) + line
    return b"\x0a" + encode_varint(len(plane)) + plane


def empty_lines(count: int) -> bytes:
    """An XSpace of one host plane of `count` empty XLines, 2 bytes each (for 200,000: 20 s and 379 MiB to read before
    the reader's line budget)."""
    from xdiag.profile import schema

    plane = schema.XPlane(id=1, name="/host:CPU").SerializeToString() + b"\x1a\x00" * count
    return b"\x0a" + encode_varint(len(plane)) + plane


# --- structural mutants of real profiles (issue 62): shapes no bit flip reaches, built with the real protos ---------

SHAPE_SEED = TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb"


def with_device_planes(target: Path, count: int, seed: Path = SHAPE_SEED) -> Path:
    """`seed` (a real XSpace) with `count` empty device planes after its own, streamed to `target`: an XSpace's
    planes are its repeated field 1, so each is appended as a one-plane XSpace (for 100,000: 2.5 MB)."""
    from xdiag.profile import schema

    with target.open("wb") as out:
        out.write(seed.read_bytes())
        for index in range(count):
            out.write(schema.XSpace(planes=[schema.XPlane(id=1000 + index, name=f"/device:TPU:{index + 1}")])
                      .SerializeToString())
    return target


def with_hlo_edited(target: Path, edit: Callable[[Any], None], seed: Path = SHAPE_SEED) -> Path:
    """`seed` with every HLO module of its metadata plane (an XStat's bytes, an HloProto) passed to `edit` (in
    place) and put back, written to `target`."""
    from xdiag.profile import schema

    space = schema.XSpace.FromString(seed.read_bytes())
    edited = 0
    for plane in space.planes:
        for event_metadata in plane.event_metadata.values():
            for stat in event_metadata.stats:
                if stat.WhichOneof("value") == "bytes_value":
                    proto = schema.HloProto.FromString(stat.bytes_value)
                    if proto.hlo_module.computations:
                        edit(proto)
                        stat.bytes_value = proto.SerializeToString()
                        edited += 1
    assert edited, f"{seed.name} carries no HLO module"
    target.write_bytes(space.SerializeToString())
    return target


def fusion_calls_its_own_computation(proto: Any) -> None:
    """The first fusion of the module made to call the computation it is in (a cycle of one)."""
    for computation in proto.hlo_module.computations:
        for ins in computation.instructions:
            if ins.opcode == "fusion":
                del ins.called_computation_ids[:]
                ins.called_computation_ids.append(computation.id)
                return
    raise AssertionError("no fusion")


def deep_shape(depth: int) -> Callable[[Any], None]:
    """An edit that gives the module's first instruction a tuple shape nested `depth` deep."""
    def edit(proto: Any) -> None:
        shape = proto.hlo_module.computations[0].instructions[0].shape
        for _ in range(depth):
            shape.element_type = 13  # tuple
            shape = shape.tuple_shapes.add()
        shape.element_type = 11  # f32
    return edit


def with_space_edited(target: Path, edit: Callable[[Any], None], seed: Path = SHAPE_SEED) -> Path:
    """`seed` parsed with the real XSpace proto, passed to `edit` (in place) and written to `target`."""
    from xdiag.profile import schema

    space = schema.XSpace.FromString(seed.read_bytes())
    edit(space)
    target.write_bytes(space.SerializeToString())
    return target


def negative_device_durations(space: Any) -> None:
    """Every other event of the TPU's lines given a negative duration (minus what it had, less 1 ps)."""
    for plane in space.planes:
        if plane.name.startswith("/device:TPU"):
            for line in plane.lines:
                for event in line.events[::2]:
                    event.duration_ps = -event.duration_ps - 1


def lines_far_apart(space: Any) -> None:
    """The device's lines 10^16 ns after the host's (each line's timestamp_ns moved by 10^16)."""
    for plane in space.planes:
        if plane.name.startswith("/device:"):
            for line in plane.lines:
                line.timestamp_ns += 10**16


def event_offset(offset_ps: int) -> Callable[[Any], None]:
    """An edit that gives one event in the middle of the host's busiest line this offset (2^63-1: the most an int64
    holds; its line starts 44 ms after the session's first)."""
    def edit(space: Any) -> None:
        line = max((line for plane in space.planes if plane.name == "/host:CPU" for line in plane.lines),
                   key=lambda line: len(line.events))
        line.events[len(line.events) // 2].offset_ps = offset_ps
    return edit


def many_operand_ids(count: int) -> Callable[[Any], None]:
    """An edit that gives the module's first instruction `count` operand ids no instruction has (4 bytes each)."""
    def edit(proto: Any) -> None:
        proto.hlo_module.computations[0].instructions[0].operand_ids.extend(range(2**21, 2**21 + count))
    return edit


def fusion_dims(dims: list[int]) -> Callable[[Any], None]:
    """An edit that gives every fusion of the module these dimensions (2^62 each, or a negative one)."""
    def edit(proto: Any) -> None:
        for computation in proto.hlo_module.computations:
            for ins in computation.instructions:
                if ins.opcode == "fusion":
                    del ins.shape.dimensions[:]
                    ins.shape.dimensions.extend(dims)
    return edit


@dataclasses.dataclass
class Outcome:
    outcome: str
    rc: int | None
    seconds: float
    peak_rss: int
    last_line: str


def run_forked(call: Callable[[], int], deadline_s: float = DEADLINE_S) -> tuple[int | None, int | None, float, int, str]:
    """(exit code, signal, seconds, peak resident bytes, stderr) of `call()` in a forked child; a child past the
    deadline is killed (signal None, exit code None)."""
    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: its stdout goes nowhere, its stderr to the file
            code = 1
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
                sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
                code = call()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                with_flush = getattr(sys.stderr, "flush", None)
                if with_flush:
                    with_flush()
                os._exit(code)
        timed_out = False
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > deadline_s:
                os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                timed_out = True
                break
            time.sleep(0.005)
        seconds = time.monotonic() - started
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    if timed_out:
        return None, None, seconds, usage.ru_maxrss * 1024, text
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status), seconds, usage.ru_maxrss * 1024, text
    return os.WEXITSTATUS(status), None, seconds, usage.ru_maxrss * 1024, text


def classify(rc: int | None, sig: int | None, peak: int, baseline: int, text: str) -> str:
    if rc is None and sig is None:
        return "hang (over the deadline)"
    if sig is not None:
        return "crash (signal)"
    if peak - baseline > MEMORY_OVER_BASELINE:
        return "memory (over the bound)"
    if rc == 0 and "Traceback" not in text:
        return "exit 0"
    if rc == 2 and "Traceback" not in text:
        lines = [line for line in text.splitlines() if line.strip()]
        return "exit 2, one line" if len(lines) == 1 else "exit 2, not one line"
    return "traceback or other exit"


def _reader_call(path: Path, scratch: Path) -> Callable[[], int]:
    """The reader and the slim copy of XProf's views, as a command would report them: exit 2 with one line for a
    ProfileError (what the commands print), 0 where the file reads."""

    def call() -> int:
        from xdiag.errors import XdiagError
        from xdiag.profile.reader import read_session_in_process
        from xdiag.profile.slim import DEFAULT_TPU_OP_STATS, UNREAD_TPU_LINES, write_for_xprof, write_metadata_plane

        steps = [lambda: read_session_in_process([path])]
        if path.name.endswith(".xplane.pb"):  # XProf's views copy the file before (and whatever) the reader says
            steps += [lambda: write_for_xprof(path, scratch / "slim.xplane.pb", lambda name: True, UNREAD_TPU_LINES,
                                              DEFAULT_TPU_OP_STATS),
                      lambda: write_metadata_plane(path, scratch / "metadata.xplane.pb")]
        failed = False
        for step in steps:
            try:
                step()
            except XdiagError as exc:
                if not failed:
                    print(f"xdiag: {exc}", file=sys.stderr)
                failed = True
        return 2 if failed else 0

    return call


def _cli_call(mode: str, path: Path, scratch: Path) -> Callable[[], int]:
    def call() -> int:
        from xdiag.cli import app

        if mode == "tool":
            args = ["tool", "get_kpi_metrics", str(path)]
        else:
            args = ["analyze", str(path), "-q", "--out", str(scratch / "out")]
            if mode == "analyze-no-views":
                args.append("--no-xprof-views")
        app(args, prog_name="xdiag")
        return 0

    return call


def _warm(mode: str, scratch: Path) -> None:
    """The imports a mode needs and the decoder compiled (numba, on the JIT path), paid once in the parent: the
    children fork from it."""
    import xdiag.profile.reader  # noqa: F401
    import xdiag.profile.slim  # noqa: F401

    if mode != "reader":
        from xdiag.cli import app  # noqa: F401  (typer and the command families, which `import xdiag.cli` leaves)
        import xdiag.cloud.embedded  # noqa: F401
        import xdiag.agent.result_cache  # noqa: F401
    _reader_call(XPLANE_SEEDS[0], scratch)()


def run(mode: str, made: list[tuple[str, str, bytes]], deadline_s: float = DEADLINE_S,
        on_result: Callable[[str, str, Outcome], None] | None = None) -> list[tuple[str, str, Outcome]]:
    """Each mutant through `mode` in a child of its own; the memory bound is over the peak of a child reading the
    unmutated seed of the same kind."""
    results = []
    with tempfile.TemporaryDirectory(prefix="xdiag-fuzz-") as folder:
        root = Path(folder)
        _warm(mode, root)
        os.environ.setdefault("XDIAG_LOCAL_CACHE_DIR", str(root / "cache"))
        baselines: dict[str, int] = {}
        for index, (seed_name, how, data) in enumerate(made):
            kind = ".xplane.pb" if seed_name.endswith(".xplane.pb") else ".pt.trace.json.gz"
            suffix = kind if seed_name.endswith(".gz") or kind == ".xplane.pb" else ".pt.trace.json"
            work = root / f"m{index}"
            work.mkdir()
            path = work / f"mutant{suffix}"
            path.write_bytes(data)
            if kind not in baselines:  # the peak of the unmutated seed of its kind
                seed = XPLANE_SEEDS[0] if kind == ".xplane.pb" else TRACE_SEEDS[0]
                clean = root / f"clean{kind}"
                clean.write_bytes(seed.read_bytes())
                baselines[kind] = run_forked(_call(mode, clean, work), deadline_s)[3]
            rc, sig, seconds, peak, text = run_forked(_call(mode, path, work), deadline_s)
            outcome = Outcome(classify(rc, sig, peak, baselines[kind], text), rc if sig is None else -(sig or 0),
                              seconds, peak, (text.strip().splitlines() or [""])[-1][:300])
            results.append((seed_name, how, outcome))
            if on_result:
                on_result(seed_name, how, outcome)
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    return results


def _call(mode: str, path: Path, scratch: Path) -> Callable[[], int]:
    return _reader_call(path, scratch) if mode == "reader" else _cli_call(mode, path, scratch)


def counts(results: list[tuple[str, str, Outcome]]) -> dict[str, int]:
    tally = collections.Counter(outcome.outcome for _, _, outcome in results)
    return {name: tally.get(name, 0) for name in OUTCOMES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("reader", "analyze", "analyze-no-views", "tool"), default="reader")
    parser.add_argument("--xplanes", type=int, default=300)
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--seed", type=int, default=56)
    parser.add_argument("--deadline", type=float, default=DEADLINE_S)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--reproducers", action="store_true",
                        help="the minimal reproducers (and the 20 MB of empty events, the 200,000 empty lines) only")
    parser.add_argument("--with-reproducers", action="store_true", help="the reproducers after the mutants")
    options = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    made = [] if options.reproducers else mutants(options.xplanes, options.traces, options.seed)
    if options.reproducers or options.with_reproducers:
        made += reproducer_inputs()

    def show(seed_name: str, how: str, outcome: Outcome) -> None:
        if options.verbose or outcome.outcome not in GOOD:
            print(f"{outcome.outcome:26} rc={outcome.rc} {outcome.seconds:5.1f}s {outcome.peak_rss >> 20:5d} MiB "
                  f"{seed_name}: {how}: {outcome.last_line[:160]}", flush=True)

    started = time.monotonic()
    results = run(options.mode, made, options.deadline, show)
    tally = counts(results)
    print(json.dumps({"mode": options.mode, "mutants": len(made), "seconds": round(time.monotonic() - started, 1),
                      "jit": os.environ.get("XDIAG_WIRE_JIT") == "1", "counts": tally}))
    if options.json:
        options.json.write_text(json.dumps({"counts": tally, "results": [
            (seed_name, how, dataclasses.asdict(outcome)) for seed_name, how, outcome in results]}, indent=1))


if __name__ == "__main__":
    main()
