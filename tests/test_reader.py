"""Reading XSpace files: what was read is named, what cannot be read is refused precisely."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from xdiag.errors import ProfileError
from xdiag.profile import reader
from xdiag.profile.locate import locate_session
from xdiag.profile.session import read_session

from tests.conftest import shared_profile


def test_cpu_profile_names_its_planes_host_and_hlo_modules(cpu_profiles):
    session = read_session([cpu_profiles["healthy"]])
    assert session.platform == "CPU"
    names = {p.name for p in session.planes}
    assert {"/host:CPU", "/host:metadata"} <= names
    assert not session.device_planes()
    assert session.hosts[0].hostname
    assert session.event_count > 100
    train = [m for m in session.hlo_modules if m.name == "jit_train_step"]
    assert train, [m.display_name for m in session.hlo_modules]
    opcodes = {i.opcode for c in train[0].computations.values() for i in c.instructions}
    assert "dot" in opcodes  # the MLP's matmuls are in the HLO the profile carries


def test_step_annotations_are_read_as_columns(cpu_profiles):
    session = read_session([cpu_profiles["healthy"]])
    python = [line for p in session.host_planes() for line in p.lines if line.name == "python"][0]
    steps = python.numeric["step_num"]
    assert sorted(set(steps[steps >= 0].tolist())) == list(range(15))


@pytest.mark.parametrize(
    "relative, platform, devices",
    [("tpu/tpu_v6e_inference.xplane.pb", "TPU", 4), ("gpu/v100x8_tf_bert_worker.xplane.pb", "GPU", 8),
     ("gpu/mi300x_jax_gemm.xplane.pb", "GPU", 8)],
)
def test_device_profiles_name_their_platform(relative, platform, devices):
    session = read_session([shared_profile(relative)])
    assert session.platform == platform
    assert len(session.device_planes()) == devices


def test_h200_profile_is_gpu_with_one_device(h200_profiles):
    session = read_session([h200_profiles["healthy"]])
    assert session.platform == "GPU"
    assert [p.name for p in session.device_planes()] == ["/device:GPU:0"]


def test_plane_names_are_the_read_planes_names_in_file_order(cpu_profiles, h200_profiles):
    """plane_names reads only the planes' first fields, a block at a time (the platform known before the read)."""
    from xdiag.profile.reader import plane_names

    for path in (cpu_profiles["healthy"], h200_profiles["healthy"], shared_profile("tpu/tpu_v6e_inference.xplane.pb")):
        assert plane_names(path) == [p.name for p in read_session([path]).planes]


def test_plane_names_of_a_truncated_profile_are_refused_as_the_read_refuses_it(tmp_path, cpu_profiles):
    from xdiag.profile.reader import plane_names

    data = cpu_profiles["healthy"].read_bytes()
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ProfileError, match=r"truncated: field 'planes' at byte \d+ declares \d+ bytes"):
        plane_names(cut)


def _refused(path, match: str):
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(ProfileError, match=match):
        read_session([path])
    if before is not None:
        assert path.read_bytes() == before, "the input must never be modified"


def test_empty_file_is_refused(tmp_path):
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    _refused(empty, r"empty file \(0 bytes\)")


