"""xdiag.profile.slim: the copy of a profile that XProf's converters get, without the host events they make no use of.

Its bytes are checked against protobuf itself: the real profile parsed, the events removed from the message by the
rule written out plainly here (XProf's nesting of a line's events simulated in Python), serialised again; so is the
copy holding the metadata plane alone, that XProf's HLO protos come from. That XProf's views are the same on them
is tests/test_xprof_views.py's part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdiag.errors import ProfileError
from xdiag.profile import schema, wire
from xdiag.analysis.xprof.host_events import xprof_ignores
from xdiag.profile.slim import (
    DEFAULT_TPU_OP_STATS,
    HOST_THREADS_PLANE,
    METADATA_PLANE,
    PYTHON_EVENT_PREFIX,
    TPU_OP_LINE,
    TPU_PLANE_PREFIX,
    UNREAD_TPU_LINES,
    write_for_xprof,
    write_metadata_plane,
    write_without_unused_events,
)

from tests.conftest import shared_profile

H200 = Path(__file__).resolve().parent / "profiles" / "h200"
RECOMPILATION = H200 / "recompilation.xplane.pb"  # 234,000 of its 295,000 host events are the Python tracer's
TPU_V5E = Path(__file__).resolve().parent / "profiles" / "tpu_v5e"


def _nesting_parents(spans: list[tuple[int, int]]) -> list[int]:
    """XProf's EventForest::ConnectIntraThread: each event's parent is the innermost earlier event still open that
    includes it (-1: none)."""
    parents, stack = [], []
    for begin, end in spans:
        while stack and not (spans[stack[-1]][0] <= begin and end <= spans[stack[-1]][1]):
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        stack.append(len(parents) - 1)
    return parents


def _leaving_out_keeps_parents(events, left_out: list[bool], async_stats: set[int]) -> bool:
    """Whether every kept event's parent, once the `left_out` events are gone, is its nearest ancestor that stays;
    only for lines in XProf's order (by start, the longer first) with no asynchronous event."""
    spans = [(event.offset_ps, event.offset_ps + event.duration_ps) for event in events]
    if any(event.WhichOneof("data") != "offset_ps" or event.duration_ps < 0 for event in events):
        return False
    if any(stat.metadata_id in async_stats for event in events for stat in event.stats):
        return False
    if any(b < a or (b == a and e2 >= e1) for (a, e1), (b, e2) in zip(spans, spans[1:])):
        return False
    before = _nesting_parents(spans)
    kept = [i for i, out in enumerate(left_out) if not out]
    after = _nesting_parents([spans[i] for i in kept])
    for position, i in enumerate(kept):
        ancestor = before[i]
        while ancestor >= 0 and left_out[ancestor]:
            ancestor = before[ancestor]
        if ancestor != (kept[after[position]] if after[position] >= 0 else -1):
            return False
    return True


def _unused_events_removed(data: bytes, unread_name=None) -> tuple[bytes, int]:
    """The profile's XSpace without the Python events, and with `unread_name`, without the stat-less events of the
    names it says XProf gives no meaning, line by line where that keeps the other events' parents; serialised
    with map entries sorted by key; how many went."""
    space = schema.XSpace.FromString(data)
    removed = 0
    for plane in space.planes:
        if plane.name != HOST_THREADS_PLANE:
            continue
        python = {key for key, meta in plane.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)}
        unread = {key for key, meta in plane.event_metadata.items()
                  if unread_name and key not in python and not (meta.stats or meta.metadata or meta.child_id)
                  and unread_name(meta.name)}
        async_stats = {key for key, meta in plane.stat_metadata.items() if meta.name == "_a"}
        for line in plane.lines:
            kept = [event for event in line.events if event.metadata_id not in python]
            left_out = [event.metadata_id in unread and not event.stats for event in kept]
            if any(left_out) and _leaving_out_keeps_parents(kept, left_out, async_stats):
                kept = [event for event, out in zip(kept, left_out) if not out]
            removed += len(line.events) - len(kept)
            del line.events[:]
            line.events.extend(kept)
    return space.SerializeToString(deterministic=True), removed


@pytest.mark.parametrize("unread_name", [None, xprof_ignores], ids=["python-only", "xprof-ignores"])
@pytest.mark.parametrize("profile", [RECOMPILATION, H200 / "host_sync.xplane.pb"], ids=lambda p: p.name)
def test_the_copy_is_the_profile_less_its_unused_events_and_nothing_else(profile, unread_name, tmp_path):
    target = tmp_path / profile.name
    left_out = write_without_unused_events(profile, target, unread_name)
    expected, removed = _unused_events_removed(profile.read_bytes(), unread_name)
    assert left_out == removed > 1000
    # every field, unknown ones included, compared in one canonical order (the profiler writes maps unsorted)
    assert schema.XSpace.FromString(target.read_bytes()).SerializeToString(deterministic=True) == expected
    assert target.stat().st_size < profile.stat().st_size


def test_the_copy_is_the_same_where_the_kernel_cannot_copy_between_files(tmp_path, monkeypatch):
    """The new host plane goes from a scratch file into the copy with copy_file_range, or by reads and writes where
    the kernel refuses (another filesystem, an old kernel)."""
    in_kernel = write_without_unused_events(RECOMPILATION, tmp_path / "in_kernel.xplane.pb", xprof_ignores)

    refusals = []

    def refused(*args, **kwargs):
        refusals.append(args)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("os.copy_file_range", refused)
    by_hand = write_without_unused_events(RECOMPILATION, tmp_path / "by_hand.xplane.pb", xprof_ignores)
    assert refusals and by_hand == in_kernel > 1000
    assert (tmp_path / "by_hand.xplane.pb").read_bytes() == (tmp_path / "in_kernel.xplane.pb").read_bytes()


def test_xprofs_unread_names_leave_out_most_of_jaxs_other_host_events(tmp_path):
    python_only = write_without_unused_events(RECOMPILATION, tmp_path / "python_only.xplane.pb")
    thinned = write_without_unused_events(RECOMPILATION, tmp_path / "thinned.xplane.pb", xprof_ignores)
    host = next(p for p in schema.XSpace.FromString(RECOMPILATION.read_bytes()).planes if p.name == HOST_THREADS_PLANE)
    others = sum(len(line.events) for line in host.lines) - python_only
    assert (thinned - python_only) > others / 2


def test_a_file_with_no_python_events_is_not_copied(tmp_path):
    """A profile captured without the Python tracer: nothing to leave out, so nothing is written (the caller links)."""
    stripped = tmp_path / "stripped.xplane.pb"
    stripped.write_bytes(_unused_events_removed(RECOMPILATION.read_bytes())[0])
    assert not _unused_events_removed(stripped.read_bytes())[1]
    target = tmp_path / "copy.xplane.pb"
    assert write_without_unused_events(stripped, target) == 0
    assert not target.exists()