def test_truncated_profile_is_refused(tmp_path, cpu_profiles):
    data = cpu_profiles["healthy"].read_bytes()
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(data[: len(data) // 2])
    _refused(cut, r"truncated: field 'planes' at byte \d+ declares \d+ bytes but only \d+ remain")


def test_a_corrupt_line_inside_an_intact_file_is_refused_with_where(tmp_path, h200_profiles):
    """Every length up to the line is right; inside the line, the last event claims more bytes than the line has
    (its length varint's last byte raised by one). The reader must say which line, not fail to unmap the file."""
    import numpy as np
    from xdiag.profile import wire

    data = bytearray(h200_profiles["host_sync"].read_bytes())
    arr = np.frombuffer(bytes(data), dtype=np.uint8)

    def fields(start, end):
        numbers, tags, starts, ends, _, err, _ = wire.scan_fields(arr, start, end)
        assert not err
        return list(zip(numbers.tolist(), tags.tolist(), starts.tolist(), ends.tolist()))

    lines = (f for plane in fields(0, len(arr)) if plane[0] == 1 for f in fields(plane[2], plane[3]) if f[0] == 3)
    line = next(f for f in lines if any(g[0] == 4 for g in fields(f[2], f[3])))
    _, _, event_start, event_end = [g for g in fields(line[2], line[3]) if g[0] == 4][-1]
    assert event_end == line[3]  # the line's last field: a longer event runs past the line
    length_end = event_start - 1  # the last byte of the event's length varint
    assert data[length_end] < 0x7F
    data[length_end] += 1
    corrupt = tmp_path / "corrupt-line.xplane.pb"
    corrupt.write_bytes(bytes(data))
    _refused(corrupt, rf"a line at byte {line[2]} is corrupt: a field's length runs past the end of its message")


def test_random_bytes_are_refused(tmp_path):
    noise = tmp_path / "noise.xplane.pb"
    noise.write_bytes(random.Random(65).randbytes(4096))  # seeded: a failure replays byte for byte
    _refused(noise, r"not an XSpace profile|truncated|malformed")


def test_text_mode_mangled_profile_is_refused_with_the_cause(tmp_path):
    mangled = tmp_path / "mangled.xplane.pb"
    shutil.copyfile(shared_profile("bad/tpu_v6e_inference_text_mangled.xplane.pb"), mangled)
    _refused(mangled, r"EF BF BD")


def test_oversized_session_is_refused_before_reading(cpu_profiles):
    with pytest.raises(ProfileError, match=r"profile is [\d.]+ [KMG]iB, over the 1000 bytes limit"):
        read_session([cpu_profiles["healthy"]], max_bytes=1000)


def test_missing_path_and_empty_folder_are_refused(tmp_path):
    with pytest.raises(ProfileError, match="no such file or directory"):
        locate_session(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match=r"no \*\.xplane\.pb files"):
        locate_session(tmp_path / "empty")


def test_log_dir_resolves_to_newest_session(tmp_path, cpu_profiles):
    for session in ("2026_01_01_00_00_00", "2026_02_01_00_00_00"):
        folder = tmp_path / "run" / "plugins" / "profile" / session
        folder.mkdir(parents=True)
        shutil.copyfile(cpu_profiles["healthy"], folder / "host.xplane.pb")
    located = locate_session(tmp_path / "run")
    assert located.name == "2026_02_01_00_00_00" and located.run == "run"
    assert locate_session(tmp_path / "run", "2026_01_01_00_00_00").name == "2026_01_01_00_00_00"


def test_paths_relative_to_the_working_directory_are_located(tmp_path, cpu_profiles, monkeypatch):
    shutil.copyfile(cpu_profiles["healthy"], tmp_path / "mine.xplane.pb")
    monkeypatch.chdir(tmp_path)
    by_file = locate_session(Path("mine.xplane.pb"))
    assert (by_file.name, by_file.run, by_file.files) == ("mine", "local", [tmp_path / "mine.xplane.pb"])
    by_folder = locate_session(Path("."))
    assert (by_folder.name, by_folder.files) == (tmp_path.name, [tmp_path / "mine.xplane.pb"])


def test_hosts_that_recorded_the_same_hostname_stay_apart(tmp_path, h200_profiles):
    for host, workload in (("hostA", "healthy"), ("hostB", "input_bound")):
        shutil.copyfile(h200_profiles[workload], tmp_path / f"{host}.xplane.pb")
    session = read_session(sorted(tmp_path.glob("*.xplane.pb")))
    assert [h.hostname for h in session.hosts] == ["vm:hostA", "vm:hostB"]  # both captures say "vm"
    assert {p.host for p in session.hosts[1].planes} == {"vm:hostB"}
    from xdiag.tools import run_tool

    hosts = run_tool(session, "get_hosts").summary
    assert hosts["hosts"] == 2 and hosts["slowest_host"] == "vm:hostB" and hosts["step_time_spread_percent"] > 100


def test_the_read_leaves_busy_processes_their_cores():
    from xdiag.profile.reader import READ_THREADS, _CPUS, read_threads

    assert read_threads() == READ_THREADS == max(1, min(4, _CPUS))
    assert read_threads(_CPUS) == read_threads(_CPUS + 3) == 1
    assert read_threads(1) == max(1, min(READ_THREADS, _CPUS - 1))


def test_lines_decoded_in_parallel_threads_equal_one_thread():
    """The decoder runs lines in a thread pool (it releases the GIL); every column must come out as
    when one thread decodes the lines in order."""
    import numpy as np

    path = shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")

    def columns(session):
        out = []
        for host in session.hosts:
            for plane in host.planes:
                out.append((plane.name, plane.strings))
                for line in plane.lines:
                    sparse = [(k, *cols.sparse(k)) for cols in (line.numeric, line.strings) for k in sorted(cols.keys())]
                    out.append((line.id, line.name, line.metadata_id, line.start_ps, line.duration_ps, sparse))
        return out

    one = columns(read_session([path], threads=1))
    many = columns(read_session([path], threads=3))
    assert len(one) == len(many) > 10
    for a, b in zip(one, many):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y)
            elif isinstance(x, list) and x and isinstance(x[0], tuple):
                for (name, i, v), (name2, i2, v2) in zip(x, y):
                    assert name == name2 and np.array_equal(i, i2) and np.array_equal(v, v2)
            else:
                assert x == y


def test_warm_up_reads_its_own_two_event_profile(monkeypatch):
    """`make install` runs it: it must read the profile it builds (two 5 ps `step` events 10 ps apart on one host
    line), so numba compiles the decoder on a real read."""
    import numpy as np
    from xdiag.profile import reader

    read = []
    original = reader.read_session_in_process
    monkeypatch.setattr(reader, "read_session_in_process", lambda paths: read.append(original(paths)) or read[-1])
    reader.warm_up()
    assert len(read) == 1 and read[0].event_count == 2
    (plane,) = read[0].planes
    (line,) = plane.lines
    assert plane.name == "/host:CPU" and line.name == "warm-up"
    assert line.durations.ps().tolist() == [5, 5] and np.diff(line.starts.ps()).tolist() == [10]


_SESSION_DIGEST = """
import hashlib, sys
from pathlib import Path
from xdiag.profile import wire
from xdiag.profile.session import read_session
digest = hashlib.sha256()
for host in read_session([Path(sys.argv[1])]).hosts:
    for plane in host.planes:
        digest.update(repr((plane.name, plane.strings, sorted(plane.event_names.items()))).encode())
        for line in plane.lines:
            digest.update(repr((line.id, line.name, line.timestamp_ns, str(line.metadata_id.dtype))).encode())
            for column in (line.metadata_id, line.start_ps, line.duration_ps):
                digest.update(column.tobytes())
            for stats in (line.numeric, line.strings):
                for name in sorted(stats.keys()):
                    index, values = stats.sparse(name)
                    digest.update(name.encode() + index.tobytes() + values.tobytes())
print(wire._ahead_of_time is not None, "numba" in sys.modules, digest.hexdigest())
"""


def test_the_ahead_of_time_decoder_reads_exactly_what_numba_does():
    """`make install` builds the decoder ahead of time (python -m xdiag.profile.build_wire); a read
    with it must give the same session as numba's, without importing numba."""
    import subprocess
    import sys

    from xdiag.profile import wire

    if wire._load_ahead_of_time() is None:
        pytest.skip("the ahead-of-time decoder is not built here (python -m xdiag.profile.build_wire)")
    path = shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")
    outputs = {}
    for jit in ("0", "1"):
        env = {**os.environ, "XDIAG_WIRE_JIT": jit}
        done = subprocess.run([sys.executable, "-c", _SESSION_DIGEST, str(path)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[jit] = done.stdout.split()
    assert outputs["0"][:2] == ["True", "False"]  # ahead of time, numba not imported
    assert outputs["1"][:2] == ["False", "True"]
    assert outputs["0"][2] == outputs["1"][2]


def test_an_ahead_of_time_decoder_built_from_another_wire_py_is_not_used(tmp_path, monkeypatch):
    from xdiag.profile import wire

    stamp = tmp_path / "_wire_compiled.source"
    stamp.write_text("0" * 64 + "\n")
    monkeypatch.setattr(wire, "SOURCE_STAMP", stamp)
    assert wire._load_ahead_of_time() is None
    stamp.write_text(wire.source_digest() + "\n")
    monkeypatch.delenv("XDIAG_WIRE_JIT", raising=False)
    try:
        import xdiag.profile._wire_compiled  # noqa: F401
    except ImportError:
        pytest.skip("the ahead-of-time decoder is not built here")
    assert wire._load_ahead_of_time() is not None


@pytest.mark.parametrize(
    "values",
    [
        [5, -3, 5, 7, -3, 0, 12],
        [2**40, 3, 2**40, -(2**50)],  # a wide range: numpy's own sort
        [],
        ["jit_f\x00491\x00dot.3", "jit_f\x00491\x00add", "jit_g\x00-1\x00add", "jit_f\x00491\x00add", ""],
    ],
)
def test_unique_with_inverse_is_numpys_unique(values):
    import numpy as np
    from xdiag.profile.columns import unique_with_inverse

    array = np.array(values, dtype=object if values and isinstance(values[0], str) else np.int64)
    unique, inverse = unique_with_inverse(array)
    expected_unique, expected_inverse = np.unique(array, return_inverse=True)
    assert unique.dtype == expected_unique.dtype and list(unique) == list(expected_unique)
    assert np.array_equal(inverse, expected_inverse) and np.array_equal(unique[inverse], array)


@pytest.mark.parametrize("count", [5, 300, 20_000])  # one at a time; each distinct string decoded once (compiled)
def test_inline_strings_intern_as_one_at_a_time_does(count):
    import numpy as np
    from xdiag.profile.reader import _inline_texts

    rng = np.random.default_rng(count)
    data = bytes(rng.choice(list(b"ab\xff\xc3\xa9"), 2000).tolist())  # ASCII, UTF-8 and bytes decoded as U+FFFD
    arr = np.frombuffer(data, dtype=np.uint8)
    lengths = rng.integers(0, 14, count)  # empty, up to 8 (as integers) and longer
    offsets = np.minimum(np.sort(rng.integers(0, len(data), count)), len(data) - lengths)
    offsets[::7] = -1  # no bytes: ""

    def interned(decode) -> tuple[list[int], list[str]]:
        strings: list[str] = []
        index: dict[str, int] = {}

        def intern(value: str) -> int:
            if value not in index:
                index[value] = len(strings)
                strings.append(value)
            return index[value]

        return decode(intern), strings

    expected, expected_strings = interned(lambda intern: [
        intern(data[o : o + n].decode("utf-8", "replace") if o >= 0 else "") for o, n in zip(offsets, lengths)
    ])
    indexes, strings = interned(lambda intern: _inline_texts(arr, offsets, lengths, intern))
    assert indexes.dtype == np.int32 and indexes.tolist() == expected and strings == expected_strings


@pytest.mark.parametrize(
    ("values", "members"),
    [
        ([5, 1, 5, 7, 3, 0, 12], [5, 12, 99]),
        ([2**40, 3, 2**40], [3, 2**40]),  # spread wide: numpy's own isin
        ([4, -1, 4], [-1]),  # negative: likewise
        ([], [1]),
        ([1, 2], []),
    ],
)
def test_isin_ids_is_numpys_isin(values, members):
    import numpy as np
    from xdiag.profile.columns import isin_ids

    values, members = np.array(values, dtype=np.int64), np.array(members, dtype=np.int64)
    assert np.array_equal(isin_ids(values, members), np.isin(values, members))


def test_isin_ids_on_a_real_profiles_lines(h200_profiles):
    import numpy as np
    from xdiag.profile.columns import isin_ids

    session = read_session([h200_profiles["recompilation"]])
    checked = 0
    for plane in session.planes:
        members = np.array(sorted(plane.event_names)[::3], dtype=np.int64)
        for line in plane.lines:
            assert np.array_equal(isin_ids(line.metadata_id, members), np.isin(line.metadata_id, members))
            checked += len(line)
    assert checked > 100_000


def test_event_times_are_packed_where_they_fit_and_read_back_exactly(h200_profiles):
    """A line's times are kept as uint32 ns from its least time where they fit (TimeColumn), else int64 ps; the
    tools must get back exactly the ps the file holds, shifted to the session's origin, either way."""
    import numpy as np
    from xdiag.profile import schema
    from xdiag.profile.space import TimeColumn

    path = h200_profiles["healthy"]
    session = read_session([path])
    space = schema.XSpace.FromString(path.read_bytes())
    read = {(p.name, ln.id): ln for p in session.planes for ln in p.lines}
    narrow = with_events = 0
    for plane in space.planes:
        for line in plane.lines:
            got = read[(plane.name, line.id)]
            shift = (line.timestamp_ns - session.origin_ns) * 1000 if len(line.events) else 0
            offsets = np.array([e.offset_ps for e in line.events], dtype=np.int64)
            assert np.array_equal(got.start_ps, offsets + shift)
            assert np.array_equal(got.duration_ps, np.array([e.duration_ps for e in line.events], dtype=np.int64))
            assert got.start_ps.dtype == got.duration_ps.dtype == np.int64
            narrow += got.starts.values.dtype == got.durations.values.dtype == np.uint32
            with_events += len(line.events) > 0
    assert narrow == with_events >= 4  # its host and device lines record whole ns over far less than 4.3 s

    # The decision on one real line's start times: narrow as read; wide where a time is not a whole ns and the
    # span exceeds 2**32 ps, or where the span exceeds 2**32 ns; exact in every case, shifted too.
    line = max((ln for p in session.planes for ln in p.lines), key=len)
    times = line.start_ps
    assert int(times.max() - times.min()) >= 2**32  # over 4.3 ms: in ps it does not fit 32 bits
    sub_ns, long_span = times.copy(), times.copy()
    sub_ns[len(times) // 2] += 1
    long_span[-1] += 2**32 * 1000
    for values, dtype in ((times, np.uint32), (sub_ns, np.int64), (long_span, np.int64)):
        column = TimeColumn.pack(values.copy())
        assert column.values.dtype == dtype
        assert np.array_equal(column.ps(), values)
        some = np.arange(len(values)) % 3 == 1
        assert np.array_equal(column.at(some), values[some]) and np.array_equal(column.at(np.flatnonzero(some)), values[some])
        column.shift(-12_345_000)
        assert np.array_equal(column.ps(), values - 12_345_000)


def test_decoded_events_and_kept_stats_are_protobufs_own_parse(h200_profiles):
    """The decoder reads a line in one pass, growing its columns past a first guess from the line's size: every
    event's metadata id and every kept stat, in file order, must be what protobuf's own parse of the file says,
    on lines that outgrow that guess in events and in stats."""
    import numpy as np
    from xdiag.profile import schema, wire
    from xdiag.profile.space import NUMERIC_STATS, STRING_STATS

    path = h200_profiles["recompilation"]
    session = read_session([path])
    space = schema.XSpace.FromString(path.read_bytes())
    read = {(p.name, ln.id): (p, ln) for p in session.planes for ln in p.lines}
    outgrown_events = outgrown_stats = stats_checked = 0
    for plane in space.planes:
        names = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            got_plane, got = read[(plane.name, line.id)]
            assert got.metadata_id.tolist() == [e.metadata_id for e in line.events]
            numeric = {name: ([], []) for name in NUMERIC_STATS}
            strings = {name: ([], []) for name in STRING_STATS}
            for index, event in enumerate(line.events):
                for stat in event.stats:
                    name, kind = names.get(stat.metadata_id, ""), stat.WhichOneof("value")
                    if name in numeric and kind in ("double_value", "uint64_value", "int64_value"):
                        value = getattr(stat, kind)
                        value = int(value) if kind == "double_value" else int(np.uint64(value).astype(np.int64))
                        numeric[name][0].append(index)
                        numeric[name][1].append(value)
                    elif name in strings and kind in ("str_value", "ref_value"):
                        strings[name][0].append(index)
                        text = stat.str_value if kind == "str_value" else names.get(stat.ref_value, "")
                        strings[name][1].append(text)
            kept = 0
            for name, (events, values) in numeric.items():
                column = got.numeric.sparse(name)
                assert (column[0].tolist(), column[1].tolist()) == (events, values) if column else not events, name
                kept += len(events)
            for name, (events, values) in strings.items():
                column = got.strings.sparse(name)
                assert (column[0].tolist(), [got_plane.strings[i] for i in column[1]]) == (events, values) \
                    if column else not events, name
                kept += len(events)
            stats_checked += kept
            outgrown_events += len(line.events) > max(64, line.ByteSize() // wire.GUESS_EVENT_BYTES)
            outgrown_stats += kept > max(64, line.ByteSize() // wire.GUESS_STAT_BYTES)
    assert outgrown_events > 0 and stats_checked > 10_000


def test_a_line_dense_in_kept_stats_outgrows_the_first_guess_and_reads_as_protobuf_does(tmp_path):
    """A line of more kept stats than decode_line first makes room for (one per GUESS_STAT_BYTES of the line; the
    real profiles keep fewer) grows its stat columns as it goes: every stat as protobuf's parse says, grouped by
    column whatever the order on the wire, stat ids past the decoder's table (TABLE_IDS) included."""
    import numpy as np
    from xdiag.profile import schema, wire
    from xdiag.profile.reader import read_host

    space = schema.XSpace()
    plane = space.planes.add(id=1, name="/host:CPU")
    far = wire.TABLE_IDS + 7
    for stat_id, name in ((1, "step_num"), (2, "hlo_op"), (3, "group_id"), (far, "program_id"), (5, "other"),
                          (6, "ref")):
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = name
    plane.event_metadata[1].name = "e"
    line = plane.lines.add(id=1, name="dense", timestamp_ns=1)
    expected = {"step_num": ([], []), "group_id": ([], []), "program_id": ([], []), "hlo_op": ([], [])}
    for index in range(3000):
        event = line.events.add(metadata_id=1, offset_ps=index * 10, duration_ps=5)
        event.stats.add(metadata_id=far, uint64_value=index * 3)
        event.stats.add(metadata_id=5, int64_value=1)  # not a kept stat
        event.stats.add(metadata_id=1, int64_value=index)
        if index % 3:
            event.stats.add(metadata_id=3, double_value=index + 0.5)
        event.stats.add(metadata_id=2, str_value=f"op{index % 5}") if index % 2 else event.stats.add(
            metadata_id=2, ref_value=6)
        for name, value in (("program_id", index * 3), ("step_num", index), ("group_id", index),
                            ("hlo_op", f"op{index % 5}" if index % 2 else "ref")):
            if name != "group_id" or index % 3:
                expected[name][0].append(index)
                expected[name][1].append(value)
    path = tmp_path / "dense.xplane.pb"
    path.write_bytes(space.SerializeToString())
    kept = sum(len(events) for events, _ in expected.values())
    assert kept > line.ByteSize() // wire.GUESS_STAT_BYTES
    read = read_host(path)[0].planes[0]
    got = read.lines[0]
    for name in ("step_num", "group_id", "program_id"):
        events, values = got.numeric.sparse(name)
        assert (events.tolist(), values.tolist()) == expected[name], name
    events, values = got.strings.sparse("hlo_op")
    assert (events.tolist(), [read.strings[i] for i in values]) == expected["hlo_op"]
    assert np.array_equal(got.starts.ps(), np.arange(3000) * 10)


def test_factorize_rows_groups_a_real_op_tables_rows_as_their_string_keys_do(h200_profiles):
    """op_table and op_stats group rows by (module, program, op) as tuples hashed one at a time instead of a
    string key per row: the same groups as the string keys on a real profile's ops, each row's own values."""
    import numpy as np
    from xdiag.analysis.op_table import op_table
    from xdiag.profile.columns import factorize_rows, unique_with_inverse

    ops = op_table(read_session([h200_profiles["dispatch_bound"]]))
    distinct, inverse = factorize_rows(ops.module, ops.program_id, ops.name)
    keys = np.array([f"{m}\x00{p}\x00{n}" for m, p, n in zip(ops.module, ops.program_id, ops.name)], dtype=object)
    _, by_key = unique_with_inverse(keys)
    assert 1 < len(distinct) < len(ops)
    assert len(set(zip(by_key.tolist(), inverse.tolist()))) == len(distinct)  # one group for one key, and back
    for row in (0, len(ops) // 2, len(ops) - 1):
        assert distinct[inverse[row]] == (ops.module[row], int(ops.program_id[row]), ops.name[row])


@pytest.mark.parametrize("chunk_rows", [7, 1 << 20])
def test_integer_rows_factorise_a_chunk_at_a_time_as_tuples_do(chunk_rows, monkeypatch):
    """Integer columns (the op table's codes) are factorised by one key per row, a chunk of rows at a time: the same
    distinct rows in the same first-seen order, and the same index per row, as hashing each row's tuple; and each
    code's first row as np.unique finds it."""
    import numpy as np
    from xdiag.analysis.op_table import op_table
    from xdiag.profile import columns

    monkeypatch.setattr(columns, "CHUNK_ROWS", chunk_rows)
    ops = op_table(read_session([Path(__file__).parent / "profiles" / "tpu_v5e" / "gru_scan_train.xplane.pb"]))
    codes = (ops.device_code, ops.op, ops.program_id)
    distinct, inverse = columns.factorize_rows(*codes)
    as_tuples, tuple_inverse = columns.factorize_rows(*codes[:2], ops.program_id.astype(object))
    assert 1 < len(distinct) < len(ops) and distinct == as_tuples
    assert inverse.dtype == np.int32 and np.array_equal(inverse, tuple_inverse)
    unique, first = np.unique(ops.op, return_index=True)
    assert np.array_equal(columns.first_rows(ops.op, len(ops.op_keys))[unique], first)
    assert columns.first_rows(np.array([2, 0, 2], np.int32), 4).tolist() == [1, -1, 0, -1]


def test_op_keys_grouped_by_a_part_label_rows_as_their_text_does():
    """Steps group a device's rows by program (module, program_id) and by op through integer labels of op codes:
    the same partition of the rows as their text, and each label's value that text."""
    import numpy as np
    from xdiag.analysis.op_table import op_table

    ops = op_table(read_session([Path(__file__).parent / "profiles" / "tpu_v5e" / "gru_scan_train.xplane.pb"]))
    programs = list(zip(ops.module.tolist(), ops.program_id.tolist()))
    named_ops = [(*program, name) for program, name in zip(programs, ops.name.tolist())]
    for part, texts in ((lambda key: key[:2], programs), (lambda key: key[:3], named_ops)):
        group, values = ops.grouped_by(part)
        labels = group[ops.op].tolist()
        assert len(set(zip(labels, texts))) == len(values) == len(set(texts))
        assert [values[label] for label in labels] == texts
    assert 1 < len(values) < len(ops)  # one program here, many ops in it
    assert np.array_equal(ops.grouped_by(lambda key: key)[0], np.arange(len(ops.op_keys)))


@pytest.mark.parametrize("chunk_rows", [5, 1 << 20])
def test_integer_rows_of_every_kind_factorise_as_tuples_do(chunk_rows, monkeypatch):
    """The integer path's shortcuts (a constant column left out of the key, codes 0..n-1 used as they are, a table
    for a small range, a search for a wide one; each key's first row by a minimum, not a sort) give what hashing
    each row's tuple gives: the same distinct rows in first-seen order and the same index per row."""
    import numpy as np
    from xdiag.profile import columns

    monkeypatch.setattr(columns, "CHUNK_ROWS", chunk_rows)
    rng = np.random.default_rng(7)
    size = 2_000
    kinds = {
        "codes": rng.integers(0, 40, size).astype(np.int32),
        "constant": np.full(size, np.iinfo(np.int64).min, np.int64),  # NO_VALUE: no program id
        "small range": rng.integers(-50, 300, size),
        "sparse codes": rng.choice(np.array([3, 9, 11, 40], np.int32), size),
        "wide": rng.choice(np.array([-(2**60), 5, 2**40, 2**62], np.int64), size),
    }
    for names in (("codes", "constant", "wide"), ("small range", "sparse codes"), ("constant",), ("codes",),
                  ("wide", "codes", "small range")):
        cols = [kinds[name] for name in names]
        distinct, inverse = columns.factorize_rows(*cols)
        as_tuples, tuple_inverse = columns.factorize_rows(*cols[:-1], cols[-1].astype(object))
        assert distinct == as_tuples and np.array_equal(inverse, tuple_inverse), names
        assert [distinct[i] for i in inverse[:50].tolist()] == list(zip(*(c[:50].tolist() for c in cols))), names
    codes = kinds["codes"]
    unique, first = np.unique(codes, return_index=True)
    assert np.array_equal(columns.first_rows(codes, 45)[unique], first)
    assert (columns.first_rows(codes, 45)[40:] == -1).all()


def test_the_malloc_settings_start_no_process(monkeypatch):
    """`one_malloc_arena` and `return_freed_memory_to_the_os` load glibc by its soname: ctypes.util.find_library runs
    `ldconfig -p` in a child process each time it is asked (4-7 ms)."""
    started = []
    real_popen = subprocess.Popen

    def spawned(*args, **kwargs):
        started.append(args[0] if args else kwargs.get("args"))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spawned)
    reader.return_freed_memory_to_the_os()
    reader.one_malloc_arena()
    assert started == []