def test_a_file_it_cannot_walk_is_refused_and_leaves_no_copy(tmp_path):
    truncated = tmp_path / "truncated.xplane.pb"
    truncated.write_bytes(RECOMPILATION.read_bytes()[: RECOMPILATION.stat().st_size // 2])
    target = tmp_path / "copy.xplane.pb"
    with pytest.raises(ProfileError, match="truncated"):
        write_without_unused_events(truncated, target)
    assert not target.exists()


def test_the_compiled_copy_refuses_a_buffer_too_small_instead_of_writing_past_it():
    """The compiled walks copy into a buffer their caller sized; a buffer too small (a file changed under the copy)
    must not make the compiled code write past it (no bounds checks there)."""
    data = np.frombuffer(RECOMPILATION.read_bytes(), np.uint8)
    host = next(p for p in schema.XSpace.FromString(data.tobytes()).planes if p.name == HOST_THREADS_PLANE)
    flags = np.zeros(max(host.event_metadata) + 1, np.uint8)
    flags[[k for k, meta in host.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)]] = 1
    line = max(host.lines, key=lambda line: len(line.events)).SerializeToString()
    line_bytes = np.frombuffer(line, np.uint8)
    kept, dropped, err, _ = wire.line_without_events(line_bytes, 0, len(line), flags, np.empty(0, np.uint8))
    assert err == wire.OK and dropped > 1000 and 0 < kept < len(line)
    exact = np.zeros(kept, np.uint8)
    assert wire.line_without_events(line_bytes, 0, len(line), flags, exact)[::2] == (kept, wire.OK)
    assert len(schema.XLine.FromString(exact.tobytes()).events) == len(schema.XLine.FromString(line).events) - dropped
    short = np.zeros(kept - 1, np.uint8)
    assert wire.line_without_events(line_bytes, 0, len(line), flags, short)[2] == wire.ERR_LENGTH
    assert wire.thinned_line(line_bytes, 0, len(line), flags, -1, exact)[:4] == (kept, dropped, True, wire.OK)
    assert wire.thinned_line(line_bytes, 0, len(line), flags, -1, short)[3] == wire.ERR_LENGTH


@pytest.mark.parametrize("profile", ["h200/recompilation", "tpu/tpu_v6e_inference"])
def test_the_metadata_copy_is_the_profile_with_its_metadata_plane_alone(profile, tmp_path):
    """The TPU profile has it after its device planes, the H200 one first."""
    profile = RECOMPILATION if profile.startswith("h200/") else shared_profile(f"{profile}.xplane.pb")
    target = tmp_path / profile.name
    assert write_metadata_plane(profile, target)
    space = schema.XSpace.FromString(profile.read_bytes())
    modules = sum(len(m.stats) for p in space.planes if p.name == METADATA_PLANE for m in p.event_metadata.values())
    kept = [p for p in space.planes if p.name == METADATA_PLANE]
    del space.planes[:]
    space.planes.extend(kept)
    copy = schema.XSpace.FromString(target.read_bytes())
    assert copy.SerializeToString(deterministic=True) == space.SerializeToString(deterministic=True)
    assert [p.name for p in copy.planes] == [METADATA_PLANE] and modules > 0
    assert target.stat().st_size < profile.stat().st_size / 10


def test_a_file_without_a_metadata_plane_gets_no_metadata_copy(tmp_path):
    """TensorFlow's V100 profile: no XLA, no HLO modules, no metadata plane."""
    v100 = shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")
    target = tmp_path / "copy.xplane.pb"
    assert not write_metadata_plane(v100, target) and not target.exists()
    truncated = tmp_path / "truncated.xplane.pb"
    truncated.write_bytes(RECOMPILATION.read_bytes()[: RECOMPILATION.stat().st_size // 2])
    with pytest.raises(ProfileError, match="truncated"):
        write_metadata_plane(truncated, target)
    assert not target.exists()


def _line_of(events: list[tuple[object, int, int]]) -> np.ndarray:
    """An XLine of real host events (copies of the recompilation profile's), each placed at (offset, duration)."""
    line = schema.XLine(id=1, name="thread")
    for event, offset, duration in events:
        copy = line.events.add()
        copy.CopyFrom(event)
        copy.offset_ps, copy.duration_ps = offset, duration
    return np.frombuffer(line.SerializeToString(), np.uint8)


def test_stat_less_events_stay_where_leaving_them_out_would_change_another_events_parent():
    """XProf's grouping makes an event's parent the innermost earlier event still open that includes it. A left-out
    event that only partly overlaps another changes the parents of the events after it; so does a line out of
    XProf's order, or one with an asynchronous event (not nested at all): there the copy keeps them."""
    host = next(p for p in schema.XSpace.FromString(RECOMPILATION.read_bytes()).planes if p.name == HOST_THREADS_PLANE)
    unread = {key for key, meta in host.event_metadata.items()
              if not meta.name.startswith(PYTHON_EVENT_PREFIX) and not meta.stats and xprof_ignores(meta.name)}
    events = [event for line in host.lines for event in line.events]
    plain = next(event for event in events if event.metadata_id in unread and not event.stats)
    with_stats = next(event for event in events if event.stats)
    flags = np.zeros(max(host.event_metadata) + 1, np.uint8)
    flags[sorted(unread)] = wire.DROP_WITHOUT_STATS
    some_stat = with_stats.stats[0].metadata_id

    def walk(layout, async_stat=-1):
        line = _line_of(layout)
        out = np.zeros(len(line), np.uint8)
        kept, dropped, safe, err, _ = wire.thinned_line(line, 0, len(line), flags, async_stat, out)
        assert err == wire.OK
        if safe:  # the line without the stat-less event, byte for byte
            expected = schema.XLine.FromString(line.tobytes())
            del expected.events[[event.metadata_id for event in expected.events].index(plain.metadata_id)]
            assert dropped == 1 and out[:kept].tobytes() == expected.SerializeToString()
        return safe

    nested = [(with_stats, 0, 10), (plain, 2, 6), (with_stats, 3, 2), (with_stats, 8, 1)]
    assert walk(nested)
    partly_overlapping = [(with_stats, 0, 10), (plain, 2, 10), (with_stats, 3, 2)]  # its child's parent would change
    assert not walk(partly_overlapping)
    out_of_order = [(with_stats, 0, 10), (with_stats, 5, 1), (plain, 2, 6)]
    assert not walk(out_of_order)
    assert not walk(nested, async_stat=some_stat)


def _tpu_lines_and_default_stats_removed(data: bytes) -> tuple[bytes, int, int]:
    """The profile's XSpace without its TPU planes' UNREAD_TPU_LINES and, in their op line's events, without the
    DEFAULT_TPU_OP_STATS holding their default; serialised with map entries sorted by key; the events and the stats
    that went."""
    space = schema.XSpace.FromString(data)
    events = stats = 0
    for plane in space.planes:
        if not plane.name.startswith(TPU_PLANE_PREFIX):
            continue
        kept = [line for line in plane.lines if line.name not in UNREAD_TPU_LINES]
        events += sum(len(line.events) for line in plane.lines if line.name in UNREAD_TPU_LINES)
        del plane.lines[:]
        plane.lines.extend(kept)
        defaults = {key: DEFAULT_TPU_OP_STATS[meta.name] for key, meta in plane.stat_metadata.items()
                    if meta.name in DEFAULT_TPU_OP_STATS}
        for line in plane.lines:
            if line.name != TPU_OP_LINE:
                continue
            for event in line.events:
                kept_stats = [stat for stat in event.stats if not (
                    stat.metadata_id in defaults and stat.WhichOneof("value") == "double_value"
                    and stat.double_value == defaults[stat.metadata_id])]
                stats += len(event.stats) - len(kept_stats)
                del event.stats[:]
                event.stats.extend(kept_stats)
    return space.SerializeToString(deterministic=True), events, stats


@pytest.mark.parametrize("name", ["kv_decode", "host_sync"])
def test_the_tpu_copy_is_the_profile_less_its_unread_lines_and_default_stats_and_nothing_else(name, tmp_path):
    """The copy leaves out, besides the Python tracer's events, the TPU planes' lines XProf never visits and every op
    event's `Time Scale Multiplier` at 1.0 (a third of their stats), every other byte as it is."""
    profile = TPU_V5E / f"{name}.xplane.pb"
    target = tmp_path / profile.name
    left_out = write_for_xprof(profile, target, None, UNREAD_TPU_LINES, DEFAULT_TPU_OP_STATS)
    without_python, python = _unused_events_removed(profile.read_bytes())
    expected, events, stats = _tpu_lines_and_default_stats_removed(without_python)
    assert left_out == (python, events, stats) and stats > events > 0
    assert schema.XSpace.FromString(target.read_bytes()).SerializeToString(deterministic=True) == expected


def _stat_line(stats_per_event: list[list[schema.XStat]]) -> np.ndarray:
    line = schema.XLine(id=3, name=TPU_OP_LINE)
    for offset, stats in enumerate(stats_per_event):
        event = line.events.add(metadata_id=7, offset_ps=offset * 10, duration_ps=5)
        event.stats.extend(stats)
    return np.frombuffer(line.SerializeToString(), np.uint8)


def test_only_the_stat_at_its_default_and_as_protobuf_writes_it_is_left_out():
    """The walk leaves out a stat whose bytes are the default's (its metadata id, then its double): the same stat at
    another value or of another kind, or another stat at that value, stays; so do the event's other fields."""
    default = schema.XStat(metadata_id=18, double_value=1.0)
    stat = np.frombuffer(default.SerializeToString(), np.uint8).copy()
    offset = schema.XStat(metadata_id=16, uint64_value=123456789)
    other_value = schema.XStat(metadata_id=18, double_value=2.0)
    other_stat = schema.XStat(metadata_id=19, double_value=1.0)
    other_kind = schema.XStat(metadata_id=18, ref_value=4)
    layout = [[offset, default], [default, offset, default], [offset, other_value], [other_stat], [other_kind], []]
    line = _stat_line(layout)
    out = np.zeros(len(line), np.uint8)
    kept, dropped, err, _ = wire.line_without_stat(line, 0, len(line), stat, out)
    assert err == wire.OK and dropped == 3
    expected = _stat_line([[offset], [offset], [offset, other_value], [other_stat], [other_kind], []])
    assert out[:kept].tobytes() == expected.tobytes()
    short = np.zeros(kept - 1, np.uint8)
    assert wire.line_without_stat(line, 0, len(line), stat, short)[2] == wire.ERR_LENGTH
    assert wire.line_without_stat(line, 0, len(line) - 3, stat, out)[2] != wire.OK  # cut inside its last event


def test_host_lines_are_walked_in_threads_only_where_they_are_many(tmp_path, monkeypatch):
    """A thread pool started before XProf's conversion, in the detached converter that makes the copy, left op_stats
    peaking ~80 MiB higher (mimalloc): host lines of fewer than 32 MiB, all together, are walked in the calling
    thread, the same copy."""
    import concurrent.futures

    from xdiag.profile import slim

    pools = []
    real_pool = concurrent.futures.ThreadPoolExecutor

    def counted_pool(*args, **kwargs):
        pools.append(args)
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", counted_pool)
    monkeypatch.setattr(slim, "_THREADS", 2)
    one_thread = write_without_unused_events(RECOMPILATION, tmp_path / "one.xplane.pb", xprof_ignores)
    assert not pools and one_thread > 1000
    monkeypatch.setattr(slim, "_THREADED_MIN_BYTES", 1)
    threaded = write_without_unused_events(RECOMPILATION, tmp_path / "threaded.xplane.pb", xprof_ignores)
    assert pools and threaded == one_thread
    assert (tmp_path / "one.xplane.pb").read_bytes() == (tmp_path / "threaded.xplane.pb").read_bytes()
